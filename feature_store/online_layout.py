"""Where Feast's Redis online store keeps a view's rows: the one place the reader and the writer take it from.

An entity's row of every view lives in one hash, keyed by the serialized entity key and the project; a view's
features are hashed fields (murmur3 of ``<stored name>:<feature>``), its event time is ``_ts:<stored name>``, and
Loopline's writer adds ``_order:<stored name>``, ``_absorbed:<stored name>`` (the log positions behind the row),
``_plan:<stored name>`` (the identity of the plan that computed it), and for windowed views one field per window with
its steps, ``_window:<stored name>:<slide ms>:<window ms>:<digest of its aggregations>``
(``feature_store/window_tiles.py``). The stored name is Feast's own (``_versioned_fv_name``): the view's name, with its
version when the registry turns on online feature view versioning, so both paths address the fields Feast's
``get_online_features`` reads whatever that setting is; a later generation of a view's rows, computed under a changed
plan, is stored under a name of its own (``feature_store/view_state.py``). Everything is computed once, when the layout
is built; a hot path only looks it up.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from feature_store.config import feature_fields
from feature_store.view_state import Generation
from feature_store.window_tiles import AggregationSpec, Window, view_aggregations, view_windows

if TYPE_CHECKING:
    from feast import FeatureView
    from feast.repo_config import RepoConfig

_KEY_CACHE_SIZE = 100_000


@dataclass(frozen=True)
class ViewLayout:
    """One view's place in an entity's hash."""

    #: The entity's join keys, in the view's order.
    join_keys: tuple[str, ...]
    timestamp_field: bytes
    order_field: bytes
    #: The log positions the row absorbed (``partition:offset,...``).
    absorbed_field: bytes
    #: The identity of the plan the row was computed under (rows written by hand have none).
    plan_field: bytes
    fields: dict[str, bytes]  # feature name -> hashed Redis field
    #: The view's windowed aggregations by feature name, and its windows by (slide ms, window ms), in the job's order,
    #: each with the field of its steps; both empty for a view without windows.
    aggregations: dict[str, AggregationSpec]
    windows: dict[tuple[int, int], tuple[bytes, Window]]
    stored_name: str


def view_layout(
    stored: str, join_keys: tuple[str, ...], features: Iterable[str], aggregations: Iterable[AggregationSpec]
) -> ViewLayout:
    """The place of a view's rows stored under ``stored`` (its namespace) with ``features``, of which ``aggregations``
    are the job's, in its order."""
    from feast.infra.online_stores.helpers import _mmh3

    windows = view_windows(aggregations)
    return ViewLayout(
        join_keys=join_keys,
        timestamp_field=f"_ts:{stored}".encode(),
        order_field=f"_order:{stored}".encode(),
        absorbed_field=f"_absorbed:{stored}".encode(),
        plan_field=f"_plan:{stored}".encode(),
        fields={name: _mmh3(f"{stored}:{name}") for name in features},
        aggregations={a.name: a for window in windows.values() for a in window.aggregations},
        windows={
            key: (f"_window:{stored}:{key[0]}:{key[1]}:{window.digest}".encode(), window) for key, window in windows.items()
        },
        stored_name=stored,
    )


class OnlineLayout:
    """The Redis keys and hash fields of ``views`` under the Feast repo config ``config``."""

    def __init__(self, config: RepoConfig, views: Iterable[FeatureView]) -> None:
        """``config``: the store's ``RepoConfig``; ``views``: its feature views and stream feature views."""
        from feast.infra.key_encoding_utils import serialize_entity_key
        from feast.infra.online_stores.redis import _versioned_fv_name
        from feast.protos.feast.types.EntityKey_pb2 import EntityKey
        from feast.protos.feast.types.Value_pb2 import Value

        self.views: dict[str, ViewLayout] = {
            view.name: view_layout(
                _versioned_fv_name(view, config),
                tuple(column.name for column in view.entity_columns),
                [f.name for f in feature_fields(view)],
                view_aggregations(view),
            )
            for view in views
        }
        self._generations: dict[str, ViewLayout] = {}
        project, version = config.project.encode(), config.entity_key_serialization_version

        def build_key(join_keys: tuple[str, ...], entity: tuple[str, ...]) -> bytes:
            key = EntityKey(join_keys=list(join_keys), entity_values=[Value(string_val=value) for value in entity])
            return serialize_entity_key(key, entity_key_serialization_version=version) + project

        #: ``redis_key(join_keys, entity)``: the key of the hash of the entity whose ``join_keys`` (a tuple) have the
        #: values ``entity`` (a tuple, in the same order; Feast's ``_redis_key``). Cached, and called without a wrapper:
        #: serialising an entity key costs ~10 µs, and hot entities are read and written again and again.
        self.redis_key = lru_cache(maxsize=_KEY_CACHE_SIZE)(build_key)

    def generation(self, generation: Generation) -> ViewLayout:
        """Where the rows of a view's ``generation`` are (its namespace; its features are its aggregations)."""
        layout = self._generations.get(generation.namespace)
        if layout is None:
            layout = self._generations[generation.namespace] = view_layout(
                generation.namespace, generation.join_keys, [a.name for a in generation.aggregations], generation.aggregations
            )
        return layout

    def key_parts(self, join_keys: tuple[str, ...]) -> tuple[list[bytes], list[int]]:
        """How every key of an entity of ``join_keys`` is made: the bytes before the first value, between each two and
        after the last, and which join key's value comes at each place (Feast orders them by name); each value is its
        UTF-8's length (4 bytes, little-endian) and its UTF-8. Checked here on a few entities, so a Feast that
        serializes otherwise fails here, not in a write."""
        order = sorted(range(len(join_keys)), key=lambda i: join_keys[i])
        empty = self.redis_key(join_keys, ("",) * len(join_keys))
        parts, at = [], 0
        for n in range(len(join_keys)):
            one = self.redis_key(join_keys, tuple("u" if i == order[n] else "" for i in range(len(join_keys))))
            length_at = next(i for i, (a, b) in enumerate(zip(empty, one, strict=False)) if a != b)  # its length: 0, then 1
            parts.append(empty[at:length_at])
            at = length_at + 4
        parts.append(empty[at:])
        for sample in ("", "u", "entité-42", "x" * 300):
            entity = tuple(f"{sample}{i}" for i in range(len(join_keys)))
            values = [entity[i].encode() for i in order]
            expected = parts[0] + b"".join(
                struct.pack("<I", len(v)) + v + part for v, part in zip(values, parts[1:], strict=True)
            )
            if self.redis_key(join_keys, entity) != expected:
                raise ValueError(
                    f"Feast's key of {dict(zip(join_keys, entity, strict=True))} is not its values' lengths and UTF-8 "
                    "around fixed bytes"
                )
        return parts, order
