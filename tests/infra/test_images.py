"""The images of `make images` against the real local stack (marker ``images``; `make test-images` builds them first):
the CPU scorer image, run with `podman run --network host`, serves a real ONNX model with features from the session's
Redis and logs its prediction to Kafka; the Flink image runs the Helm chart's features FlinkDeployment as the Flink
operator runs an application cluster (a JobManager container in application mode and a TaskManager container), and the
job it starts writes the features of the events published to the session's Redis.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path

import numpy as np
import pytest
import requests

from feature_store.online_read import OnlineReader
from feature_store.online_write import FeatureRow, OnlineWriter
from infra.chart_rehearsal import pod_environment, volume_files
from infra.flink_cluster import list_jobs, rest_get
from infra.helm_chart import render
from infra.images.catalog import image_tags
from infra.images.engine import Podman
from infra.service import free_ports, wait_until
from loopline.settings import Settings, settings_environment
from offline_training.onnx_models import write_linear_model
from schemas.records import PredictionRecord
from schemas.topics import DAY_MS, PREDICTIONS, TopicSpec
from schemas.validation import encode
from streams.producer import EventProducer
from streams.topics import apply_topics
from streams.world import Emitted
from tests.support.kafka_log import LogReader
from tests.support.scoring import score_request
from tests.support.templates import TransactionEvent

pytestmark = [pytest.mark.images, pytest.mark.timeout(600)]

TAGS = image_tags()
VIEW = "user_transaction_features"
INPUTS = [f"{VIEW}:txn_count_5m", f"{VIEW}:amount_sum_1h", "request:amount"]
WEIGHTS, BIAS = np.array([0.3, 0.002, 0.004], dtype=np.float32), -2.0
#: Where the scorer's container finds the model and the Feast registry (mounted read-only).
MODEL_DIR, FEAST_DIR = "/srv/model", "/srv/feast"


@pytest.fixture(scope="module")
def podman() -> Podman:
    """Podman with the project's engine configuration; the scorer and Flink images built (else a skip says how)."""
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed: `make test-images` installs it and builds the images")
    # The engine configuration `make images` (loopline/images.py) writes: under the settings' home.
    engine = Podman(Settings().home.absolute() / "containers")
    engine.configure()
    missing = [TAGS[key] for key in ("loopline-scorer-cpu", "loopline-flink") if not engine.exists(TAGS[key])]
    if missing:
        pytest.skip(f"not built: {', '.join(missing)} — `make test-images` builds them first")
    return engine


def _loopline_environment(settings: Settings, *dropped: str, **extra: str) -> list[str]:
    """``-e NAME=value`` for each ``LOOPLINE_*`` variable of ``settings`` (less ``dropped``: the image's own) and ``extra``."""
    env = {k: v for k, v in settings_environment(settings).items() if k.startswith("LOOPLINE_") and k not in dropped}
    return [f"--env={name}={value}" for name, value in {**env, **extra}.items()]


@contextmanager
def container(podman: Podman, image: str, options: Sequence[str], command: Sequence[str] = ()) -> Iterator[str]:
    """A detached container of ``image`` on the host's network, by a name of its own; removed (killed) after."""
    name = f"loopline-test-{uuid.uuid4().hex[:8]}"
    podman.run("run", "--detach", "--network=host", f"--name={name}", *options, image, *command)
    try:
        yield name
    finally:
        subprocess.run(["podman", "rm", "--force", "--time=5", name], env=podman.environment, capture_output=True)


def test_the_scorer_image_scores_with_the_stacks_features(podman: Podman, applied: Settings, tmp_path: Path) -> None:
    user = f"image-{uuid.uuid4().hex[:8]}"
    OnlineWriter(applied.feast_registry_path, applied.redis_connection, applied.repo_path).write(
        [FeatureRow(VIEW, user, int(time.time() * 1_000_000), {"txn_count_5m": 4, "amount_sum_1h": 310.5})]
    )
    # The container's user (uid 10001) reads what the host's root wrote: copies it may read.
    shared = tmp_path / "shared"
    (shared / "model").mkdir(parents=True)
    write_linear_model(shared / "model" / "fraud.onnx", INPUTS, WEIGHTS, BIAS)
    shutil.copytree(applied.feast_registry_path.parent, shared / "feast")
    for path in [tmp_path, *shared.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    http_port, grpc_port = free_ports(2)
    env = _loopline_environment(
        applied,
        "LOOPLINE_HOME",
        "LOOPLINE_JARS_DIR",
        "LOOPLINE_PROJECT",
        LOOPLINE_SERVING__HTTP_PORT=str(http_port),
        LOOPLINE_SERVING__GRPC_PORT=str(grpc_port),
        LOOPLINE_FEATURE_STORE__FEAST_REGISTRY_PATH=f"{FEAST_DIR}/registry.db",
    )
    mounts = [f"--volume={shared / 'model'}:{MODEL_DIR}:ro", f"--volume={shared / 'feast'}:{FEAST_DIR}:ro"]
    url = f"http://127.0.0.1:{http_port}"
    log = LogReader(applied.kafka.bootstrap, PREDICTIONS.name)

    def ready() -> bool:
        try:
            return requests.get(f"{url}/v1/models/ready", timeout=2).json().get("ready") is True
        except (requests.ConnectionError, requests.Timeout, ValueError):
            return False

    image = TAGS["loopline-scorer-cpu"]
    with (
        closing(log),
        container(podman, image, [*env, *mounts], ["serve", "--http", "--grpc", "--model", f"{MODEL_DIR}/fraud.onnx"]) as name,
    ):
        assert wait_until(ready, 120, 0.5), podman.run("logs", name).stdout[-3000:]
        request = score_request(user, 120.0)
        reply = requests.post(f"{url}/v1/score", json=request, timeout=5)
        assert reply.status_code == 200, reply.text
        record = PredictionRecord.model_validate_json(reply.content)
        assert record.features == {f"{VIEW}:txn_count_5m": 4, f"{VIEW}:amount_sum_1h": 310.5, "request:amount": 120.0}
        expected = 1 / (1 + np.exp(-(np.dot(np.array([4, 310.5, 120.0], dtype=np.float32), WEIGHTS) + BIAS)))
        assert record.score == pytest.approx(float(expected), rel=1e-5) and record.defaulted_features == []
        logged = lambda: any(r.request_id == request["request_id"] for r in log.records(PredictionRecord))  # noqa: E731
        assert wait_until(logged, 60, 0.2), "the container logs its prediction to the stack's Kafka"
        user_id = podman.run("exec", name, "id", "-u").stdout.strip()
    assert user_id == "10001", "the scorer runs as its own non-root user"


def _pod_options(objects: list[dict], pod: dict, container: dict, name: str, files_dir: Path, claim: Path) -> list[str]:
    """``--env`` and ``--volume`` options that give a container of the image what the kubelet gives ``container`` of
    ``pod``: its environment, its ConfigMap and Secret files (written under ``files_dir``, mounted read-only) and the
    claim at ``claim`` (an emptyDir is the container's own folder)."""
    options = [f"--env={key}={value}" for key, value in pod_environment(objects, container, name).items()]
    for index, (mount_path, files) in enumerate(volume_files(objects, pod, container).items()):
        folder = files_dir / str(index)
        folder.mkdir(parents=True)
        for file_name, content in files.items():
            (folder / file_name).write_text(content)
            (folder / file_name).chmod(0o644)
        options.append(f"--volume={folder}:{mount_path}:ro")
    claims = {v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    return options + [f"--volume={claim}:{m['mountPath']}" for m in container["volumeMounts"] if m["name"] in claims]


def _flink_properties(spec: dict, **options: object) -> str:
    """FLINK_PROPERTIES for one process of the FlinkDeployment ``spec`` on this host: its ``flinkConfiguration`` (less
    Kubernetes HA: there is no API server here), what the operator derives from the spec for a standalone application
    cluster (its FlinkConfigBuilder: memory, parallelism, the job's jar as ``pipeline.jars`` and, as a ``file://`` URI,
    ``pipeline.classpaths``, without which the JobManager cannot load PyFlink's operators), and ``options`` (keys with
    ``_`` for ``.``: addresses and ports)."""
    jar = spec["job"]["jarURI"]
    conf = {k: v for k, v in spec["flinkConfiguration"].items() if not k.startswith("high-availability.")}
    conf |= {
        "jobmanager.memory.process.size": spec["jobManager"]["resource"]["memory"],
        "taskmanager.memory.process.size": spec["taskManager"]["resource"]["memory"],
        "parallelism.default": spec["job"]["parallelism"],
        "execution.target": "remote",
        "pipeline.jars": jar,
        "pipeline.classpaths": "file://" + jar.removeprefix("local://"),
        **{k.replace("_", "."): v for k, v in options.items()},
    }
    return "".join(f"{key}: {value}\n" for key, value in conf.items())


def _job_runs_on(address: str, taskmanagers: int) -> bool:
    """Whether the cluster at ``address`` runs one job, every task of it RUNNING, on its ``taskmanagers``."""
    try:
        jobs = list_jobs(address)
        if [j["state"] for j in jobs] != ["RUNNING"]:
            return False
        vertices = rest_get(address, f"/jobs/{jobs[0]['id']}")["vertices"]
        used = [tm for tm in rest_get(address, "/taskmanagers")["taskmanagers"] if tm["freeSlots"] < tm["slotsNumber"]]
    except OSError:
        return False
    return all(v["status"] == "RUNNING" for v in vertices) and len(used) == taskmanagers


def test_the_flink_image_runs_the_charts_feature_deployment_as_the_operator_does(
    podman: Podman, applied: Settings, helm: Path, tmp_path: Path
) -> None:
    """The chart's features FlinkDeployment, run from the image as the Flink operator runs an application cluster in
    standalone mode (``standalone-job --job-classname <entryClass> <job.args>`` and ``taskmanager``, each container
    with the pod template's env and mounts), on this host's network against the session's Kafka and Redis: the job
    reaches RUNNING on the image's own TaskManager and writes the features of the events published to Redis."""
    run = uuid.uuid4().hex[:8]
    source = TopicSpec(f"test.images.events.{run}", TransactionEvent, key="user_id", partitions=1, retention_ms=DAY_MS)
    objects = render(
        overrides={
            "kafka.strimzi": "false",
            "kafka.bootstrapServers": f"{{{applied.kafka.bootstrap}}}",
            "redis.mode": "standalone",
            "redis.nodes": f"{{{','.join(applied.redis.addresses)}}}",
            "settings.stream.source_topics.events\\.transactions": source.name,
            "settings.stream.group_id": f"images-{run}",
        },
        helm=helm,
    )
    (deployment,) = [o for o in objects if o["kind"] == "FlinkDeployment" and o["metadata"]["name"] == "loopline-feature-job"]
    spec, job = deployment["spec"], deployment["spec"]["job"]
    pod = spec["podTemplate"]["spec"]
    (main,) = pod["containers"]
    # The claim: the Feast registry where the chart's settings say (the apply Job writes it there), writable by Flink.
    claim = tmp_path / "shared"
    (claim / "feast").mkdir(parents=True)
    shutil.copy(applied.feast_registry_path, claim / "feast" / "registry.db")
    for path in [claim, *claim.rglob("*")]:
        path.chmod(0o777)
    pod_options = _pod_options(objects, pod, main, deployment["metadata"]["name"], tmp_path / "files", claim)

    user, amounts = f"image-{run}", [20.0, 35.5, 4.5]
    apply_topics(applied.kafka.bootstrap, [source])
    events = [
        TransactionEvent(
            schema_version=1,
            event_id=str(uuid.uuid4()),
            event_time_ms=int(time.time() * 1000) + i,
            user_id=user,
            merchant_id=f"m{i}",
            amount=amount,
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
        for i, amount in enumerate(amounts)
    ]
    EventProducer(applied.kafka.bootstrap).publish([Emitted(source.name, user, encode(e), e.event_time_ms, e) for e in events])

    rpc, rest, blob, tm_rpc, tm_data, jm_metrics, tm_metrics = free_ports(7)
    address = f"127.0.0.1:{rest}"
    cluster = {"jobmanager_rpc_address": "127.0.0.1", "jobmanager_rpc_port": rpc}
    jobmanager = _flink_properties(
        spec, **cluster, rest_address="127.0.0.1", rest_port=rest, blob_server_port=blob, metrics_reporter_prom_port=jm_metrics
    )
    taskmanager = _flink_properties(
        spec,
        **cluster,
        taskmanager_host="127.0.0.1",
        taskmanager_rpc_port=tm_rpc,
        taskmanager_data_port=tm_data,
        metrics_reporter_prom_port=tm_metrics,
    )
    image = TAGS["loopline-flink"]
    assert spec["image"].endswith(image), "the chart runs the catalog's Flink image"
    application = ["standalone-job", "--job-classname", job["entryClass"], *job["args"]]
    with (
        container(podman, image, [*pod_options, f"--env=FLINK_PROPERTIES={jobmanager}"], application) as jm,
        container(podman, image, [*pod_options, f"--env=FLINK_PROPERTIES={taskmanager}"], ["taskmanager"]) as tm,
    ):
        logs = lambda: _logs(podman, jm, tm)  # noqa: E731
        assert wait_until(lambda: _job_runs_on(address, 1) or _exited(podman, jm), 300, 1) and not _exited(podman, jm), logs()
        reader = OnlineReader(applied.feast_registry_path, applied.redis_connection, applied.repo_path)

        def features() -> dict:
            read = reader.get_online_features([f"{VIEW}:txn_count_5m", f"{VIEW}:amount_sum_1h"], [{"user_id": user}])
            return {name: values[0] for name, values in read.items() if name != "user_id"}

        assert wait_until(lambda: features()["txn_count_5m"] == len(amounts), 180, 0.5), logs()
        assert features() == {"txn_count_5m": len(amounts), "amount_sum_1h": sum(amounts)}


def _logs(podman: Podman, *names: str) -> str:
    """The end of each container's output less Java's stack frames (a failed job's Python traceback stays in view),
    for a failure's message."""
    outputs = {name: podman.run("logs", name) for name in names}
    kept = {
        name: "\n".join(line for line in (out.stdout + out.stderr).splitlines() if not line.lstrip().startswith(("at ", "... ")))
        for name, out in outputs.items()
    }
    return "\n".join(f"--- {name}:\n{text[-5000:]}" for name, text in kept.items())


def _state(podman: Podman, name: str) -> dict:
    return json.loads(podman.run("container", "inspect", name).stdout)[0]["State"]


def _exited(podman: Podman, name: str) -> bool:
    return _state(podman, name)["Status"] == "exited"
