"""The streaming feature job's settings: plain values, so that building them needs no PyFlink."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TypeVar

from schemas.topics import DEAD_LETTERS
from streams.errors import StreamsError

S = TypeVar("S")

#: The feature job's name on Flink clusters and in dead-letter records.
JOB_NAME = "loopline-features"


class JobStateError(StreamsError, RuntimeError):
    """The job cannot resume from its checkpoint: ``str(err)`` is one line, what is wrong, then the command that
    starts the job without it."""

    def __init__(self, problem: str, fresh_command: str) -> None:
        super().__init__(f"{problem} — fix: start the job without it: `{fresh_command}`")


class JobStalled(RuntimeError):
    """The job has completed no checkpoint for longer than it may: its tasks are not running."""


@dataclass(frozen=True)
class JobSettings:
    """Where the job reads, writes and checkpoints, and its batching and checkpoint knobs."""

    bootstrap_servers: str
    connector_jar: Path
    #: The job's JVM operators (streams/operators_jar.py).
    operators_jar: Path
    #: A path or any Flink filesystem URI (``file:///shared/...``, ``s3://bucket/...``): checkpoints and savepoints.
    checkpoint_dir: str
    #: The project (``schemas/project.py``) whose views the job computes, and its Feast repo (its feature_store.yaml and
    #: FileSource paths).
    project_path: Path
    repo_path: Path
    feast_registry_path: Path | None = None
    redis_connection: str | None = None
    #: The connection names a Redis Cluster's nodes (Feast's ``redis_type: redis_cluster``).
    redis_cluster: bool = False
    #: Replicas every batch of online rows must reach (Redis WAIT on each node written) within the timeout, or the
    #: write fails: the checkpoint that follows a batch then covers only rows a failover keeps.
    replica_acks: int = 0
    replica_ack_timeout_ms: int = 2_000
    #: Topics read instead of those the project declares (declared -> read): a replay's, or a test's.
    source_topics: dict[str, str] = field(default_factory=dict)
    #: Extra Kafka client properties for the job's source and sinks (security.protocol, sasl.*, ssl.*); kept out of the
    #: repr, since they may hold secrets.
    kafka_properties: dict[str, str] = field(default_factory=dict, repr=False)
    #: Feature rows are appended under <offline_dir>/<view>; None: where each view's FileSource points.
    offline_dir: Path | None = None
    group_id: str = "loopline-features"
    #: Started without a checkpoint to restore (``stream submit --no-restore``, embedded or on a cluster): rebuild the
    #: windows from the oldest retained event (or ``start_from_ms``), not from the group's committed offsets with
    #: empty state.
    rebuild: bool = False
    #: With ``rebuild``, read from the first event published at or after this time (epoch ms, the records' Kafka
    #: timestamps) rather than from the oldest retained one.
    start_from_ms: int | None = None
    #: Rebuild even where a topic no longer retains a view's longest window (its windows then fill as events come).
    allow_partial_rebuild: bool = False
    dead_letter_topic: str = DEAD_LETTERS.name
    checkpoint_interval_ms: int = 5_000
    #: The longest a row waits for its Python batch (decoding, the offline log), and the batch size (also the most
    #: entities the JVM writer sends in one round trip).
    flush_interval_ms: int = 50
    max_batch_rows: int = 2_000
    #: An entity's online row, with its windows' steps, is sent at most once per this much processing
    #: time (at each read mark, ``streams/jvm`` ``ReadMarks``): a busy entity's writes (its steps, whole each
    #: time) coalesce, for a little freshness.
    online_interval_ms: int = 100
    #: The longest an entity waits between checks of whether its windows are empty for good (then it leaves the
    #: state, ``SlidingWindows``): memory freed sooner against a check per entity per interval.
    state_check_ms: int = 60_000
    #: Feature rows are held (checkpointed) this long, then appended offline as one file per view.
    offline_flush_interval_ms: int = 5_000
    parallelism: int = 1
    #: The embedded job serves its metrics to Prometheus on this port (every interface, /metrics); None or 0: off.
    metrics_port: int | None = None
    python_options: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        """The settings as JSON (paths as strings), to hand to a job started elsewhere."""
        return settings_json(self)

    @classmethod
    def from_json(cls, text: str) -> JobSettings:
        """The inverse of ``to_json``."""
        return settings_from_json(cls, text)


def settings_json(settings) -> str:
    """A job's settings (a dataclass of plain values and paths) as JSON, paths as strings: the argument of a job
    submitted to a cluster."""
    return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()})


def settings_from_json(cls: type[S], text: str) -> S:
    """The settings of dataclass ``cls`` that ``settings_json`` wrote."""
    data = json.loads(text)
    paths = {f.name for f in fields(cls) if "Path" in str(f.type)}
    return cls(**{k: Path(v) if k in paths and v is not None else v for k, v in data.items()})
