"""Batched writes of feature rows into the online store, through Feast's own online store implementation.

Rows are idempotent by (entity key, row version): Feast's Redis store keeps a row's timestamp
with it and skips any row that is not newer, so an older or replayed row never overwrites a newer
one. Loopline's row version is a timestamp in microseconds that grows strictly with every event
the job absorbs for the entity (see ``SlidingWindows`` in ``streams/jvm``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from feature_store.config import REPO_PATH, feature_fields, feature_store

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Feast value-proto field for each feature dtype Loopline declares.
_VALUE_FIELDS = {"INT64": "int64_val", "INT32": "int32_val", "DOUBLE": "double_val", "FLOAT": "float_val",
                 "STRING": "string_val", "BOOL": "bool_val"}  # fmt: skip


@dataclass(frozen=True)
class FeatureRow:
    """The features of one entity of one view as of ``version_us`` (microseconds since the epoch)."""

    view: str
    entity: str
    version_us: int
    features: dict[str, float | int | str | bool | None]

    @property
    def timestamp(self) -> datetime:
        """The row's event time, with the version's microseconds."""
        return _EPOCH + timedelta(microseconds=self.version_us)


def latest_per_entity(rows: list[FeatureRow]) -> list[FeatureRow]:
    """Only the newest row of each (view, entity): the others would be skipped by the store anyway."""
    newest: dict[tuple[str, str], FeatureRow] = {}
    for row in rows:
        current = newest.get((row.view, row.entity))
        if current is None or row.version_us > current.version_us:
            newest[(row.view, row.entity)] = row
    return list(newest.values())


class OnlineWriter:
    """Writes FeatureRows of the registry's views to the online store configured in the repo."""

    def __init__(
        self, feast_registry_path: Path | None, redis_connection: str | None, repo_path: Path = REPO_PATH, *, redis_cluster: bool = False
    ) -> None:
        """``redis_cluster``: the connection names a Redis Cluster's nodes (Feast's store then writes through its cluster
        client: each entity's row is one hash, so each write names one key and goes to the master of its slot)."""
        from feast.infra.online_stores.helpers import get_online_store_from_config

        store = feature_store(feast_registry_path, redis_connection, repo_path, redis_cluster=redis_cluster)
        self._config = store.config
        self._online_store = get_online_store_from_config(store.config.online_store)
        self._views = {view.name: view for view in store.list_stream_feature_views()}
        self._value_fields = {
            name: {f.name: _VALUE_FIELDS[f.dtype.to_value_type().name] for f in feature_fields(view)}
            for name, view in self._views.items()
        }
        self._join_keys = {name: view.entity_columns[0].name for name, view in self._views.items()}

    def write(self, rows: list[FeatureRow]) -> int:
        """Write the newest row of each entity; return how many rows were sent."""
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.protos.feast.types.Value_pb2 import Value

        by_view: dict[str, list] = {}
        for row in latest_per_entity(rows):
            fields = self._value_fields[row.view]
            values = {
                name: Value() if value is None else Value(**{fields[name]: value})
                for name, value in row.features.items()
            }
            key = EntityKey(join_keys=[self._join_keys[row.view]], entity_values=[Value(string_val=row.entity)])
            by_view.setdefault(row.view, []).append((key, values, row.timestamp, None))
        for view, data in by_view.items():
            self._online_store.online_write_batch(self._config, self._views[view], data, None)
        return sum(len(data) for data in by_view.values())

    def delete_rows(self) -> list[str]:
        """Delete every online row of the registry's stream feature views (Feast's own ``delete_table``): a stream
        rebuilt from scratch then replaces the old rows instead of leaving its quiet entities' old values beside the
        new ones (a row is only ever overwritten by a newer one). The views whose rows were deleted."""
        for view in self._views.values():
            self._online_store.delete_table(self._config, view)
        return sorted(self._views)
