"""One Prometheus exposition of several worker processes: every metric name and label kept, values combined.

A scorer run with ``--workers N`` is N processes behind one port; a scrape lands on one of them, which answers
for all (``online/worker_peers.py``). Counters, histograms and gauges (the queue depth) add up across workers;
a ``_created`` time is the earliest worker's; an info metric (value 1) is itself, once per distinct label set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample


def _combine(name: str, a: float, b: float) -> float:
    if name.endswith("_created"):
        return min(a, b)
    if name.endswith("_info"):
        return max(a, b)
    return a + b


class _Merged:
    """A collector yielding the combined families of several expositions, in the order first seen."""

    def __init__(self, expositions: Iterable[str]) -> None:
        self._families: dict[str, Metric] = {}
        self._values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for text in expositions:
            for family in text_string_to_metric_families(text):
                self._families.setdefault(family.name, Metric(family.name, family.documentation, family.type, family.unit))
                values = self._values.setdefault(family.name, {})
                for sample in family.samples:
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    values[key] = sample.value if key not in values else _combine(sample.name, values[key], sample.value)

    def collect(self) -> Iterator[Metric]:
        for name, family in self._families.items():
            family.samples = [Sample(sample, dict(labels), value) for (sample, labels), value in self._values[name].items()]
            yield family


def merge_expositions(expositions: Iterable[str]) -> bytes:
    """The Prometheus text exposition of ``expositions`` (each a worker's ``/metrics`` text) combined."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(expositions))
    return generate_latest(registry)
