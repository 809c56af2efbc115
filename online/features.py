"""Feature fetch for scoring: the fast online read under a per-request budget, defaults on a miss.

A request never fails for want of features: a feature Redis has no value for, a read that
overruns the budget, or a Redis that is down all give the defaults declared with the features
(``feature_store/defaults.py``), and the response says which ones were defaulted.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from feature_store.online_read import OnlineReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FetchedFeatures:
    """The values to score with, by feature reference ("view:feature"), and those that were defaulted."""

    values: dict[str, float | int | str | bool | None]
    defaulted: list[str]


class FeatureFetcher:
    """Reads the features a model needs for one request's entities, within ``budget_s``."""

    def __init__(self, reader: OnlineReader, features: list[str], budget_s: float = 0.020, threads: int = 4) -> None:
        self.reader = reader
        self.features = features
        self.budget_s = budget_s
        self.defaults = {ref: reader.defaults.get(ref) for ref in features}
        # redis-py is synchronous: reads run on a few threads so the event loop keeps batching.
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="feature-fetch")

    def _read(self, entity_keys: dict[str, str]) -> dict[str, list]:
        return self.reader.get_online_features(self.features, [entity_keys])

    async def fetch(self, entity_keys: dict[str, str]) -> FetchedFeatures:
        """The features for ``entity_keys`` (join key -> value); defaults for whatever is missing or late."""
        loop = asyncio.get_running_loop()
        try:
            found = await asyncio.wait_for(loop.run_in_executor(self._pool, self._read, entity_keys), self.budget_s)
        except Exception as err:  # too slow, Redis down, entity key missing: all degrade to the defaults
            log.debug("feature fetch fell back to defaults: %r", err)
            return FetchedFeatures(dict(self.defaults), list(self.features))
        values, defaulted = {}, []
        for ref in self.features:
            value = found[ref.split(":", 1)[1]][0]
            if value is None:
                value = self.defaults[ref]
                defaulted.append(ref)
            values[ref] = value
        return FetchedFeatures(values, defaulted)

    def close(self) -> None:
        """Stop the read threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)
