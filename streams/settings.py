"""The streaming side's settings models: the feature job (``stream``) and the synthetic world's producer
(``producer``); ``loopline/settings.py`` composes and reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from streams.job_settings import JobSettings


class ProducerSettings(BaseModel):
    """Defaults of the project's synthetic world (``streams/world.py``) as `loopline produce` and the demo publish it."""

    out_of_order_rate: float = Field(default=0.05, ge=0, le=1)
    max_out_of_order_s: float = Field(default=5.0, ge=0)
    late_rate: float = Field(default=0.005, ge=0, le=1)
    malformed_rate: float = Field(default=0.0, ge=0, le=1)
    knobs: dict[str, Any] = Field(
        default_factory=dict,
        description="The template world's own knobs (how many entities of each kind it draws, and the like).",
    )


class StreamSettings(BaseModel):
    """The streaming feature job (its defaults are the job's own, ``streams/job_settings.py``)."""

    group_id: str = JobSettings.group_id
    source_topics: dict[str, str] = Field(
        default_factory=dict,
        description="Read these topics instead of the ones the project declares (declared -> read): a replay's, a test's.",
    )
    dead_letter_topic: str = JobSettings.dead_letter_topic
    checkpoint_interval_ms: int = Field(default=JobSettings.checkpoint_interval_ms, ge=100)
    flush_interval_ms: int = Field(
        default=JobSettings.flush_interval_ms,
        ge=1,
        description="Longest a row waits for a Python batch (decoding, the offline log): freshness.",
    )
    max_batch_rows: int = Field(
        default=JobSettings.max_batch_rows,
        ge=1,
        description="Rows per Python batch (Arrow), and entities per online write round trip: throughput.",
    )
    online_interval_ms: int = Field(
        default=JobSettings.online_interval_ms,
        ge=1,
        description="An entity's online row (with its windows' steps) goes at most once per this: freshness "
        "against work per event.",
    )
    state_check_ms: int = Field(
        default=JobSettings.state_check_ms,
        ge=1_000,
        description="The longest an entity waits between checks of whether its windows are empty for good (then it "
        "leaves the job's state): memory freed sooner against a check per entity per interval.",
    )
    parallelism: int = Field(default=JobSettings.parallelism, ge=1)
    allow_partial_rebuild: bool = Field(
        default=JobSettings.allow_partial_rebuild,
        description="Rebuild the windows even where a topic no longer retains a "
        "view's longest window (they count only what is retained, filling as new events come); else such a rebuild is refused.",
    )
    checkpoint_dir: str | None = Field(
        default=None,
        description="Checkpoints and savepoints: a path or any Flink filesystem "
        "URI (file:///shared/..., s3://bucket/... at scale); default <home>/checkpoints/<group_id>.",
    )
    offline_dir: Path | None = Field(
        default=None,
        description="Append feature rows under <dir>/<view>; default: the path each view's FileSource declares.",
    )
    metrics_port: int | None = Field(
        default=9249,
        ge=0,
        le=65535,
        description="The embedded job serves its Flink metrics to Prometheus at :<port>/metrics; 0 or None: off.",
    )
