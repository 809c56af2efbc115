"""The retrain trigger on Kubernetes (``retrain.launcher: trainjob``): the TrainJob it creates is the chart's own
definition (strictly valid against the pinned Kubeflow Trainer CRD, on the firing's snapshot, in the Kueue queue, with
the retrain priority above a scheduled training's), created as the pod's service account over TLS verified with the
account's CA, once per firing (a retry whose answer was lost, or a second attempt, gets 409 and reports it created);
the chart's Role grants exactly the requests the client made, and the trigger's pod mounts what the code reads.

No Kubernetes API server runs here: a real HTTPS server on 127.0.0.1 stands in for it (the one part not under test),
answering as one does (201 Created, 409 AlreadyExists, 401 without the token) and recording every request. The
trigger's whole look (the examples topic, the registry, the snapshot, then the TrainJob) runs on the session's Kafka.
"""

from __future__ import annotations

import copy
import json
import os
import re
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml
from confluent_kafka import Producer

from feedback_loop.settings import RetrainSettings
from infra.crd_schema import CrdValidators
from loopline.components import model_release
from loopline.retraining import start_retrain_trainjob, trigger_step
from loopline.settings import Settings
from offline_training.kubernetes_api import KubernetesApi, KubernetesError
from offline_training.onnx_models import write_linear_model
from offline_training.retraining import TrainJobStarted
from offline_training.trainjob import CANARY_ENV, SNAPSHOT_ENV, TRAINJOBS
from online.settings import ServingSettings
from schemas.records import TrainingExample
from schemas.topics import TopicSpec
from schemas.validation import encode
from streams.topics import apply_topics
from tests.support.paths import CRDS

NAMESPACE = "ml-prod"
TOKEN = "sa-token-1"
FIRED_MS = 1_790_000_000_000
_COLLECTION = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/?]+)(?P<item>/[^?]+)?"
)


@pytest.fixture(scope="module")
def crds() -> CrdValidators:
    if not CRDS.is_dir():
        pytest.skip(f"the pinned CRDs are not at {CRDS} (the shared folder beside the repository)")
    return CrdValidators([CRDS / "trainer.kubeflow.org_trainjobs.yaml"])


def _one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def _template(objects: list[dict]) -> dict:
    """The TrainJob template of the trigger's ConfigMap, as the trigger reads it."""
    (data,) = _one(objects, "ConfigMap", "loopline-retrain-trigger-trainjob")["data"].values()
    return yaml.safe_load(data)


def _env(job: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in job["spec"]["trainer"]["env"]}


def _openssl(*arguments: str | Path) -> None:
    subprocess.run(["openssl", *map(str, arguments)], check=True, capture_output=True)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    other_ca: Path


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A cluster CA, the API server's certificate for 127.0.0.1 signed by it, and an unrelated CA."""
    folder = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    for ca in ("ca", "other-ca"):
        _openssl(
            "req", "-x509", *ec, "-keyout", folder / f"{ca}.key", "-out", folder / f"{ca}.crt", "-days", "2", "-subj", f"/CN={ca}"
        )
    _openssl("req", *ec, "-keyout", folder / "server.key", "-out", folder / "server.csr", "-subj", "/CN=kube-apiserver")
    (folder / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        folder / "server.csr",
        "-CA",
        folder / "ca.crt",
        "-CAkey",
        folder / "ca.key",
        "-CAcreateserial",
        "-out",
        folder / "server.crt",
        "-days",
        "2",
        "-extfile",
        folder / "ext.cnf",
    )
    return Certificates(folder / "ca.crt", folder / "server.crt", folder / "server.key", folder / "other-ca.crt")


@dataclass
class StandInApiServer:
    """What a Kubernetes API server answers to a namespaced create: 401 without the bearer token, 201 and the object
    kept, or 409 AlreadyExists for a name it holds. ``drop_answers``: that many creations are kept but their
    connection closed unanswered (a response lost on the way back)."""

    token: str
    port: int = 0
    objects: dict[str, dict] = field(default_factory=dict)
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    drop_answers: int = 0


def _handler(api: StandInApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _answer(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._answer(
                code,
                {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message, "code": code},
            )

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            api.requests.append((self.command, self.path, self.headers.get("Authorization", "")))
            if self.headers.get("Authorization") != f"Bearer {api.token}":
                return self._status(401, "Unauthorized", "Unauthorized")
            match = _COLLECTION.match(self.path)
            if self.command != "POST" or match is None or match["item"]:
                return self._status(405, "MethodNotAllowed", f"the stand-in answers creations only, not {self.command}")
            obj = json.loads(body)
            key = f"{self.path}/{obj['metadata']['name']}"
            if key in api.objects:
                return self._status(409, "AlreadyExists", f'{match["plural"]} "{obj["metadata"]["name"]}" already exists')
            api.objects[key] = obj
            if api.drop_answers:
                api.drop_answers -= 1
                self.close_connection = True
                return None
            return self._answer(201, obj)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

    return Handler


@pytest.fixture
def api_server(certificates: Certificates) -> Iterator[StandInApiServer]:
    api = StandInApiServer(TOKEN)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificates.server_cert, certificates.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    api.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()


def _service_account(folder: Path, ca: Path, token: str = TOKEN) -> Path:
    """A pod's service account folder, as the kubelet mounts it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text(token)
    (folder / "ca.crt").write_bytes(ca.read_bytes())
    (folder / "namespace").write_text(NAMESPACE)
    return folder


def _in_cluster(api: StandInApiServer, account: Path) -> KubernetesApi:
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port)}
    return KubernetesApi.in_cluster(account, environ, timeout_s=5.0, backoff_s=0.05)


def _trigger_settings(rendered: dict[str, list[dict]], tmp_path: Path, **retrain: object) -> Settings:
    """Settings of the trigger's pod for the TrainJob: the production template, mounted at a path of this test."""
    template = tmp_path / "retrain" / "trainjob.yaml"
    template.parent.mkdir(parents=True, exist_ok=True)
    template.write_text(yaml.safe_dump(_template(rendered["production"])))
    return Settings(retrain=RetrainSettings(launcher="trainjob", trainjob_template=template, canary_percent=5.0, **retrain))


def test_the_triggers_trainjob_is_the_charts_own_on_the_snapshot_with_the_retrain_priority(
    rendered: dict[str, list[dict]], crds: CrdValidators, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from offline_training.trainjob import retrain_trainjob

    production = rendered["production"]
    job = retrain_trainjob(_template(production), snapshot_id="9f3a7c", fired_ms=FIRED_MS, canary_percent=5.0, reason="AUC 0.61")
    assert crds.errors(job) == []
    assert job["metadata"]["name"] == f"loopline-retrain-{FIRED_MS}"
    assert (_env(job)[SNAPSHOT_ENV], _env(job)[CANARY_ENV]) == ("9f3a7c", "5")
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == _one(production, "LocalQueue")["metadata"]["name"]
    scheduled = copy.deepcopy(_one(production, "TrainJob"))  # the session's render: changed below
    priorities = {o["metadata"]["name"]: o["value"] for o in production if o["kind"] == "WorkloadPriorityClass"}
    assert (
        priorities[labels["kueue.x-k8s.io/priority-class"]]
        > priorities[scheduled["metadata"]["labels"]["kueue.x-k8s.io/priority-class"]]
    )
    # One definition: the scheduled TrainJob's image, nodes, processes and GPUs; only what the firing decides differs.
    decided = {SNAPSHOT_ENV, CANARY_ENV}
    for spec in (job["spec"], scheduled["spec"]):
        spec["trainer"]["env"] = [e for e in spec["trainer"]["env"] if e["name"] not in decided]
    assert job["spec"] == scheduled["spec"] and job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    # The runtime's command reads the firing's variables, and every LOOPLINE_* one the trainer gets is a setting.
    (runtime,) = [o for o in production if o["kind"] == "ClusterTrainingRuntime"]
    command = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "command"
    ][-1]
    assert f'--snapshot "${SNAPSHOT_ENV}"' in command and f'--canary "${CANARY_ENV}"' in command
    for name in [n for n in os.environ if n.startswith("LOOPLINE_")]:
        monkeypatch.delenv(name)
    for name, value in _env(
        retrain_trainjob(_template(production), snapshot_id="s", fired_ms=1, canary_percent=0, reason="")
    ).items():
        monkeypatch.setenv(name, value)
    assert Settings().feedback.train_processes == 8


def test_created_over_verified_tls_as_the_pods_service_account_once_per_firing(
    rendered: dict[str, list[dict]], api_server: StandInApiServer, certificates: Certificates, tmp_path: Path
) -> None:
    settings = _trigger_settings(rendered, tmp_path)
    account = _service_account(tmp_path / "serviceaccount", certificates.ca)
    api = _in_cluster(api_server, account)
    first = start_retrain_trainjob(settings, "9f3a7c", FIRED_MS, "prod v3: AUC 0.61 below 0.75", api)
    assert (first.trainjob.name, first.trainjob.namespace, first.trainjob.created) == (
        f"loopline-retrain-{FIRED_MS}",
        NAMESPACE,
        True,
    )
    ((method, path, authorization),) = api_server.requests
    assert (method, path, authorization) == ("POST", TRAINJOBS.collection(NAMESPACE), f"Bearer {TOKEN}")
    (stored,) = api_server.objects.values()
    assert _env(stored)[SNAPSHOT_ENV] == "9f3a7c" and stored["metadata"]["annotations"]["loopline/retrain-reason"].startswith(
        "prod v3"
    )
    # The kubelet rotates the token in place: the retry of the same firing sends the new one, and finds its TrainJob.
    api_server.token = "sa-token-2"
    (account / "token").write_text("sa-token-2")
    again = start_retrain_trainjob(settings, "9f3a7c", FIRED_MS, "prod v3: AUC 0.61 below 0.75", api)
    assert again.trainjob.created is False and len(api_server.objects) == 1
    assert api_server.requests[-1][2] == "Bearer sa-token-2"
    # Another firing is another TrainJob.
    assert (
        start_retrain_trainjob(settings, "0b1c2d", FIRED_MS + 1, "again", api).trainjob.created and len(api_server.objects) == 2
    )


def test_a_lost_answer_is_retried_and_its_409_reports_the_trainjob_created(
    rendered: dict[str, list[dict]], api_server: StandInApiServer, certificates: Certificates, tmp_path: Path
) -> None:
    api_server.drop_answers = 1
    api = _in_cluster(api_server, _service_account(tmp_path / "serviceaccount", certificates.ca))
    started = start_retrain_trainjob(_trigger_settings(rendered, tmp_path), "9f3a7c", FIRED_MS, "reason", api)
    assert isinstance(started, TrainJobStarted) and started.trainjob.created is False
    assert len(api_server.requests) == 2 and len(api_server.objects) == 1


def test_refused_without_the_token_or_by_a_server_the_accounts_ca_did_not_sign(
    rendered: dict[str, list[dict]], api_server: StandInApiServer, certificates: Certificates, tmp_path: Path
) -> None:
    settings = _trigger_settings(rendered, tmp_path)
    stranger = _in_cluster(api_server, _service_account(tmp_path / "other", certificates.other_ca))
    with pytest.raises(KubernetesError, match="vouches for"):
        start_retrain_trainjob(settings, "9f3a7c", FIRED_MS, "reason", stranger)
    assert api_server.requests == [], "no request crosses an unverified connection"
    stale = _in_cluster(api_server, _service_account(tmp_path / "stale", certificates.ca, token="revoked"))
    with pytest.raises(KubernetesError, match=r"401 Unauthorized .* token was refused"):
        start_retrain_trainjob(settings, "9f3a7c", FIRED_MS, "reason", stale)
    assert api_server.objects == {} and len(api_server.requests) == 1, "a refusal is not retried"
    with pytest.raises(KubernetesError, match="not a Kubernetes pod"):
        KubernetesApi.in_cluster(tmp_path / "stale", {})


def _verb(method: str, path: str) -> tuple[str, str, str]:
    """(API group, resource, RBAC verb) of a request, by the Kubernetes API's REST conventions."""
    match = _COLLECTION.match(path)
    assert match is not None, path
    item = bool(match["item"])
    verb = {
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if item else "deletecollection",
        "GET": "get" if item else ("watch" if "watch=" in path else "list"),
    }[method]
    return match["group"], match["plural"], verb


def test_the_role_grants_exactly_the_requests_the_client_makes(
    rendered: dict[str, list[dict]], api_server: StandInApiServer, certificates: Certificates, tmp_path: Path
) -> None:
    api_server.drop_answers = 1  # the retry path too
    api = _in_cluster(api_server, _service_account(tmp_path / "serviceaccount", certificates.ca))
    start_retrain_trainjob(_trigger_settings(rendered, tmp_path), "9f3a7c", FIRED_MS, "reason", api)
    made = {_verb(method, path) for method, path, _ in api_server.requests}
    assert made == {(TRAINJOBS.group, TRAINJOBS.plural, "create")}
    for values, objects in rendered.items():
        role = _one(objects, "Role", "loopline-retrain-trigger")
        granted = {
            (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
        }
        assert granted == made, values


def test_the_trigger_pod_mounts_what_the_code_reads(
    rendered: dict[str, list[dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from offline_training.trainjob import load_template

    objects = rendered["production"]
    pod = _one(objects, "Deployment", "loopline-retrain-trigger")["spec"]["template"]["spec"]
    binding = _one(objects, "RoleBinding", "loopline-retrain-trigger")
    assert [s["name"] for s in binding["subjects"]] == [pod["serviceAccountName"]] and binding["roleRef"][
        "name"
    ] == "loopline-retrain-trigger"
    assert pod["automountServiceAccountToken"] is True
    assert _one(objects, "ServiceAccount", pod["serviceAccountName"]).get("automountServiceAccountToken", True) is not False
    config = tmp_path / "loopline.yaml"
    config.write_text(_one(objects, "ConfigMap", "loopline-settings")["data"]["loopline.yaml"])
    for name in [n for n in os.environ if n.startswith("LOOPLINE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LOOPLINE_CONFIG", str(config))
    retrain = Settings().retrain
    assert retrain.launcher == "trainjob" and retrain.mode == "retrain"
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(retrain.trainjob_template.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    data = _one(objects, "ConfigMap", volume["configMap"]["name"])["data"]
    mounted = tmp_path / "mounted" / retrain.trainjob_template.name
    mounted.parent.mkdir()
    mounted.write_text(data[retrain.trainjob_template.name])
    assert load_template(mounted)["kind"] == "TrainJob"
    config.write_text(_one(rendered["default"], "ConfigMap", "loopline-settings")["data"]["loopline.yaml"])
    assert Settings().retrain.launcher == "local", "the small default trains in the trigger's pod"


def _bad_examples(count: int, model: str, version: str, now_ms: int) -> list[TrainingExample]:
    """``count`` labeled examples of ``model`` v``version`` scored in the last hour, half positive, scores noise (AUC ~0.5)."""
    rng = np.random.default_rng(3)
    return [
        TrainingExample(
            schema_version=TrainingExample.SCHEMA_VERSION,
            event_id=f"tj-{i}",
            request_id=f"tj-req-{i}",
            entity_keys={"user_id": f"u{i}"},
            features={"request:amount": float(rng.lognormal(3, 1))},
            model_name=model,
            model_version=version,
            score=float(rng.random()),
            label=float(i % 2 == 0),
            requested_at_ms=now_ms - 3_600_000 + i,
            predicted_at_ms=now_ms - 3_600_000 + i + 3,
            label_time_ms=now_ms,
            joined_at_ms=now_ms,
        )
        for i in range(count)
    ]


@pytest.mark.stack
def test_a_look_that_fires_snapshots_the_models_examples_and_creates_their_trainjob(
    settings: Settings,
    bootstrap: str,
    rendered: dict[str, list[dict]],
    api_server: StandInApiServer,
    certificates: Certificates,
    tmp_path: Path,
) -> None:
    from feedback_loop.snapshots import find_snapshot

    name, topic = f"k8s-{uuid.uuid4().hex[:8]}", f"test.examples.{uuid.uuid4().hex[:8]}"
    apply_topics(bootstrap, [TopicSpec(topic, TrainingExample, key="event_id", partitions=1, retention_ms=86_400_000)])
    template = _trigger_settings(rendered, tmp_path).retrain.trainjob_template
    watched = settings.model_copy(
        update={
            "home": tmp_path / "home",
            "serving": ServingSettings(model_name=name),
            "model_registry": settings.model_registry.model_copy(
                update={"tracking_uri": f"sqlite:///{tmp_path}/mlflow.db", "artifact_location": str(tmp_path / "artifacts")}
            ),
            "feedback": settings.feedback.model_copy(update={"examples_topic": topic}),
            "retrain": RetrainSettings(
                mode="retrain", min_labels=200, canary_percent=10.0, launcher="trainjob", trainjob_template=template
            ),
        }
    )
    release = model_release(watched)
    prod = release.register(name, write_linear_model(tmp_path / "prod.onnx", ["request:amount"], np.array([0.01]), 0.0))
    release.promote(name, prod, "test", "the model the trigger judges")
    producer = Producer({"bootstrap.servers": bootstrap})
    for example in _bad_examples(300, name, prod, int(time.time() * 1000)):
        producer.produce(topic, key=example.event_id, value=encode(example))
    assert producer.flush(30) == 0
    api = _in_cluster(api_server, _service_account(tmp_path / "serviceaccount", certificates.ca))

    decision, started = trigger_step(watched, api)

    assert decision.fire and "AUC" in decision.reason, decision
    assert isinstance(started, TrainJobStarted) and started.trainjob.created
    manifest, _ = find_snapshot(watched.snapshots_root, started.snapshot_id)
    assert manifest.rows == 300 and manifest.source["model_name"] == name
    (job,) = api_server.objects.values()
    assert (_env(job)[SNAPSHOT_ENV], _env(job)[CANARY_ENV]) == (manifest.snapshot_id, "10")
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "loopline-retrain"
    assert release.aliases(name) == {"prod": prod}, "the TrainJob's node 0 registers and releases, not the trigger"
    again, nothing = trigger_step(watched, api)
    assert not again.fire and nothing is None and len(api_server.requests) == 1, "the firing's cooldown holds"
