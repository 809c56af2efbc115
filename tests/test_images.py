"""The images of `make images` against the real local stack (marker ``images``; `make test-images` builds them first):
the CPU scorer image, run with `podman run --network host`, serves a real ONNX model with features from the session's
Redis and logs its prediction to Kafka; the Flink image's entry point submits the feature job to a session cluster
(`loopline flink up`, on this host), where it reaches RUNNING.
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

from conftest import REPO, LogReader, score_request
from feature_store.online_write import FeatureRow, OnlineWriter
from infra.flink_cluster import cancel_job, list_jobs
from infra.images.catalog import image_tags
from infra.images.engine import Podman
from infra.service import free_ports, wait_until
from loopline.components import flink_session
from loopline.settings import FlinkSettings, Settings, settings_environment
from offline_training.onnx_models import write_linear_model
from schemas.records import PredictionRecord
from schemas.topics import PREDICTIONS
from streams.job_archives import cache_dir

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
    engine = Podman(REPO / ".loopline" / "containers")
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
    OnlineWriter(applied.feast_registry_path, applied.redis_connection).write(
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
        applied, "LOOPLINE_HOME", "LOOPLINE_JARS_DIR", LOOPLINE_SERVING__HTTP_PORT=str(http_port),
        LOOPLINE_SERVING__GRPC_PORT=str(grpc_port), LOOPLINE_FEATURE_STORE__FEAST_REGISTRY_PATH=f"{FEAST_DIR}/registry.db",
    )  # fmt: skip
    mounts = [f"--volume={shared / 'model'}:{MODEL_DIR}:ro", f"--volume={shared / 'feast'}:{FEAST_DIR}:ro"]
    url = f"http://127.0.0.1:{http_port}"
    log = LogReader(applied.kafka.bootstrap, PREDICTIONS.name)

    def ready() -> bool:
        try:
            return requests.get(f"{url}/v1/models/ready", timeout=2).json().get("ready") is True
        except (requests.ConnectionError, requests.Timeout, ValueError):
            return False

    image = TAGS["loopline-scorer-cpu"]
    with closing(log), container(podman, image, [*env, *mounts], ["serve", "--http", "--grpc", "--model", f"{MODEL_DIR}/fraud.onnx"]) as name:
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


def test_the_flink_images_entry_point_submits_a_job_that_runs(podman: Podman, applied: Settings) -> None:
    rest, rpc = free_ports(2)
    on_cluster = applied.model_copy(update={"flink": FlinkSettings(rest_port=rest, rpc_port=rpc)})
    session = flink_session(on_cluster, taskmanagers=1, slots=2)
    jobmanager = session.address
    environments = set(cache_dir().glob("loopline-job-env-*.zip"))
    session.up()
    try:
        home, cache = on_cluster.home.absolute(), cache_dir().parents[1]
        # The stack's state and the job environment cache are the host root's folders, mounted where the host has them.
        options = ["--user=0:0", f"--volume={home}:{home}", f"--volume={cache}:{cache}", f"--env=XDG_CACHE_HOME={cache}",
                   *_loopline_environment(on_cluster, "LOOPLINE_JARS_DIR")]  # fmt: skip
        submit = ["loopline", "stream", "submit", "--jobmanager", jobmanager, "--no-restore"]
        image = TAGS["loopline-flink"]
        with container(podman, image, options, submit) as name:
            assert wait_until(lambda: _exited(podman, name), 400, 1), "the submission did not end"
            logs = podman.run("logs", name)
            output = logs.stdout + logs.stderr
            assert _exit_code(podman, name) == 0, output[-3000:]
        job_id = output.rsplit("job ", 1)[1].split()[0]
        assert wait_until(lambda: {j["id"]: j["state"] for j in list_jobs(jobmanager)}.get(job_id) == "RUNNING", 180, 1), \
            list_jobs(jobmanager)  # fmt: skip
        assert set(cache_dir().glob("loopline-job-env-*.zip")) == environments, \
            "the image's Python environment is the venv's: the job environment built from it is the one cached here"  # fmt: skip
        cancel_job(jobmanager, job_id)
    finally:
        session.down()


def _state(podman: Podman, name: str) -> dict:
    return json.loads(podman.run("container", "inspect", name).stdout)[0]["State"]


def _exited(podman: Podman, name: str) -> bool:
    return _state(podman, name)["Status"] == "exited"


def _exit_code(podman: Podman, name: str) -> int:
    return int(_state(podman, name)["ExitCode"])
