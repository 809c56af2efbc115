"""The online feature log as a sliding window of counts: per model version and time bucket, every referenced
feature's counts, which ``feedback_loop/drift.py`` measures skew from.

The counts live in a mutable mapping given by the caller: the monitor's faust table (changelogged to Kafka, so a
restarted monitor resumes with its window) or a dict in tests. A key is ``<reference>|<version>|<bucket start
ms>|<source partition>``: bins only add up against the same reference (a new prod snapshot starts new keys), and a
faust table's key must stay on the partition of the records that write it. A value holds each feature's
``FeatureCounts`` as plain JSON and the highest source offset counted into it: records of one partition come in
offset order, so a record at or below it was counted already (a restarted consumer re-reading what its last commit
did not cover) and is skipped. A check adds up the buckets inside the window; older buckets are deleted.

Which records count, each contract-valid record ending either counted once or left out with a reason
(``problem``), never raising:

* A record whose referenced feature holds a value ``drift.value_problem`` refuses (a string where a number goes,
  ±Infinity, an integer beyond a double) is left out whole, with that reason: counting its other features would give
  its features different row counts, and calling the value missing would hide the breakage in the missing rate.
* A record with no features at all is left out as ``no_features``: it says nothing of what a model was given.
* A feature the reference does not have is not measured, whatever its value (a newer model's extra input has
  nothing to compare with); the record's referenced features count. A referenced feature the record lacks is missing.
* A record whose every referenced stored feature defaulted (its read overran the budget) is not counted, as the
  reference leaves such rows out (``reference.overran_reads``): it says nothing of the features' distribution.
* A model version never seen counts under its own version, against the one reference every version is measured
  against (the prod version's training snapshot: a canary's skew shows against it), whatever its name holds (the
  key's ``|`` included: a key is read from both ends).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import asdict

from feedback_loop.drift import NOT_FINITE, WRONG_TYPE, FeatureCounts, FeatureSkew, count_values, feature_skew, value_problem
from feedback_loop.reference import FeatureReference, overran_reads
from schemas.records import PredictionRecord

#: A record with an empty feature vector.
NO_FEATURES = "no_features"
#: Every reason ``FeatureLogWindow.problem`` gives for leaving a record out.
PROBLEMS = (NO_FEATURES, NOT_FINITE, WRONG_TYPE)


def _to_json(counts: FeatureCounts) -> dict:
    return {**asdict(counts), "bins": list(counts.bins), "categories": [list(c) for c in counts.categories]}


def _key_parts(key: str) -> tuple[str, str, int, int]:
    """(reference, version, bucket start ms, partition) of a store key; the version may hold ``|`` itself."""
    reference, rest = key.split("|", 1)
    version, bucket, partition = rest.rsplit("|", 2)
    return reference, version, int(bucket), int(partition)


def _from_json(value: Mapping) -> FeatureCounts:
    return FeatureCounts(
        tuple(value["bins"]),
        tuple((str(k), int(n)) for k, n in value["categories"]),
        int(value["missing"]),
        int(value["defaulted"]),
        int(value["rows"]),
    )


class FeatureLogWindow:
    """Counts of logged feature values against ``references`` (feature → reference, named ``reference_id``), in
    buckets of ``bucket_ms`` by scoring time, over the last ``window_ms``, kept in ``store``."""

    def __init__(
        self,
        store: MutableMapping[str, dict],
        reference_id: str,
        references: Mapping[str, FeatureReference],
        bucket_ms: int,
        window_ms: int,
    ) -> None:
        if bucket_ms <= 0 or window_ms < bucket_ms:
            raise ValueError(f"a window of {window_ms} ms cannot hold buckets of {bucket_ms} ms")
        self.store, self.bucket_ms, self.window_ms = store, bucket_ms, window_ms
        self.use(reference_id, references)

    def use(self, reference_id: str, references: Mapping[str, FeatureReference]) -> None:
        """Count against another reference from now on (the counts against the old one age out of the window)."""
        if "|" in reference_id:
            raise ValueError(f"a reference id cannot hold '|': {reference_id!r}")
        self.reference_id, self.references = reference_id, dict(references)

    def problem(self, record: PredictionRecord) -> str | None:
        """Why ``record`` is not counted (one of ``PROBLEMS``), or None when it is: the module docstring's rules."""
        if not record.features:
            return NO_FEATURES
        for name, reference in self.references.items():
            reason = value_problem(reference, record.features.get(name))
            if reason is not None:
                return reason
        return None

    def add(self, records: Sequence[PredictionRecord], partition: int = 0, offset: int | None = None) -> int:
        """Count the referenced features of ``records`` read from source ``partition``, less those with a ``problem``:
        one store update per (version, bucket) touched; how many records were counted. With ``offset`` (one record
        only: a batch's records have offsets of their own), a bucket that counted that offset of the partition
        already skips the record."""
        if offset is not None and len(records) != 1:
            raise ValueError(f"an offset names one record, not {len(records)}")
        groups: dict[tuple[str, int], list[PredictionRecord]] = {}
        read = [r for r in records if self.problem(r) is None]
        overran = overran_reads(
            [sum(name in r.defaulted_features for name in self.references) for r in read], list(self.references)
        )
        for record in (r for r, skipped in zip(read, overran, strict=True) if not skipped):
            groups.setdefault((record.model_version, record.scored_at_ms // self.bucket_ms * self.bucket_ms), []).append(record)
        counted = 0
        for (version, bucket), batch in groups.items():
            key = f"{self.reference_id}|{version}|{bucket}|{partition}"
            stored = self.store.get(key) or {"features": {}, "through": -1}
            if offset is not None and offset <= stored["through"]:
                continue
            counts = dict(stored["features"])
            for name, reference in self.references.items():
                added = count_values(
                    reference, [r.features.get(name) for r in batch], [name in r.defaulted_features for r in batch]
                )
                counts[name] = _to_json(added if name not in counts else _from_json(counts[name]) + added)
            self.store[key] = {"features": counts, "through": stored["through"] if offset is None else offset}
            counted += len(batch)
        return counted

    def window(self, now_ms: int) -> dict[str, dict[str, FeatureCounts]]:
        """Per model version and feature, the counts (against the current reference) of the buckets within the
        window ending at ``now_ms``."""
        start = now_ms - self.window_ms
        totals: dict[str, dict[str, FeatureCounts]] = {}
        for key, value in list(self.store.items()):
            reference, version, bucket, _ = _key_parts(key)
            if reference != self.reference_id or bucket + self.bucket_ms <= start:
                continue
            by_feature = totals.setdefault(version, {})
            for name, counts in value["features"].items():
                if name in self.references:
                    by_feature[name] = by_feature.get(name, FeatureCounts()) + _from_json(counts)
        return totals

    def skews(self, now_ms: int) -> dict[str, list[FeatureSkew]]:
        """Per model version, every referenced feature's skew over the window ending at ``now_ms``."""
        return {
            version: [feature_skew(name, self.references[name], counts) for name, counts in sorted(features.items())]
            for version, features in sorted(self.window(now_ms).items())
        }

    def stale(self, now_ms: int, partition: int | None = None) -> list[str]:
        """The keys of buckets (of source ``partition``, or all) that ended before the window ending at ``now_ms``,
        whatever reference they counted against: what to delete. A faust table deletes a key on the partition of
        the record being handled, so the monitor deletes each partition's keys while handling that partition."""
        start = now_ms - self.window_ms
        stale = []
        for key in list(self.store.keys()):
            _, _, bucket, source = _key_parts(key)
            if bucket + self.bucket_ms <= start and partition in (None, source):
                stale.append(key)
        return stale
