"""The Helm chart's workloads rehearsed on this machine against the session's stack (issue 17, part 4): the chart is
rendered once with values that name the stack (its Kafka, Redis, Prometheus, free ports), and each workload's
container runs here as a process (``infra/chart_rehearsal.py``) with its command, args, env, Secret and ConfigMap
values and mounted files as rendered. The one translation is the layout of paths (``_layout`` below and each pod's
volumes), so a typo in the chart fails here:

- the apply hook Job exits 0, the Feast registry it wrote lists Loopline's views, the topics are on the stack's Kafka;
- the scorer's startup (gRPC), readiness and liveness probes answer and it scores over HTTP with the Secret's token;
  the Kafka door (a StatefulSet) logs each request's prediction, and a replacement of a pod killed mid-transaction
  fences that transaction at once;
- each FlinkDeployment's entry class, jar and args, run as the operator runs them (``flink run`` to a session cluster),
  reach RUNNING;
- the monitor's and the dashboard's probes answer on their ports; the retrain trigger stays up until SIGTERM.
"""

from __future__ import annotations

import collections
import copy
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from feature_store.config import feature_store
from feature_store.online_write import FeatureRow, OnlineWriter
from infra.chart_rehearsal import Layout, PodProcess, RehearsalError, flink_job_argv, lay_out
from infra.flink_cluster import cancel_job, list_jobs, pyflink_home, submitted_job_id
from infra.helm_chart import render
from infra.jars import flink_connector_jar
from infra.service import free_ports, wait_until
from infra.settings import FlinkSettings
from loopline.components import feature_operators_jar, flink_session, joiner_operators_jar, project
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from online.kafka_transactions import transaction_timeout_ms
from online.settings import ServingSettings
from schemas.records import PredictionRecord, ScoreRequest
from schemas.topics import PREDICTIONS, SCORE_REQUESTS, TOPICS
from schemas.validation import encode
from tests.support.kafka_log import LogReader, open_transaction_partitions, start_group_at_end
from tests.support.scoring import score_request

pytestmark = pytest.mark.timeout(600)

VIEW = "user_transaction_features"
INPUTS = [f"{VIEW}:txn_count_5m", f"{VIEW}:amount_sum_1h", "request:amount"]
WEIGHTS, BIAS = np.array([0.3, 0.002, 0.004], dtype=np.float32), -2.0
FLINK_DEPLOYMENTS = ["loopline-feature-job", "loopline-feedback-joiner"]


def _layout(flink_home: Path, settings: Settings) -> Layout:
    """The images' folders here: their venv is this one (the images install its exact versions), Flink is
    ``flink_home`` (laid out as the Flink image has it), the Flink image's jar cache is the stack's, the project they
    bake is the settings' (as ``loopline images build`` stages it)."""
    return Layout(
        {
            "/opt/loopline/venv": Path(sys.prefix),
            "/opt/flink": flink_home,
            "/opt/loopline/jars": settings.resolved_jars_dir,
            "/opt/loopline/project": settings.project_path,
        }
    )


def _flink_image_home(folder: Path, settings: Settings) -> Path:
    """/opt/flink as the loopline-flink image has it: PyFlink's distribution, with the Kafka connector and Loopline's
    operators in lib (infra/images/flink.Dockerfile). bin/ is a copy (Flink's scripts take their home from their own
    real path); the other parts are folders of links to the distribution's files (Flink lists them without following
    a linked folder); log/ is written."""
    distribution = pyflink_home()
    shutil.copytree(distribution / "bin", folder / "bin")
    for part in ("conf", "opt", "plugins", "lib"):
        shutil.copytree(distribution / part, folder / part, copy_function=os.symlink)
    (folder / "log").mkdir()
    for jar in (flink_connector_jar(settings.resolved_jars_dir), feature_operators_jar(settings), joiner_operators_jar(settings)):
        (folder / "lib" / jar.name).unlink(missing_ok=True)
        (folder / "lib" / jar.name).symlink_to(jar)
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rehearsal's folder: a folder per pod, and ``shared``, the chart's shared volume."""
    return tmp_path_factory.mktemp("rehearsal")


@pytest.fixture(scope="module")
def chart(helm: Path, settings: Settings, stack, root: Path) -> list[dict]:
    """The chart rendered once, its addresses the stack's (the chart's own values): Kafka's brokers, Redis, Prometheus,
    free ports for the pods' listeners (every pod here shares one network)."""
    http, grpc_port, dashboard, monitor = free_ports(4)
    values = {
        "kafka": {"strimzi": False, "bootstrapServers": settings.kafka.bootstrap.split(",")},
        "redis": {"mode": "standalone", "nodes": [f"{settings.redis.host}:{settings.redis.port}"]},
        "prometheus": {"host": settings.prometheus.host, "port": settings.prometheus.port},
        "scorer": {"httpPort": http, "grpcPort": grpc_port},
        "dashboard": {"port": dashboard},
        # A long broker timeout makes the door's transaction timeout 75 s: the fencing test tells a replacement's fence
        # from the broker's timeout by it.
        "settings": {"monitor": {"metrics_port": monitor}, "serving": {"kafka_broker_timeout_s": 30}},
    }
    (root / "values.yaml").write_text(yaml.safe_dump(values))
    return render(["values.yaml", root / "values.yaml"], helm=helm)


class Pods:
    """Lays out the chart's workloads under one folder, their shared volume (the chart's claim) in it; stops every
    process it started."""

    def __init__(self, chart: list[dict], root: Path, layout: Layout) -> None:
        self.chart, self.root, self.layout = chart, root, layout
        (claim,) = [o["metadata"]["name"] for o in chart if o["kind"] == "PersistentVolumeClaim"]
        self.claims = {claim: root / "shared"}
        self.started: list[PodProcess] = []

    def pod(self, kind: str, name: str, objects: list[dict] | None = None) -> PodProcess:
        pod = lay_out(objects or self.chart, kind, name, self.layout, self.root / name, self.claims)
        self.started.append(pod)
        return pod

    def stop_all(self) -> None:
        for pod in self.started:
            pod.stop(10)


@pytest.fixture(scope="module")
def pods(chart: list[dict], settings: Settings, root: Path) -> Iterator[Pods]:
    pods = Pods(chart, root, _layout(_flink_image_home(root / "opt-flink", settings), settings))
    yield pods
    pods.stop_all()


@pytest.fixture(scope="module")
def session_cluster(settings: Settings, stack) -> Iterator[tuple[str, Future]]:
    """A Flink session cluster (one TaskManager, a slot per FlinkDeployment), starting in the background: its address
    and the start's future. Stopped at the end."""
    rest, rpc = free_ports(2)
    session = flink_session(
        settings.model_copy(update={"flink": FlinkSettings(rest_port=rest, rpc_port=rpc)}), taskmanagers=1, slots=2
    )
    with ThreadPoolExecutor(1) as starting:
        up = starting.submit(session.up)
        try:
            yield session.address, up
        finally:
            up.result()
            session.down()


@pytest.fixture(scope="module")
def model_registration(pods: Pods, tmp_path_factory: pytest.TempPathFactory) -> PodProcess:
    """`loopline models register --alias prod` of a model in the scorer pod's environment (the chart's model
    registry), started in the background: the scorer serves the registry's prod version."""
    model = write_linear_model(tmp_path_factory.mktemp("model") / "fraud.onnx", INPUTS, WEIGHTS, BIAS)
    return pods.pod("Deployment", "loopline-scorer").start(["loopline", "models", "register", str(model), "--alias", "prod"])


@pytest.fixture(scope="module")
def hook(pods: Pods, session_cluster, model_registration: PodProcess) -> str:
    """The apply hook Job run to its end (before every workload, as helm runs a pre-install hook): its output. The
    session cluster and the model's registration start beside it."""
    return pods.pod("Job", "loopline-apply").run(timeout_s=240)


@pytest.fixture(scope="module")
def running(
    hook: str, model_registration: PodProcess, pods: Pods, session_cluster: tuple[str, Future], applied: Settings
) -> Iterator[dict]:
    """Every long-running workload started at once, after the hook: the scorer (once its model is registered), the
    monitor, the dashboard, the retrain trigger, and both Flink jobs' submissions."""
    assert model_registration.process.wait(180) == 0, model_registration.output()
    started = {
        name: pods.pod("Deployment", name).start()
        for name in ("loopline-scorer", "loopline-monitor", "loopline-dashboard", "loopline-retrain-trigger")
    }
    jobmanager, up = session_cluster
    with ThreadPoolExecutor(len(FLINK_DEPLOYMENTS)) as submitting:

        def submit(name: str) -> str:
            up.result()
            flink = pods.pod("FlinkDeployment", name)
            output = flink.run(300, flink_job_argv(pods.chart, name, flink, jobmanager))
            assert submitted_job_id(output), output
            return submitted_job_id(output)

        started |= {name: submitting.submit(submit, name) for name in FLINK_DEPLOYMENTS}
        yield started


def test_the_apply_hook_job_applies_the_views_and_topics(hook: str, pods: Pods, applied: Settings) -> None:
    registry = pods.claims["loopline-shared"] / "feast" / "registry.db"
    assert registry.is_file(), f"the hook wrote no Feast registry where the chart's settings name it: {hook}"
    written = feature_store(registry, applied.redis_connection, applied.repo_path)
    expected = feature_store(applied.feast_registry_path, applied.redis_connection, applied.repo_path)
    names = lambda store: sorted(v.name for v in [*store.list_feature_views(), *store.list_stream_feature_views()])  # noqa: E731
    assert names(written) == names(expected) and VIEW in names(written)
    topics = AdminClient({"bootstrap.servers": applied.kafka.bootstrap}).list_topics(timeout=10).topics
    wanted = [*TOPICS, *project(applied).topics]  # Loopline's own, and the project's the image bakes
    assert {t.name for t in wanted} <= set(topics)
    assert all(t.name in hook for t in wanted), f"the hook's topics apply reports every topic: {hook}"


def test_the_scorer_answers_its_probes_and_scores_with_the_secrets_token(running: dict, pods: Pods, applied: Settings) -> None:
    scorer: PodProcess = running["loopline-scorer"]
    scorer.wait_for(lambda: scorer.probe("startupProbe"), "its gRPC startup probe (health SERVING)", 180)
    scorer.wait_for(lambda: scorer.probe("readinessProbe") and scorer.probe("livenessProbe"), "its readiness and liveness", 30)
    user = f"rehearsal-{uuid.uuid4().hex[:8]}"
    OnlineWriter(applied.feast_registry_path, applied.redis_connection, applied.repo_path).write(
        [FeatureRow(VIEW, user, int(time.time() * 1_000_000), {"txn_count_5m": 4, "amount_sum_1h": 310.5})]
    )
    (secret,) = [o for o in pods.chart if o["kind"] == "Secret"]
    url = f"http://127.0.0.1:{scorer.ports['http']}/v1/score"
    request = score_request(user, 120.0)
    assert requests.post(url, json=request, timeout=10).status_code == 401, "the chart's scorer asks for its token"
    replies = []

    def scored_with_features() -> bool:
        # A first read may outlast the fetch budget on a busy machine (then defaults, flagged): the next one may not.
        reply = requests.post(
            url,
            json=request | {"request_id": str(uuid.uuid4())},
            headers={"Authorization": f"Bearer {secret['stringData']['scorer-token']}"},
            timeout=10,
        )
        assert reply.status_code == 200, reply.text
        replies.append(PredictionRecord.model_validate_json(reply.content))
        return not replies[-1].defaulted_features

    assert wait_until(scored_with_features, 30, 0.5), replies[-1].model_dump(
        include={"features", "defaulted_features", "stage_latency_ms", "feature_row_times_ms"}
    )
    expected = 1 / (1 + np.exp(-(np.dot(np.array([4, 310.5, 120.0], dtype=np.float32), WEIGHTS) + BIAS)))
    assert replies[-1].score == pytest.approx(float(expected), rel=1e-5)


def test_a_replaced_kafka_door_pod_fences_its_predecessors_open_transaction(running: dict, pods: Pods, applied: Settings) -> None:
    """The Kafka door consumes requests and logs their predictions; killed (kill -9) with a transaction open, its
    replacement (the StatefulSet's pod of the same ordinal, so the same transactional id) aborts that transaction as it
    starts: read_committed readers go on as soon as it is up, long before the broker would time the transaction out
    (the rehearsal's broker timeout makes that 75 s), and every request has exactly one prediction."""
    # Both doors listen on the chart's scorer.httpPort (each in a pod of its own): here one after the other.
    running["loopline-scorer"].stop()
    (config,) = [o for o in pods.chart if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "loopline-settings"]
    serving = ServingSettings.model_validate(yaml.safe_load(config["data"]["loopline.yaml"])["serving"])
    timeout_s = transaction_timeout_ms(serving.kafka_commit_interval_ms / 1000, serving.kafka_broker_timeout_s) / 1000
    start_group_at_end(applied.kafka.bootstrap, serving.kafka_group_id, SCORE_REQUESTS.name)
    log = LogReader(applied.kafka.bootstrap, PREDICTIONS.name, from_end=True)
    run, sent, stop = uuid.uuid4().hex[:8], [], threading.Event()

    def send() -> None:  # a steady 100 requests/s, each its own id, until stopped
        producer = Producer({"bootstrap.servers": applied.kafka.bootstrap, "linger.ms": 5})
        while not stop.is_set():
            request = score_request(f"fence-{len(sent) % 20}", 50.0) | {"request_id": f"fence-{run}-{len(sent)}"}
            producer.produce(SCORE_REQUESTS.name, key=request["request_id"], value=encode(ScoreRequest.model_validate(request)))
            sent.append(request["request_id"])
            producer.poll(0)
            time.sleep(0.01)
        producer.flush(10)

    def predicted() -> set[str]:
        return {r.request_id for r in log.records(PredictionRecord) if r.request_id.startswith(f"fence-{run}-")}

    def started_door() -> PodProcess:
        door = pods.pod("StatefulSet", "loopline-scorer-kafka").start()
        door.wait_for(lambda: door.probe("startupProbe") and door.probe("livenessProbe"), "its startup and liveness probes", 180)
        return door

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        door = started_door()
        for _ in range(8):  # until a kill finds a transaction open (between two commits none is)
            before = len(predicted())
            door.wait_for(lambda n=before + 50: len(predicted()) >= n, "predictions for the requests it was sent", 90)
            # Kill the moment a transaction is seen open: a kill at a random moment can fall between commits each time.
            wait_until(lambda: open_transaction_partitions(applied.kafka.bootstrap, PREDICTIONS.name), 5, 0.001)
            os.killpg(door.process.pid, signal.SIGKILL)
            door.process.wait(10)
            killed_at = time.monotonic()
            left_open = open_transaction_partitions(applied.kafka.bootstrap, PREDICTIONS.name)
            door = started_door()
            if left_open:
                break
        assert left_open, "no kill of eight found the door mid-transaction"
        up_at = time.monotonic()
        fenced = wait_until(lambda: not open_transaction_partitions(applied.kafka.bootstrap, PREDICTIONS.name), 10, 0.2)
        assert fenced and time.monotonic() - killed_at < timeout_s, (
            f"the open transaction held readers {time.monotonic() - up_at:.1f} s after the replacement was up "
            f"({time.monotonic() - killed_at:.1f} s after the kill; the broker's timeout is {timeout_s:.0f} s)"
        )
        stop.set()
        sender.join(30)
        door.wait_for(lambda: predicted() >= set(sent), "a prediction for every request sent", 90)
        records = log.records(PredictionRecord)
    finally:
        stop.set()
        log.close()
    counts = collections.Counter(r.request_id for r in records if r.request_id in set(sent))
    assert set(counts) == set(sent) and max(counts.values()) == 1, counts.most_common(3)


@pytest.mark.parametrize("name", FLINK_DEPLOYMENTS)
def test_each_flink_deployment_reaches_running(running: dict, session_cluster: tuple[str, Future], name: str) -> None:
    jobmanager, _ = session_cluster
    job_id = running[name].result(timeout=400)
    try:
        assert wait_until(lambda: {j["id"]: j["state"] for j in list_jobs(jobmanager)}.get(job_id) == "RUNNING", 180, 1), (
            list_jobs(jobmanager)
        )
    finally:
        cancel_job(jobmanager, job_id)


@pytest.mark.parametrize("name", ["loopline-monitor", "loopline-dashboard"])
def test_the_monitor_and_dashboard_answer_their_probes(running: dict, name: str) -> None:
    pod: PodProcess = running[name]
    pod.wait_for(lambda: pod.probe("startupProbe"), "its startup probe", 180)
    assert pod.probe("readinessProbe") and pod.probe("livenessProbe")
    (path, marker) = ("/metrics", b"loopline_") if name == "loopline-monitor" else ("/", b"<html")
    page = requests.get(f"http://127.0.0.1:{pod.ports['http']}{path}", timeout=10)
    assert page.status_code == 200 and marker in page.content.lower(), page.text[:500]
    if name == "loopline-monitor":
        # Prod was registered by hand, on no snapshot (a fresh release's first model): the monitor waits, up and scraped.
        assert pod.alive() and "waiting for a reference snapshot" in pod.output(), pod.output()[-2000:]


def test_the_retrain_trigger_stays_up_until_sigterm(running: dict) -> None:
    trigger: PodProcess = running["loopline-retrain-trigger"]
    trigger.wait_for(lambda: "quiet" in trigger.output() or "fire" in trigger.output(), "its first look at prod", 180)
    assert trigger.probe("readinessProbe") and trigger.probe("livenessProbe")
    assert trigger.alive(), trigger.output()
    assert trigger.stop(grace_s=30) == 0, f"it exits cleanly on SIGTERM: {trigger.output()[-2000:]}"
    assert "Traceback" not in trigger.output()


def test_a_misspelled_option_fails_its_rehearsal(chart: list[dict], pods: Pods) -> None:
    """The runner reports a chart fault: the scorer's command with one option misspelled never answers its probe."""
    broken = copy.deepcopy(chart)
    scorer = next(o for o in broken if o["kind"] == "Deployment" and o["metadata"]["name"] == "loopline-scorer")
    container = scorer["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [("--gprc" if a == "--grpc" else a) for a in container["command"]]
    pod = lay_out(broken, "Deployment", "loopline-scorer", pods.layout, pods.root / "broken-scorer", pods.claims)
    pods.started.append(pod)
    with pytest.raises(RehearsalError, match="No such option"):
        pod.start().wait_for(lambda: pod.probe("startupProbe"), "its startup probe", 60)
