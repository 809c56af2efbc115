"""The skew monitor's consistency replay: a batch of sampled requests recomputed from the event log and compared with
the features they were served."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from feedback_loop.consistency import FeatureConsistency, check_consistency, events_needed_since
from schemas.records import PredictionRecord
from streams.event_log import EventLogWindow
from streams.feature_plan import FeaturePlan


def consistency_replay(
    plan: FeaturePlan, bootstrap_servers: str, client_config: Mapping[str, str] | None = None
) -> Callable[[list[PredictionRecord]], Mapping[str, FeatureConsistency]]:
    """The replay of a batch of sampled requests: the event log from as far back as the batch's windowed features
    reach (``events_needed_since``), judged as the job judges it (late events out), recomputed point in time and
    compared. Features with no window (time since the previous event, which can lie anywhere before) are not replayed:
    the log read would be unbounded. One incremental reader serves every call: each reads only what was published
    since the one before. The monitor calls it from one timer, which awaits each replay before the next."""
    logs = {topic: EventLogWindow(plan, topic, bootstrap_servers, client_config) for topic in plan.topics}
    windowed = [f"{view.name}:{agg.name}" for view in plan.views for agg in view.aggregations if agg.window_ms]

    def replay(batch: list[PredictionRecord]) -> Mapping[str, FeatureConsistency]:
        since = events_needed_since(plan, batch, windowed)
        if since is None:
            return {}
        accepted = {topic: log.events(since)[0] for topic, log in logs.items()}
        return check_consistency(plan, accepted, batch, features=windowed) if any(len(e) for e in accepted.values()) else {}

    return replay
