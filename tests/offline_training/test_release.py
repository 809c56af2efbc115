"""Releasing with a policy: ``decide`` on its own, the registry's alias history and rollback (MLflow on SQLite),
and the release controller against a real scorer (HTTP door, its ``/metrics``): a canary that fails or is
slow is rolled back, a healthy one promoted, a worse one on labeled feedback rolled back.

Every alias change is checked in the history the registry keeps: who or what made it, from which version
to which, and why.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from prometheus_client import start_http_server
from rich.console import Console
from typer.testing import CliRunner

from infra.service import free_port, wait_until
from loopline import cli
from loopline.cli import context
from loopline.components import model_release, release_controller
from loopline.project import template_path
from loopline.serving import build_scorer, model_watcher
from loopline.settings import Settings, settings_environment
from offline_training.onnx_models import write_linear_model
from offline_training.release import ModelRelease, ReleaseError
from offline_training.release_controller import ACTOR, ReleaseController, scrape
from offline_training.release_policy import ArmStats, Decision, ReleasePolicy, decide
from online.metrics import ScorerMetrics
from schemas.model_contract import INPUT_NAME, OUTPUT_NAME, ModelInput, features_metadata
from schemas.model_registry import CANARY_ALIAS, CANARY_SHARE_TAG, PROD_ALIAS, AliasChange
from schemas.records import PredictionRecord, TrainingExample
from schemas.topics import DAY_MS, PREDICTIONS, TopicSpec
from schemas.validation import encode
from streams.producer import EventProducer
from streams.topics import apply_topics
from streams.world import Emitted
from tests.support.kafka_log import LogReader
from tests.support.scoring import score_request, serving_doors

VIEW = "user_transaction_features"
INPUTS = [f"{VIEW}:txn_count_5m", f"{VIEW}:amount_sum_1h", f"{VIEW}:secs_since_prev_txn", "request:amount"]
USER = "release-nobody"

# --- the policy on its own -----------------------------------------------------------------------------------

POLICY = ReleasePolicy(
    min_watch_s=60,
    max_watch_s=600,
    min_requests=100,
    max_error_rate_increase=0.01,
    max_latency_ratio=1.5,
    min_labels=50,
    max_auc_drop=0.02,
)


def _arm(
    version: str = "2",
    requests: int = 1_000,
    errors: int = 0,
    p99_s: float | None = 0.004,
    labeled: int = 0,
    quality: float | None = None,
) -> ArmStats:
    return ArmStats(version, requests, errors, p99_s, labeled, quality)


PROD = _arm("1", errors=2)


def test_a_canary_with_a_higher_error_rate_is_rolled_back() -> None:
    verdict = decide(POLICY, _arm(errors=40), PROD, watched_s=5)
    assert verdict.action == "rollback" and "error rate 4.00%" in verdict.reason
    assert decide(POLICY, _arm(errors=11), PROD, watched_s=5).action == "wait", "within the allowance (+1 point)"
    # Below the minimum requests a few errors are no verdict yet.
    assert decide(POLICY, _arm(requests=20, errors=10), PROD, watched_s=5).action == "wait"


def test_a_canary_slower_at_p99_beyond_the_ratio_is_rolled_back() -> None:
    verdict = decide(POLICY, _arm(p99_s=0.007), PROD, watched_s=5)
    assert verdict.action == "rollback" and "p99 7.0 ms" in verdict.reason
    assert decide(POLICY, _arm(p99_s=0.0059), PROD, watched_s=5).action == "wait"
    # A p99 over a few requests is their slowest one: no verdict on it, on either arm.
    assert decide(POLICY, _arm(requests=30, p99_s=0.05), PROD, watched_s=5).action == "wait"
    assert decide(POLICY, _arm(p99_s=0.05), replace(PROD, requests=30), watched_s=5).action == "wait"


def test_a_canary_with_a_worse_auc_is_rolled_back_once_both_arms_have_labels() -> None:
    prod = replace(PROD, labeled=80, quality=0.90)
    verdict = decide(POLICY, _arm(labeled=60, quality=0.85), prod, watched_s=5)
    assert verdict.action == "rollback" and "AUC 0.8500" in verdict.reason
    assert decide(POLICY, _arm(labeled=40, quality=0.60), prod, watched_s=5).action == "wait", "too few canary labels"
    assert decide(POLICY, _arm(labeled=60, quality=0.60), replace(prod, labeled=40), watched_s=5).action == "wait"
    assert decide(POLICY, _arm(labeled=60, quality=math.nan), prod, watched_s=5).action == "wait", "one class only: no AUC"
    assert decide(POLICY, _arm(labeled=60, quality=0.89), prod, watched_s=5).action == "wait", "within the allowance"


def test_a_numeric_labels_canary_is_judged_by_its_rmse() -> None:
    """A regression's canary is rolled back when its RMSE on labeled events exceeds prod's by more than the allowed
    share; a lower RMSE is better, and promotes."""
    numeric = replace(POLICY, label_kind="numeric", max_rmse_increase=0.05)
    prod = replace(PROD, labeled=80, quality=4.0)
    worse = decide(numeric, _arm(labeled=60, quality=4.3), prod, watched_s=5)
    assert worse.action == "rollback" and "RMSE 4.3" in worse.reason and "5% RMSE" in worse.reason
    assert decide(numeric, _arm(labeled=60, quality=4.1), prod, watched_s=5).action == "wait", "within 5 %"
    better = decide(replace(numeric, require_quality=True), _arm(labeled=60, quality=2.0), prod, watched_s=60)
    assert better.action == "promote" and "RMSE 2 vs RMSE 4" in better.reason


def test_a_healthy_canary_is_promoted_after_the_minimum_watch() -> None:
    assert decide(POLICY, _arm(), PROD, watched_s=59).action == "wait"
    verdict = decide(POLICY, _arm(), PROD, watched_s=60)
    assert verdict.action == "promote" and "no labels yet" in verdict.reason
    quality = replace(POLICY, require_quality=True)
    assert decide(quality, _arm(), PROD, watched_s=60).action == "wait", "labels required, none yet"
    labeled = decide(quality, _arm(labeled=50, quality=0.91), replace(PROD, labeled=50, quality=0.90), watched_s=60)
    assert labeled.action == "promote" and "AUC 0.9100 vs AUC 0.9000" in labeled.reason


def test_without_enough_evidence_by_the_longest_watch_the_canary_is_rolled_back() -> None:
    assert decide(POLICY, _arm(requests=99), PROD, watched_s=599).action == "wait"
    verdict = decide(POLICY, _arm(requests=99), PROD, watched_s=600)
    assert verdict.action == "rollback" and "not enough evidence" in verdict.reason
    quality = replace(POLICY, require_quality=True)
    assert decide(quality, _arm(labeled=10, quality=0.9), PROD, watched_s=600).action == "rollback"


_counts = st.integers(0, 5_000)
_p99s = st.none() | st.floats(1e-5, 2.0)
_aucs = st.none() | st.just(math.nan) | st.floats(0.0, 1.0)


@st.composite
def _arms(draw: st.DrawFn, version: str) -> ArmStats:
    requests_ = draw(_counts)
    return ArmStats(version, requests_, draw(st.integers(0, requests_)), draw(_p99s), draw(_counts), draw(_aucs))


@st.composite
def _policies(draw: st.DrawFn) -> ReleasePolicy:
    min_watch = draw(st.floats(0, 1_000))
    return ReleasePolicy(
        min_watch_s=min_watch,
        max_watch_s=min_watch + draw(st.floats(1, 10_000)),
        min_requests=draw(st.integers(0, 1_000)),
        max_error_rate_increase=draw(st.floats(0, 0.5)),
        max_latency_ratio=draw(st.floats(1, 5)),
        min_labels=draw(st.integers(1, 500)),
        max_auc_drop=draw(st.floats(0, 0.5)),
        require_quality=draw(st.booleans()),
    )


@hypothesis_settings(max_examples=400, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(policy=_policies(), prod=_arms("1"), fraction=st.floats(0, 1, exclude_max=True))
def test_a_canary_no_worse_than_prod_is_never_rolled_back_before_the_longest_watch(
    policy: ReleasePolicy, prod: ArmStats, fraction: float
) -> None:
    watched_s = fraction * policy.max_watch_s
    assume(watched_s < policy.max_watch_s)  # a product that rounds up to the longest watch is not before it
    assert decide(policy, replace(prod, version="2"), prod, watched_s).action != "rollback"


@hypothesis_settings(max_examples=400, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(policy=_policies(), canary=_arms("2"), prod=_arms("1"), watched_s=st.floats(0, 20_000))
def test_a_promotion_always_rests_on_the_evidence_the_policy_asks_for(
    policy: ReleasePolicy, canary: ArmStats, prod: ArmStats, watched_s: float
) -> None:
    verdict = decide(policy, canary, prod, watched_s)
    if verdict.action == "promote":
        assert watched_s >= policy.min_watch_s and canary.requests >= policy.min_requests
        assert canary.error_rate <= prod.error_rate + policy.max_error_rate_increase
        if policy.require_quality:
            assert canary.quality_known(policy.min_labels) and prod.quality_known(policy.min_labels)
            assert canary.quality >= prod.quality - policy.max_auc_drop
    elif verdict.action == "wait":
        assert watched_s < policy.max_watch_s


def test_scrape_sums_the_scorers_and_interpolates_the_p99() -> None:
    """Two scorers' metrics over HTTP: both arms summed, and the p99 close to the true one, not a bucket's bound."""
    rng = np.random.default_rng(7)
    servers, urls, latencies = [], [], {"prod": [], "canary": []}
    for _ in range(2):
        metrics, port = ScorerMetrics(), free_port()
        servers.append(start_http_server(port, addr="127.0.0.1", registry=metrics.collector_registry)[0])
        urls.append(f"http://127.0.0.1:{port}/metrics")
        for alias, version, low, high in (("prod", "1", 0.001, 0.003), ("canary", "2", 0.0105, 0.019)):
            for seconds in rng.uniform(low, high, 500):
                metrics.model_requests.labels(alias, version, "ok").inc()
                metrics.model_latency.labels(alias, version).observe(seconds)
                latencies[alias].append(seconds)
            metrics.model_requests.labels(alias, version, "error").inc(3)
        metrics.model_requests.labels("prod", "7", "ok").inc(1_000)  # another version: not counted
    try:
        counts = scrape([*urls, f"http://127.0.0.1:{free_port()}/metrics"], {"prod": "1", "canary": "2"})
    finally:
        for server in servers:
            server.shutdown()
    for alias in ("prod", "canary"):
        assert (counts[alias].ok, counts[alias].errors) == (1_000, 6)
        true_p99 = float(np.quantile(latencies[alias], 0.99))
        assert counts[alias].p99_s() == pytest.approx(true_p99, rel=0.15), alias


# --- the registry: alias history, rollback, the CLI ----------------------------------------------------------


@pytest.fixture(scope="module")
def model_registry(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelRelease, dict[str, str], list[Path]]:
    """A registry of its own (MLflow on SQLite); the settings that name it; two model files."""
    folder = tmp_path_factory.mktemp("registry")
    env = {
        "LOOPLINE_MODEL_REGISTRY__TRACKING_URI": f"sqlite:///{folder / 'mlflow.db'}",
        "LOOPLINE_MODEL_REGISTRY__ARTIFACT_LOCATION": str(folder / "artifacts"),
        "LOOPLINE_HOME": str(folder / "home"),
        "LOOPLINE_PROJECT": str(template_path("fraud")),
    }
    files = [write_linear_model(folder / f"m{i}.onnx", INPUTS, np.full(4, 0.01 * i), 0.0) for i in range(2)]
    return (
        ModelRelease(env["LOOPLINE_MODEL_REGISTRY__TRACKING_URI"], env["LOOPLINE_MODEL_REGISTRY__ARTIFACT_LOCATION"]),
        env,
        files,
    )


def _fresh_model(release: ModelRelease, files: list[Path], versions: int) -> tuple[str, list[str]]:
    """A new registered model with ``versions`` versions."""
    name = f"release-{uuid.uuid4().hex[:8]}"
    return name, [release.register(name, files[i % len(files)]) for i in range(versions)]


def _moves(history: list[AliasChange]) -> list[tuple]:
    return [(c.alias, c.previous, c.version, c.actor, c.reason) for c in history]


def test_the_history_records_every_alias_change_in_order(model_registry) -> None:
    release, _, files = model_registry
    name, (v1, v2, v3) = _fresh_model(release, files, 3)
    release.set_alias(name, PROD_ALIAS, v1, "alice", "first model")
    release.start_canary(name, v2, 0.25, "bob")
    release.promote(name, v2, "ci", "canary held")
    release.start_canary(name, v3, 0.1, "carol", "try v3")
    release.end_canary(name, "carol", "not now")
    history = release.history(name)
    assert _moves(history) == [
        (PROD_ALIAS, None, v1, "alice", "first model"),
        (CANARY_ALIAS, None, v2, "bob", "canary on 25% of requests"),
        (PROD_ALIAS, v1, v2, "ci", "canary held"),
        (CANARY_ALIAS, v2, None, "ci", f"v{v2} promoted"),
        (CANARY_ALIAS, None, v3, "carol", "try v3"),
        (CANARY_ALIAS, v3, None, "carol", "not now"),
    ]
    assert [c.at_ms for c in history] == sorted(c.at_ms for c in history)
    assert abs(history[-1].at_ms - time.time() * 1000) < 60_000
    assert release.aliases(name) == {PROD_ALIAS: v2}
    assert release.client.get_registered_model(name).tags[CANARY_SHARE_TAG] == "0"


def test_rollback_points_prod_at_the_version_it_replaced_and_ends_the_canary(model_registry) -> None:
    release, _, files = model_registry
    name, (v1, v2, v3) = _fresh_model(release, files, 3)
    release.set_alias(name, PROD_ALIAS, v1)
    release.promote(name, v2)
    release.start_canary(name, v3, 0.5)
    assert release.rollback(name, "dave", "v2 pages on-call") == v1
    assert release.aliases(name) == {PROD_ALIAS: v1}
    assert release.client.get_registered_model(name).tags[CANARY_SHARE_TAG] == "0"
    assert _moves(release.history(name))[-2:] == [
        (PROD_ALIAS, v2, v1, "dave", "v2 pages on-call"),
        (CANARY_ALIAS, v3, None, "dave", "rollback"),
    ]
    # A rollback is itself a move of prod: a second one undoes the first (as `kubectl rollout undo` does).
    assert release.rollback(name, "dave") == v2
    assert release.aliases(name) == {PROD_ALIAS: v2}


def test_rollback_without_an_earlier_prod_and_unknown_names_are_clear_errors(model_registry) -> None:
    release, _, files = model_registry
    name, (v1, v2) = _fresh_model(release, files, 2)
    with pytest.raises(ReleaseError, match="nothing to roll back to"):
        release.rollback(name)
    release.set_alias(name, PROD_ALIAS, v1)
    release.start_canary(name, v2, 0.5)
    with pytest.raises(ReleaseError, match="nothing to roll back to"):
        release.rollback(name)
    assert release.aliases(name) == {PROD_ALIAS: v1, CANARY_ALIAS: v2}, "a refused rollback changes nothing"
    with pytest.raises(ReleaseError, match="has no version '99'"):
        release.set_alias(name, PROD_ALIAS, "99")
    for step in (release.history, release.rollback, release.end_canary):
        with pytest.raises(ReleaseError, match="no registered model 'no-such-model'"):
            step("no-such-model")


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch):
    """Runs ``loopline`` commands in process with the given LOOPLINE_ environment; (exit code, output, exception)."""
    runner = CliRunner()
    # The CLI's console was sized at import; a wide one keeps table rows on one line each.
    monkeypatch.setattr(context, "console", Console(width=400, highlight=False))

    def run(args: list[str], env: dict[str, str]) -> tuple[int, str, BaseException | None]:
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        result = runner.invoke(cli.app, args)
        return result.exit_code, result.output, result.exception

    return run


def test_cli_release_history_and_rollback(model_registry, run_cli) -> None:
    release, env, files = model_registry
    name = f"cli-{uuid.uuid4().hex[:8]}"
    env = {**env, "LOOPLINE_SERVING__MODEL_NAME": name}
    code, output, _ = run_cli(["models", "register", str(files[0]), "--alias", "prod"], env)
    assert code == 0 and output.endswith(f"registered {name} v1 as prod\n"), output
    assert run_cli(["models", "register", str(files[1])], env)[0] == 0
    code, output, _ = run_cli(["release", "2", "--canary", "5"], env)
    assert code == 0 and f"{name} v2 is the canary on 5 % of requests" in output
    assert release.aliases(name) == {PROD_ALIAS: "1", CANARY_ALIAS: "2"}
    assert release.client.get_registered_model(name).tags[CANARY_SHARE_TAG] == "0.05"
    assert run_cli(["models", "promote", "2", "--reason", "looked fine"], env)[0] == 0

    code, output, _ = run_cli(["rollback", "--reason", "alerts fired"], env)
    assert (code, output) == (0, f"{name} prod → v1 (rolled back)\n")
    assert release.aliases(name) == {PROD_ALIAS: "1"}

    code, output, _ = run_cli(["models", "history"], env)
    assert code == 0
    rows = [line for line in output.splitlines() if "(loopline CLI)" in line]
    expected = [
        ("prod", "—", "v1", "registered with --alias"),
        ("canary", "—", "v2", "released as a canary on 5 % of requests"),
        ("prod", "v1", "v2", "looked fine"),
        ("canary", "v2", "—", "v2 promoted"),
        ("prod", "v2", "v1", "alerts fired"),
    ]
    assert len(rows) == len(expected), output
    for row, (alias, before, after, why) in zip(rows, expected, strict=True):
        cells = [cell.strip() for cell in row.split("│")]
        assert cells[3:7] == [alias, before, after, why], row

    # A model the registry does not know is a user error (one line from `loopline`), not a trace.
    code, _, error = run_cli(["rollback", "--name", "never-registered"], env)
    assert code == 1 and isinstance(error, ReleaseError) and isinstance(error, cli.USER_ERRORS)


# --- the controller against a real scorer --------------------------------------------------------------------


def _write_slow_model(path: Path, inputs: list[str], width: int = 1024, repeats: int = 500) -> Path:
    """A model that multiplies a ``width``-wide hidden row by the same matrix ``repeats`` times: ~30 ms per row on
    one of this machine's cores (60 repeats took 3.5 ms, too close to prod on a faster CI machine) from a 4 MB file
    (one shared weight), scores near 0.5."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {
        "w_in": rng.normal(0, 0.01, (len(inputs), width)),
        "w": rng.normal(0, 1, (width, width)) / np.sqrt(width),
        "w_out": np.full((width, 1), 0.01),
    }
    initializers = [numpy_helper.from_array(w.astype(np.float32), key) for key, w in weights.items()]
    initializers.append(numpy_helper.from_array(np.asarray([1], dtype=np.int64), "axes"))
    nodes = [helper.make_node("MatMul", [INPUT_NAME, "w_in"], ["h0"])]
    nodes += [helper.make_node("MatMul", [f"h{i}", "w"], [f"h{i + 1}"]) for i in range(repeats)]
    nodes += [
        helper.make_node("MatMul", [f"h{repeats}", "w_out"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["p"]),
        helper.make_node("Squeeze", ["p", "axes"], [OUTPUT_NAME]),
    ]
    graph = helper.make_graph(
        nodes,
        "slow_scorer",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", len(inputs)])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch"])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="loopline-tests")
    model.ir_version = 8
    helper.set_model_props(model, features_metadata([ModelInput(name) for name in inputs]))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model files: two healthy logistic regressions, one that scores NaN for every row, one slow one."""
    folder = tmp_path_factory.mktemp("release-models")
    return {
        "a": write_linear_model(folder / "a.onnx", INPUTS, np.array([0.3, 0.002, -0.01, 0.004]), -2.0),
        "b": write_linear_model(folder / "b.onnx", INPUTS, np.array([0.1, 0.001, 0.02, -0.003]), 0.5),
        "nan": write_linear_model(folder / "nan.onnx", INPUTS, np.zeros(4), math.nan),
        "slow": _write_slow_model(folder / "slow.onnx", INPUTS),
    }


@pytest.fixture
def served(applied: Settings) -> tuple[Settings, ModelRelease]:
    """Serving settings for a model name of this test's own, polling the registry every 0.1 s; its release handle."""
    serving = applied.serving.model_copy(update={"model_name": f"release-{uuid.uuid4().hex[:8]}", "model_registry_poll_s": 0.1})
    settings = applied.model_copy(update={"serving": serving})
    return settings, model_release(settings)


def _serving(url: str) -> dict[str, str]:
    """The version the scorer serves under each alias."""
    return {alias: m["version"] for alias, m in requests.get(f"{url}/v1/models/status", timeout=5).json()["models"].items()}


def _score(url: str, n: int) -> list[tuple[int, str | None]]:
    """Send ``n`` score requests one after another: (HTTP status, model version) of each."""
    with requests.Session() as session:
        replies = [session.post(f"{url}/v1/score", json=score_request(USER, float(i % 300)), timeout=10) for i in range(n)]
    return [(r.status_code, r.json().get("model_version")) for r in replies]


def _until_both_arms_served(url: str, canary: str, prod: str, n: int, sent: list) -> bool:
    """Score until the scorer's metrics show ``n`` requests on each arm (``sent`` keeps every reply)."""

    def enough() -> bool:
        sent.extend(_score(url, 10))
        counts = scrape([f"{url}/metrics"], {CANARY_ALIAS: canary, PROD_ALIAS: prod})
        return min(c.ok + c.errors for c in counts.values()) >= n

    return wait_until(enough, 120, 0)


def _start_canary_behind_a_busy_prod(release: ModelRelease, name: str, url: str, prod: str, canary: str) -> None:
    """Prod serves requests first (they must not count in the comparison), then the canary takes half the traffic."""
    assert wait_until(lambda: _serving(url) == {PROD_ALIAS: prod}, 30, 0.05), "prod never served"
    assert {status for status, _ in _score(url, 50)} == {200}
    release.start_canary(name, canary, 0.5, "test")
    assert wait_until(lambda: _serving(url) == {PROD_ALIAS: prod, CANARY_ALIAS: canary}, 60, 0.05), "the canary never served"


@pytest.mark.parametrize("kind, why", [("nan", "error rate"), ("slow", "p99")])
def test_a_failing_or_slow_canary_is_rolled_back_by_the_controller(served, models, kind: str, why: str) -> None:
    settings, release = served
    name = settings.serving.model_name
    prod, canary = release.register(name, models["a"]), release.register(name, models[kind])
    release.set_alias(name, PROD_ALIAS, prod, "test")
    # It can never be promoted here (the minimum watch is long): the controller watches until it rolls it back.
    policy = ReleasePolicy(min_watch_s=600, max_watch_s=3_600, min_requests=40, max_latency_ratio=1.5)
    scorer = build_scorer(settings)
    with serving_doors(settings, scorer, model_watcher(settings, scorer).run) as (url, _):
        _start_canary_behind_a_busy_prod(release, name, url, prod, canary)
        controller = ReleaseController(release, name, policy, [f"{url}/metrics"], examples=lambda since_ms: [])
        sent: list[tuple[int, str | None]] = []
        assert _until_both_arms_served(url, canary, prod, policy.min_requests, sent)

        canary_stats, prod_stats, _ = controller.observe()
        # Like for like: both arms count from the canary's start, so prod's 50 earlier requests are not in it.
        assert prod_stats.requests == sum(version == prod for _, version in sent)
        assert prod_stats.errors == 0 and prod_stats.p99_s is not None
        if kind == "nan":  # every canary request fails (HTTP 500, no version), and each is counted as its error
            assert canary_stats.errors == canary_stats.requests == sum(status == 500 for status, _ in sent)
        else:  # tens of ms of model per canary request against prod's ~2 ms, whatever the machine's speed
            assert canary_stats.errors == 0 and canary_stats.p99_s > prod_stats.p99_s
        decisions: list[Decision] = []

        def rolled_back() -> bool:
            decisions.append(controller.step()[0])
            if decisions[-1].action == "wait":  # a p99 over few requests can be prod's one stall on a loaded machine: more
                _score(url, 20)
            return decisions[-1].action == "rollback"

        assert wait_until(rolled_back, 120, 0), decisions[-1]
        decision = decisions[-1]
        assert why in decision.reason, decisions
        if kind == "nan":
            assert len(decisions) == 1, "every canary request failed: rolled back at the first look"

        assert release.aliases(name) == {PROD_ALIAS: prod}
        assert _moves(release.history(name))[-1] == (CANARY_ALIAS, canary, None, ACTOR, decision.reason)
        assert wait_until(lambda: _serving(url) == {PROD_ALIAS: prod}, 30, 0.05), "the canary kept serving"
        assert set(_score(url, 30)) == {(200, prod)}
        assert controller.step() is None, "no canary is out any more"


def test_a_healthy_canary_is_promoted_by_release_watch(served, models, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, release = served
    name = settings.serving.model_name
    prod, canary = release.register(name, models["a"]), release.register(name, models["b"])
    release.set_alias(name, PROD_ALIAS, prod, "test")
    scorer = build_scorer(settings)
    with serving_doors(settings, scorer, model_watcher(settings, scorer).run) as (url, _):
        _start_canary_behind_a_busy_prod(release, name, url, prod, canary)
        sent: list[tuple[int, str | None]] = []
        assert _until_both_arms_served(url, canary, prod, 100, sent)
        assert {status for status, _ in sent} == {200}
        # Latency decides nothing here (the slow canary above is judged by it): both arms run a model of the same cost
        # on one scorer, but on a shared machine a stall of tens of ms lands on either arm by chance, and a p99 over
        # 100 requests is their second slowest.
        watch = settings.release.model_copy(
            update={
                "metrics_urls": [f"{url}/metrics"],
                "poll_s": 0.2,
                "min_watch_s": 2.0,
                "min_requests": 100,
                "max_latency_ratio": 100.0,
            }
        )
        monkeypatch.setattr(context, "settings", lambda: settings.model_copy(update={"release": watch}))
        code, output, error = run_cli(["release", "watch"], {})
        assert code == 0, error
        looks = output.strip().splitlines()
        assert f"canary v{canary}:" in looks[-1] and "→ promote:" in looks[-1], output
        assert all("→ wait:" in line for line in looks[:-1]), output

        assert release.aliases(name) == {PROD_ALIAS: canary}
        promoted, ended = _moves(release.history(name))[-2:]
        assert promoted[:4] == (PROD_ALIAS, prod, canary, ACTOR) and "requests, error rate 0.00%" in promoted[4]
        assert ended == (CANARY_ALIAS, canary, None, ACTOR, f"v{canary} promoted")
        # The minimum watch, on the registry's own clock: from the canary's start to its promotion.
        started_ms = next(c.at_ms for c in release.history(name) if (c.alias, c.version) == (CANARY_ALIAS, canary))
        promoted_ms = next(c.at_ms for c in release.history(name) if (c.alias, c.version) == (PROD_ALIAS, canary))
        assert promoted_ms - started_ms >= 2_000, "promoted before the minimum watch"
        assert wait_until(lambda: _serving(url) == {PROD_ALIAS: canary}, 30, 0.05), "the promoted version never took prod"
        assert set(_score(url, 30)) == {(200, canary)}


def test_a_canary_worse_on_labeled_feedback_is_rolled_back(served, models) -> None:
    """Quality from real examples on Kafka, through the controller the CLI builds; examples of another model with the
    same version numbers, and of prod before the canary started, do not count."""
    settings, release = served
    name = settings.serving.model_name
    prod, canary = release.register(name, models["a"]), release.register(name, models["b"])
    release.set_alias(name, PROD_ALIAS, prod, "test")
    before = int(time.time() * 1000) - 60_000
    release.start_canary(name, canary, 0.5, "test")
    since = int(time.time() * 1000)
    topic = TopicSpec(f"test.examples.{uuid.uuid4().hex[:6]}", TrainingExample, key="event_id", partitions=3, retention_ms=DAY_MS)
    bootstrap = settings.kafka.bootstrap
    apply_topics(bootstrap, [topic])
    rng = np.random.default_rng(3)

    def examples(model: str, version: str, at_ms: int, n: int, auc: str) -> list[TrainingExample]:
        labels = rng.random(n) < 0.3
        noise = rng.random(n)
        scores = {"good": 0.6 * labels + 0.4 * noise, "bad": 0.6 * ~labels + 0.4 * noise}[auc]
        return [
            TrainingExample(
                schema_version=TrainingExample.SCHEMA_VERSION,
                event_id=f"e-{uuid.uuid4()}",
                request_id=f"r-{uuid.uuid4()}",
                entity_keys={"user_id": USER},
                features={},
                model_name=model,
                model_version=version,
                score=float(score),
                label=float(label),
                requested_at_ms=at_ms,
                predicted_at_ms=at_ms,
                label_time_ms=at_ms + 1,
                joined_at_ms=at_ms + 2,
            )
            for score, label in zip(scores, labels, strict=True)
        ]

    logged = (
        examples(name, prod, since + 10, 60, "good")
        + examples(name, canary, since + 10, 60, "bad")
        + examples("another-model", canary, since + 10, 200, "good")
        + examples(name, prod, before, 200, "bad")
    )
    EventProducer(bootstrap).publish(Emitted(topic.name, e.event_id, encode(e), e.predicted_at_ms, e) for e in logged)

    # Nothing listens on the metrics URL: a scorer that does not answer adds nothing, and quality still decides.
    policy = settings.release.model_copy(
        update={"metrics_urls": [f"http://127.0.0.1:{free_port()}/metrics"], "min_watch_s": 0, "min_labels": 50}
    )
    configured = settings.model_copy(
        update={"release": policy, "feedback": settings.feedback.model_copy(update={"examples_topic": topic.name})}
    )
    decision, canary_stats, prod_stats = release_controller(configured).step()
    assert (canary_stats.labeled, prod_stats.labeled) == (60, 60)
    assert canary_stats.quality < 0.2 < 0.8 < prod_stats.quality and canary_stats.requests == prod_stats.requests == 0
    assert decision.action == "rollback" and "AUC" in decision.reason
    assert release.aliases(name) == {PROD_ALIAS: prod}
    assert _moves(release.history(name))[-1] == (CANARY_ALIAS, canary, None, ACTOR, decision.reason)


# --- a model trained elsewhere ---------------------------------------------------------------------------------


def _trained_elsewhere(path: Path, inputs: list[str], flaw: str | None = None) -> Path:
    """A model as a team trains it outside Loopline: plain torch on its own rows, exported to ONNX by torch, the
    contract's input names and metadata set by hand (the guide's recipe). With a ``flaw``: "logits" forgets the sigmoid,
    "nan" lets a missing input through as NaN, "text" says in its metadata that its last input is a text."""
    import onnx
    import torch

    torch.manual_seed(0)
    rows = torch.rand(512, len(inputs)) * torch.tensor([20.0, 2_000.0, 600.0, 500.0])
    labels = (rows[:, 0] > 12).float()
    net = torch.nn.Sequential(torch.nn.Linear(len(inputs), 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    scale = rows.std(0)
    for _ in range(100):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(rows / scale).squeeze(1), labels)
        loss.backward()
        optimizer.step()

    class Scorer(torch.nn.Module):
        def forward(self, features: torch.Tensor) -> torch.Tensor:
            z = net((features if flaw == "nan" else torch.nan_to_num(features)) / scale).squeeze(1)
            return z if flaw == "logits" else torch.sigmoid(z)

    torch.onnx.export(
        Scorer().eval(),
        (rows[:2],),
        str(path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_shapes=({0: torch.export.Dim("batch")},),
        dynamo=True,
        external_data=False,
        verbose=False,
    )
    model = onnx.load(str(path))
    kinds = ["number"] * (len(inputs) - 1) + ["text" if flaw == "text" else "number"]
    onnx.helper.set_model_props(
        model, features_metadata([ModelInput(name, kind) for name, kind in zip(inputs, kinds, strict=True)])
    )
    onnx.save(model, str(path))
    return path


def test_a_model_trained_elsewhere_is_checked_then_canaried_logged_promoted_and_rolled_back_like_a_trained_one(
    served, models, run_cli, tmp_path: Path
) -> None:
    settings, release = served
    name = settings.serving.model_name
    env = {k: v for k, v in settings_environment(settings).items() if k.startswith("LOOPLINE_")}  # the CLI on these settings
    prod = release.register(name, models["a"])
    release.set_alias(name, PROD_ALIAS, prod, "test")

    # Refused, each with its reason, and nothing registered: an input the project does not declare, and scores that
    # are no probabilities for the project's binary label.
    def refused(path: Path) -> str:
        code, output, _ = run_cli(["models", "register", str(path)], env)
        assert code == 2, output
        return " ".join(output.replace("│", " ").split())  # the error's words, out of its box

    assert "declares no request:amount_eur" in refused(
        _trained_elsewhere(tmp_path / "misnamed.onnx", [*INPUTS[:3], "request:amount_eur"])
    )
    assert "scores are not probabilities" in refused(_trained_elsewhere(tmp_path / "logits.onnx", INPUTS, flaw="logits"))
    assert "must handle NaN inputs" in refused(_trained_elsewhere(tmp_path / "nan.onnx", INPUTS, flaw="nan"))
    assert "its 'features' input must be float32 [batch, 3]" in refused(
        _trained_elsewhere(tmp_path / "text.onnx", INPUTS, flaw="text")
    )
    assert [str(v.version) for v in release.client.search_model_versions(f"name='{name}'")] == [prod], "nothing registered"

    code, output, error = run_cli(["models", "register", str(_trained_elsewhere(tmp_path / "elsewhere.onnx", INPUTS))], env)
    assert code == 0 and f"registered {name} v2" in output and "request:amount (number)" in output, (output, error)
    canary = "2"
    scorer = build_scorer(settings)
    predictions = LogReader(settings.kafka.bootstrap, PREDICTIONS.name, from_end=True)
    try:
        with serving_doors(settings, scorer, model_watcher(settings, scorer).run) as (url, _):
            assert wait_until(lambda: _serving(url) == {PROD_ALIAS: prod}, 30, 0.05), "prod never served"
            code, output, error = run_cli(["release", canary, "--canary", "50"], env)  # as the guide releases it
            assert code == 0 and f"v{canary} is the canary on 50 % of requests" in output, (output, error)
            assert wait_until(lambda: _serving(url) == {PROD_ALIAS: prod, CANARY_ALIAS: canary}, 60, 0.05), (
                "the canary never served"
            )
            sent: list[tuple[int, str | None]] = []
            assert _until_both_arms_served(url, canary, prod, 20, sent)
            assert {status for status, _ in sent} == {200}

            # Logged as a trained model's predictions are: the version, and the exact features it was given.
            def logged() -> list[PredictionRecord]:
                return [r for r in predictions.records(PredictionRecord) if r.model_name == name and r.model_version == canary]

            assert wait_until(lambda: len(logged()) > 0, 30, 0.2), "the canary's predictions were not logged"
            assert all(set(r.features) == set(INPUTS) and 0 <= r.score <= 1 for r in logged())

            # Promoted, then rolled back, each in one command.
            assert run_cli(["models", "promote", canary, "--reason", "held as a canary"], env)[0] == 0
            assert wait_until(lambda: _serving(url) == {PROD_ALIAS: canary}, 30, 0.05), "the promoted version never took prod"
            assert set(_score(url, 20)) == {(200, canary)}
            code, output, error = run_cli(["rollback", "--reason", "trained elsewhere, tried"], env)
            assert code == 0, (output, error)
            assert release.aliases(name) == {PROD_ALIAS: prod}
            assert wait_until(lambda: _serving(url) == {PROD_ALIAS: prod}, 30, 0.05), "the rolled-back canary kept serving"
            assert set(_score(url, 20)) == {(200, prod)}
    finally:
        predictions.close()
