"""The errors a user can act on, and how ``loopline`` prints them: one line on stderr, never a trace."""

from __future__ import annotations

import urllib.error

from confluent_kafka import KafkaException
from pydantic import ValidationError
from redis.exceptions import RedisClusterException

from feedback_loop.snapshots import SnapshotError
from infra.errors import StackError
from loopline.settings import UnknownSettingError
from offline_training.errors import OfflineTrainingError
from schemas.errors import SchemasError
from streams.errors import StreamsError

#: Errors the user can act on: printed as one line, never as a trace. Loopline's packages each raise theirs under one
#: base (``infra/errors.py``, ``schemas/errors.py``, ``streams/errors.py``, ``offline_training/errors.py``; the feedback
#: loop's one is ``SnapshotError``); then a setting refused (unknown, or a value pydantic refuses), and what the clients
#: raise (Kafka, a wait that timed out, the Flink REST API, Redis Cluster).
USER_ERRORS = (
    StackError,
    SchemasError,
    StreamsError,
    OfflineTrainingError,
    SnapshotError,
    UnknownSettingError,
    ValidationError,
    KafkaException,
    TimeoutError,
    urllib.error.URLError,
    RedisClusterException,
)


def one_line(err: Exception) -> str:
    """A user error as one line: a settings error by its messages (each names the setting and the fix)."""
    if isinstance(err, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"] for e in err.errors())
    if isinstance(err, urllib.error.URLError):
        return (
            f"the Flink cluster's REST API refused or did not answer ({getattr(err, 'reason', err)}) — fix: check "
            "--jobmanager and the job id, `loopline flink status`"
        )
    return str(err)
