"""The demo's skew monitor and dashboard: `loopline dashboard` from the start, `loopline monitor` once the loop's
snapshot exists (it is the reference), and then a skew injected on purpose — a request field the project names
(``demo.skew`` in its project file) multiplied by a factor, as an upstream bug would send it (the fraud project's
amounts in cents) — so the alert visibly fires on the page and in Prometheus for that feature, and no other."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from infra.errors import StackError
from infra.prometheus_server import alerts
from loopline.components import project
from loopline.job_processes import start_loopline, stop_process_group
from loopline.scenarios.demo_loop import BACKGROUND_NICENESS
from loopline.scenarios.demo_scoring import DemoScoring
from loopline.settings import Settings

#: The alert that should fire for the feature the injected skew moves.
SKEW_ALERT = "LooplineFeatureSkew"
#: The monitor's paging alerts on a feature's distribution (PSI, JS divergence, L-infinity): a feature alerts when one
#: of them fires for it.
SKEW_ALERTS = frozenset({SKEW_ALERT, "LooplineFeatureDistributionShift", "LooplineCategoryShift"})
#: The monitor measures a short window in the demo, so the skew shows within seconds of the injection.
_MONITOR_ENV = {
    "LOOPLINE_MONITOR__WINDOW_S": "60",
    "LOOPLINE_MONITOR__BUCKET_S": "5",
    "LOOPLINE_MONITOR__MIN_ROWS": "200",
    "LOOPLINE_MONITOR__CHECK_INTERVAL_S": "2",
    "LOOPLINE_MONITOR__SAMPLE_RATE": "0.05",
    "LOOPLINE_MONITOR__CONSISTENCY_INTERVAL_S": "45",
    "LOOPLINE_MONITOR__SETTLE_S": "5",
}
#: After the injection: the PSI crossing (seconds), a scrape (5 s), the rule's 1 min hold, and slack for a loaded machine.
#: The demo goes on producing past its budget up to this long for the alert to fire (`DemoSkew.settled`).
TIME_TO_FIRE_S = 120.0
#: The monitor measures this long before the skew goes in: the page shows the healthy state first.
_HEALTHY_S = 25.0


class DemoSkew:
    """Starts the dashboard and the monitor, injects the skew, and reports what the monitor and Prometheus saw."""

    def __init__(self, settings: Settings, scoring: DemoScoring, logs: Path) -> None:
        self.settings, self.scoring, self.logs = settings, scoring, logs
        skew = project(settings).spec.demo.get("skew", {})
        #: The request field skewed on purpose, by how much, and the model input it moves.
        self.field, self.factor = skew.get("request_field"), float(skew.get("factor", 100.0))
        self.feature = f"request:{self.field}"
        self.dashboard_url = f"http://{settings.dashboard.host}:{settings.dashboard.port}/"
        self._monitor_url = f"http://{settings.serving.host}:{settings.monitor.metrics_port}/metrics"
        self._prometheus = f"http://{settings.prometheus.host}:{settings.prometheus.port}"
        self._dashboard = None
        self._monitor = None
        self._stopped = threading.Event()
        self._monitor_started: float | None = None
        self.injected_at: float | None = None
        self.reference: str | None = None

    def start_dashboard(self) -> None:
        """Serve the skew alert dashboard (`loopline dashboard`) for the run."""
        self._dashboard = start_loopline(self.settings, ["dashboard"], self.logs / "dashboard.log", BACKGROUND_NICENESS)

    def start_monitor(self, snapshot_id: str) -> None:
        """Run the monitor against the loop's training snapshot (not once the demo has stopped: a snapshot may finish
        as it ends)."""
        if self._stopped.is_set():
            return
        self.reference = snapshot_id
        # A consumer group of this run's own: it starts at the topic's end, not at where an earlier demo's monitor
        # stopped (one such backlog kept this run's window empty).
        env = {
            **_MONITOR_ENV,
            "LOOPLINE_MONITOR__REFERENCE_SNAPSHOT": snapshot_id,
            "LOOPLINE_MONITOR__APP_ID": f"loopline-monitor-{self.scoring.run_id}",
        }
        self._monitor = start_loopline(self.settings, ["monitor"], self.logs / "monitor.log", BACKGROUND_NICENESS, **env)
        self._monitor_started = time.monotonic()

    def step(self, release_decided: bool) -> None:
        """Inject the skew once the monitor has measured the healthy stream a while and the loop's release is decided
        (``release_decided``): the canary is judged on the healthy stream, before the demo's upstream bug goes in."""
        started = self._monitor_started
        if self.field is None or not release_decided:
            return
        if (
            self.injected_at is None
            and started is not None
            and time.monotonic() - started >= _HEALTHY_S
            and self._psi() is not None
        ):
            self.scoring.skew = {self.field: self.factor}
            self.injected_at = time.monotonic()

    def settled(self) -> bool:
        """Whether the skew has nothing more to show: no monitor runs (the loop made no snapshot), or its alert fired,
        or it had TIME_TO_FIRE_S after the injection."""
        if self._monitor is None or self.field is None:
            return True
        if self.injected_at is None:
            return False
        return time.monotonic() - self.injected_at > TIME_TO_FIRE_S or self.alert_state() == "firing"

    def psis(self) -> dict[str, float]:
        """Each feature's PSI as the monitor measures it now (the largest over model versions); empty if it does not
        answer."""
        try:
            text = requests.get(self._monitor_url, timeout=1).text
        except requests.RequestException:
            return {}
        psis: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "loopline_feature_psi":
                for sample in family.samples:
                    feature = sample.labels.get("feature", "")
                    psis[feature] = max(psis.get(feature, sample.value), sample.value)
        return psis

    def _psi(self) -> float | None:
        return self.psis().get(self.feature)

    def _alerts(self) -> list[dict] | None:
        """The skew alerts Prometheus has pending or firing (None when it does not answer)."""
        try:
            return [a for a in alerts(self._prometheus, timeout_s=1) if a["labels"].get("alertname") in SKEW_ALERTS]
        except StackError:
            return None

    def alert_state(self) -> str:
        """The skew alert's state in Prometheus for the skewed feature: firing, pending, none (or unknown)."""
        listed = self._alerts()
        if listed is None:
            return "unknown"
        states = {
            a["state"]
            for a in listed
            if a["labels"].get("alertname") == SKEW_ALERT and a["labels"].get("feature") == self.feature
        }
        return "firing" if "firing" in states else "pending" if "pending" in states else "none"

    def alerting_features(self) -> list[str]:
        """The features a skew alert is firing for now (any model version)."""
        return self._features_in("firing")

    def pending_features(self) -> list[str]:
        """The features a skew alert is pending for now (over its threshold, not yet for its 1 min hold), not firing."""
        return sorted(set(self._features_in("pending")) - set(self.alerting_features()))

    def _features_in(self, state: str) -> list[str]:
        return sorted({a["labels"].get("feature", "") for a in self._alerts() or () if a["state"] == state})

    @property
    def injected_features(self) -> list[str]:
        """The features the demo skewed on purpose (none before the injection)."""
        return [self.feature] if self.injected_at is not None else []

    def table(self) -> Table:
        """The monitor's view of the skewed feature and of the others, and Prometheus' alerts, as the live view shows it."""
        table = Table(title=f"skew monitor — dashboard {self.dashboard_url}")
        for column in ("feature", "reference", "PSI (alert ≥ 0.25)", "injected", f"Prometheus {SKEW_ALERT}"):
            table.add_column(column, justify="right")
        if self._monitor is None:
            table.add_row(self.feature, "waiting for the loop's snapshot", "—", "—", "—")
            return table
        psis = self.psis()
        psi = psis.pop(self.feature, None)
        injected = (
            "—" if self.injected_at is None else f"{self.field} ×{self.factor:g}, {time.monotonic() - self.injected_at:.0f} s ago"
        )
        table.add_row(self.feature, self.reference or "—", "—" if psi is None else f"{psi:.3f}", injected, self.alert_state())
        others = [f for f in self.alerting_features() if f != self.feature]
        highest = max(psis.items(), key=lambda kv: kv[1], default=None)
        table.add_row(
            f"the other {len(psis)} features",
            "",
            "—" if highest is None else f"highest {highest[1]:.3f} ({highest[0]})",
            "no",
            "alerting: " + (", ".join(others) if others else "none"),
        )
        return table

    def summary(self) -> dict:
        """What the demo's summary reports about the skew, and what the retrain trigger makes of it now (a look: the
        demo acts on nothing; `loopline retrain watch` would, in its settings' modes)."""
        from loopline.retraining import check_trigger

        psi = self._psi()
        injected_s = None if self.injected_at is None else round(time.monotonic() - self.injected_at)
        trigger = check_trigger(self.settings)
        return {
            "dashboard": self.dashboard_url,
            "skew_reference_snapshot": self.reference,
            "skew_feature": self.feature,
            "skew_injected": self.injected_at is not None,
            "skew_injected_s_ago": injected_s,
            "skew_psi": None if psi is None else round(psi, 3),
            "skew_alert": self.alert_state(),
            "skew_injected_features": self.injected_features,
            "skew_alerting_features": self.alerting_features(),
            "skew_pending_features": self.pending_features(),
            "prometheus_answered": self._alerts() is not None,
            "retrain_trigger_fires": trigger.fire,
            "retrain_trigger_causes": sorted(trigger.causes),
            "retrain_trigger_reason": trigger.reason,
        }

    def stop(self) -> None:
        """Stop the monitor and the dashboard (`loopline monitor` and `loopline dashboard` start them again)."""
        self._stopped.set()
        for process in (self._monitor, self._dashboard):
            if process is not None:
                stop_process_group(process)
