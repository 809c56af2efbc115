"""Feast's Redis online store, reading each stream feature view in the generation Loopline's readers serve.

A view rebuilt under a changed plan keeps its rows under a namespace of its own (``feature_store/view_state.py``);
Feast's own ``RedisOnlineStore`` reads only the namespace of the view's name, the first generation's. This store is
Feast's, with one change: where a view has a serving generation, ``get_online_features`` reads its fields (a feature
the generation does not compute reads as no value), so Feast and Loopline's reader answer from the same rows after a
switch-over. Loopline builds every ``FeatureStore`` it makes with it (``feature_store/config.py``); a repo's own
``feature_store.yaml`` may name it too (``type: feature_store.feast_online_store.GenerationalRedisOnlineStore``) so
that the ``feast`` CLI follows generations as well. The serving generations are read at most every ``_REFRESH_S``.
"""

from __future__ import annotations

import time

from feast.infra.online_stores.redis import RedisOnlineStore, RedisOnlineStoreConfig

from feature_store.view_state import read_view_states

#: How long the serving generations read are used before they are read again.
_REFRESH_S = 0.5
#: The store's type as a ``feature_store.yaml`` names it.
STORE_TYPE = "feature_store.feast_online_store.GenerationalRedisOnlineStore"


class GenerationalRedisOnlineStoreConfig(RedisOnlineStoreConfig):
    """Feast's Redis online store configuration, under this store's type."""

    type: str = STORE_TYPE  # type: ignore[assignment]


class GenerationalRedisOnlineStore(RedisOnlineStore):
    """Feast's ``RedisOnlineStore``, reading each view's serving generation."""

    _namespaces: dict[str, str] = {}
    _read_at: float = float("-inf")

    def _refresh(self, config) -> None:
        """The views' serving namespaces, read again when older than ``_REFRESH_S``."""
        now = time.monotonic()
        if now - self._read_at >= _REFRESH_S:
            states = read_view_states(self._get_client(config.online_store), config.project)
            self._namespaces, self._read_at = {view: g.namespace for view, g in states.serving.items()}, now

    def online_read(self, config, table, entity_keys, requested_features=None):
        self._refresh(config)
        return super().online_read(config, table, entity_keys, requested_features)

    def _read_features_per_fv(self, config, *args, **kwargs) -> None:
        self._refresh(config)
        return super()._read_features_per_fv(config, *args, **kwargs)

    def _generate_hset_keys_for_features(self, feature_view, requested_features=None, fv_name_override=None):
        """Feast's fields of the view's serving namespace; the timestamp's still labelled with Feast's name, which the
        reply is decoded by."""
        label = fv_name_override or feature_view.name
        namespace = self._namespaces.get(feature_view.name, label)
        requested, fields = super()._generate_hset_keys_for_features(feature_view, requested_features, namespace)
        requested[-1] = f"_ts:{label}"
        return requested, fields
