"""The Helm chart (infra/helm/loopline), offline: helm lint and template for each values file, every core object
through kubernetes-validate (strict) for Kubernetes 1.30 and 1.35, every custom resource against the pinned CRDs
(../shared/crds, strict about unknown fields), and the chart's promises: probes and resources, pinned images,
selectors that select, every topic and alert rule (and the scrape jobs the rules select), drains that PDBs allow,
the FlinkDeployments' args as --print-command prints them, the settings' defaults where the chart repeats them."""

from __future__ import annotations

import copy
import os
import re
from importlib.metadata import version
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from feedback_loop.joiner_settings import JoinerSettings
from feedback_loop.settings import MonitorSettings
from infra.chart_rehearsal import pod_environment
from infra.crd_schema import CrdValidators
from infra.helm_chart import CHART, lint, render
from infra.images.catalog import image_tags
from infra.jars import flink_connector_jar
from infra.prometheus_server import stack_rule_files
from loopline.chart_files import stale_files
from loopline.cli import app
from loopline.components import feature_operators_jar, joiner_operators_jar
from loopline.flink_image_job import FEATURE_JOB, JOINER, job_arguments
from loopline.project import template_path
from loopline.settings import Settings
from online.settings import ServingSettings
from schemas.topics import TOPICS
from streams.flink_submit import PYTHON_DRIVER, FlinkImage
from streams.job_settings import JobSettings
from tests.support.paths import CHART_VALUES, CRDS
from tests.support.templates import FRAUD

REPO = Path(__file__).resolve().parents[2]
VALUES = CHART_VALUES
#: Every kind issue 17 names, which the production values must render.
PRODUCTION_KINDS = {
    "Kafka",
    "KafkaNodePool",
    "KafkaTopic",
    "FlinkDeployment",
    "Deployment",
    "StatefulSet",
    "Service",
    "HorizontalPodAutoscaler",
    "ScaledObject",
    "PodDisruptionBudget",
    "Job",
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
    "ConfigMap",
    "TrainJob",
    "ClusterTrainingRuntime",
    "ResourceFlavor",
    "ClusterQueue",
    "LocalQueue",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Secret",
}
WORKLOADS = {"Deployment", "StatefulSet"}


@pytest.fixture(scope="module")
def crds() -> CrdValidators:
    if not CRDS.is_dir():
        pytest.skip(f"the pinned CRDs are not at {CRDS} (the shared folder beside the repository)")
    return CrdValidators(sorted(CRDS.glob("*.yaml")))


def _all(rendered: dict[str, list[dict]]) -> list[tuple[str, dict]]:
    return [(name, obj) for name, objects in rendered.items() for obj in objects]


def _is_core(obj: dict) -> bool:
    """Whether Kubernetes itself serves the object's kind: its API group is none (v1), unqualified (apps, batch)
    or under k8s.io (rbac.authorization.k8s.io); an operator's custom resources are in their own domains."""
    group = obj["apiVersion"].rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def _pod_specs(obj: dict) -> list[dict]:
    """The pod specs an object runs (workloads, Jobs, FlinkDeployments' templates, training runtimes)."""
    spec = obj.get("spec", {})
    if obj["kind"] in WORKLOADS | {"Job"}:
        return [spec["template"]["spec"]]
    if obj["kind"] == "FlinkDeployment":
        return [spec["podTemplate"]["spec"]]
    if obj["kind"] == "ClusterTrainingRuntime":
        return [job["template"]["spec"]["template"]["spec"] for job in spec["template"]["spec"]["replicatedJobs"]]
    return []


def _images(node: object) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "image" and isinstance(v, str)] + [
            i for v in node.values() for i in _images(v)
        ]
    if isinstance(node, list):
        return [i for v in node for i in _images(v)]
    return []


@pytest.mark.parametrize("values", VALUES)
def test_helm_lint_passes(helm: Path, values: str) -> None:
    assert "0 chart(s) failed" in lint(VALUES[values], helm=helm)


def test_production_renders_every_kind(rendered: dict[str, list[dict]]) -> None:
    kinds = {obj["kind"] for obj in rendered["production"]}
    assert kinds >= PRODUCTION_KINDS, f"missing: {sorted(PRODUCTION_KINDS - kinds)}"


@pytest.mark.parametrize("kubernetes", ["1.30", "1.35"])
def test_core_objects_validate_strictly(rendered: dict[str, list[dict]], kubernetes: str) -> None:
    checked = 0
    for values, obj in _all(rendered):
        if not _is_core(obj):
            continue
        try:
            kubernetes_validate.validate(obj, kubernetes, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{values}: {obj['kind']}/{obj['metadata']['name']} at {'.'.join(map(str, err.path))}: {err.message}")
        checked += 1
    assert checked >= 30


def test_custom_resources_validate_against_the_pinned_crds(rendered: dict[str, list[dict]], crds: CrdValidators) -> None:
    custom = [(values, obj) for values, obj in _all(rendered) if crds.knows(obj)]
    faults = [
        f"{values}: {obj['kind']}/{obj['metadata']['name']}: {error}" for values, obj in custom for error in crds.errors(obj)
    ]
    assert not faults, "\n".join(faults)
    assert {obj["kind"] for _, obj in custom} >= {
        "FlinkDeployment",
        "Kafka",
        "KafkaTopic",
        "ScaledObject",
        "TrainJob",
        "ClusterTrainingRuntime",
        "ClusterQueue",
        "PrometheusRule",
    }


def test_a_misspelled_field_is_caught(rendered: dict[str, list[dict]], crds: CrdValidators) -> None:
    flink = copy.deepcopy(next(o for o in rendered["default"] if o["kind"] == "FlinkDeployment"))
    flink["spec"]["job"]["upgradeMod"] = flink["spec"]["job"].pop("upgradeMode")
    assert any("upgradeMod" in error for error in crds.errors(flink))
    flink["spec"]["job"]["upgradeMode"] = flink["spec"]["job"].pop("upgradeMod")
    flink["spec"]["podTemplate"]["spec"]["containers"][0]["volumeMount"] = []
    assert any("volumeMount" in error for error in crds.errors(flink))
    scorer = copy.deepcopy(next(o for o in rendered["default"] if o["kind"] == "Deployment"))
    scorer["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(scorer, "1.35", strict=True)


def test_every_long_running_container_has_probes_and_resources(rendered: dict[str, list[dict]]) -> None:
    for values, obj in _all(rendered):
        for pod in _pod_specs(obj):
            for container in pod["containers"] + pod.get("initContainers", []):
                where = f"{values}: {obj['kind']}/{obj['metadata']['name']}/{container['name']}"
                if obj["kind"] in WORKLOADS:
                    assert {"readinessProbe", "livenessProbe"} <= set(container), f"{where} has no probes"
                if obj["kind"] != "FlinkDeployment":  # the operator sizes Flink's pods from jobManager/taskManager
                    resources = container.get("resources", {})
                    assert resources.get("requests") and resources.get("limits"), f"{where} has no requests and limits"
                assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
            assert pod["securityContext"]["runAsNonRoot"] is True
        if obj["kind"] == "FlinkDeployment":
            assert obj["spec"]["jobManager"]["resource"] and obj["spec"]["taskManager"]["resource"]
        if obj["kind"] == "TrainJob":
            assert obj["spec"]["trainer"]["resourcesPerNode"]["limits"]


def _image_user(image: str) -> int:
    """The uid the image runs as: its Dockerfile's user (the Flink image's comes from its base, Flink's flink user)."""
    dockerfile = "flink-base.Dockerfile" if "loopline-flink" in image else "loopline.Dockerfile"
    (uid,) = re.findall(r"useradd [^\n]*--uid (\d+)", (REPO / "infra" / "images" / dockerfile).read_text())
    return int(uid)


def test_every_pod_runs_as_its_images_user(rendered: dict[str, list[dict]]) -> None:
    """A pod run as another uid than its image's cannot write what the image owns (Flink's log/ under /opt/flink)."""
    checked = set()
    for values, obj in _all(rendered):
        for pod in _pod_specs(obj):
            # A FlinkDeployment's pod template names no image: the operator runs the deployment's own.
            images = {c.get("image") or obj["spec"]["image"] for c in pod["containers"]}
            users = {_image_user(image) for image in images if "redis" not in image}
            where = f"{values}: {obj['kind']}/{obj['metadata']['name']}"
            assert users <= {pod["securityContext"]["runAsUser"]}, (
                f"{where} runs as {pod['securityContext']['runAsUser']}, its images as {users}"
            )
            checked |= users
    assert checked == {9999, 10001}


def test_gpu_values_request_gpus_where_they_run(rendered: dict[str, list[dict]]) -> None:
    scorer = next(o for o in rendered["production"] if o["kind"] == "Deployment" and o["metadata"]["name"] == "loopline-scorer")
    pod = scorer["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] and pod["tolerations"] and pod["containers"][0]["image"].endswith("-cuda13")
    train = next(o for o in rendered["production"] if o["kind"] == "TrainJob")
    assert train["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert train["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "loopline"


def test_images_are_pinned(rendered: dict[str, list[dict]]) -> None:
    images = {image for _, obj in _all(rendered) for image in _images(obj)}
    assert images
    for image in images:
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and tag != "latest", f"{image} is not pinned"


def test_image_tags_are_the_catalogs() -> None:
    images = yaml.safe_load((CHART / "values.yaml").read_text())["images"]
    keys = {
        "flink": "loopline-flink",
        "scorer": "loopline-scorer-cpu",
        "scorerGpu": "loopline-scorer-cuda",
        "trainer": "loopline-trainer",
        "ops": "loopline-ops",
    }
    assert {keys[k]: f"{images[k]['repository']}:{images[k]['tag']}" for k in keys} == {k: image_tags()[k] for k in keys.values()}


def test_selectors_select_their_workloads(rendered: dict[str, list[dict]]) -> None:
    for values, objects in rendered.items():
        pods = [o["spec"]["template"]["metadata"]["labels"] for o in objects if o["kind"] in WORKLOADS]
        pods += [o["spec"]["podTemplate"]["metadata"]["labels"] for o in objects if o["kind"] == "FlinkDeployment"]
        services = [o["metadata"]["labels"] for o in objects if o["kind"] == "Service"]
        workloads = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in WORKLOADS}

        def selects(selector: dict, labels: list[dict]) -> bool:
            return any(selector.items() <= candidate.items() for candidate in labels)

        for obj in objects:
            kind, spec, where = obj["kind"], obj.get("spec", {}), f"{values}: {obj['kind']}/{obj['metadata']['name']}"
            if kind == "Service":
                assert selects(spec["selector"], pods), where
            if kind in WORKLOADS:
                assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(), where
            if kind in {"PodDisruptionBudget", "PodMonitor"}:
                assert selects(spec["selector"]["matchLabels"], pods), where
            if kind == "ServiceMonitor":
                assert selects(spec["selector"]["matchLabels"], services), where
            if kind in {"HorizontalPodAutoscaler", "ScaledObject"}:
                target = spec["scaleTargetRef"]
                assert (target.get("kind", "Deployment"), target["name"]) in workloads, where


def test_every_topic_is_a_kafka_topic(rendered: dict[str, list[dict]]) -> None:
    """Loopline's topics and the shipped chart's project's (the fraud template, the images' default)."""
    wanted = (*TOPICS, *FRAUD.topics)
    for values, objects in rendered.items():
        topics = {o["spec"]["topicName"]: o["spec"] for o in objects if o["kind"] == "KafkaTopic"}
        assert set(topics) == {t.name for t in wanted}, values
        for spec in wanted:
            topic = topics[spec.name]
            assert (topic["partitions"], topic["config"]["retention.ms"], topic["config"]["cleanup.policy"]) == (
                spec.partitions,
                spec.retention_ms,
                spec.cleanup_policy,
            )
    replicated = next(o for o in rendered["production"] if o["kind"] == "KafkaTopic")["spec"]
    assert (replicated["replicas"], replicated["config"]["min.insync.replicas"]) == (3, 2)
    keda = next(o for o in rendered["production"] if o["kind"] == "ScaledObject")["spec"]
    assert keda["maxReplicaCount"] == next(t.partitions for t in TOPICS if t.name == keda["triggers"][0]["metadata"]["topic"])


def test_every_alert_rule_is_in_the_chart(rendered: dict[str, list[dict]]) -> None:
    groups = [group for path in stack_rule_files() for group in yaml.safe_load(path.read_text())["groups"]]
    for values, objects in rendered.items():
        (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
        assert rule["spec"]["groups"] == groups, values


def _monitor_jobs(objects: list[dict]) -> set[str]:
    """The job label each rendered monitor's endpoints give their targets (a relabeling that sets it)."""
    endpoints = [
        e
        for o in objects
        if o["kind"] in {"ServiceMonitor", "PodMonitor"}
        for e in o["spec"].get("endpoints", []) + o["spec"].get("podMetricsEndpoints", [])
    ]
    return {r["replacement"] for e in endpoints for r in e.get("relabelings", []) if r.get("targetLabel") == "job"}


def test_every_job_a_rule_selects_is_a_monitors(rendered: dict[str, list[dict]]) -> None:
    """An up{job="X"} alert with no target of job X can never fire."""
    for values, objects in rendered.items():
        (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
        selected = {
            job for group in rule["spec"]["groups"] for r in group["rules"] for job in re.findall(r'job="([^"]+)"', r["expr"])
        }
        assert selected >= {"loopline-feature-job", "loopline-monitor"}
        assert selected <= _monitor_jobs(objects), f"{values}: no monitor scrapes {sorted(selected - _monitor_jobs(objects))}"


def _replicas(objects: list[dict], deployment: str) -> int:
    """The fewest replicas a workload runs: its autoscaler's minimum, else its own count."""
    scalers = [
        o["spec"]
        for o in objects
        if o["kind"] in {"HorizontalPodAutoscaler", "ScaledObject"} and o["spec"]["scaleTargetRef"]["name"] == deployment
    ]
    if scalers:
        return scalers[0].get("minReplicas", scalers[0].get("minReplicaCount"))
    return next(o for o in objects if o["kind"] in WORKLOADS and o["metadata"]["name"] == deployment)["spec"]["replicas"]


def test_no_disruption_budget_blocks_a_node_drain(rendered: dict[str, list[dict]]) -> None:
    """A PDB whose minAvailable is its workload's replicas (1 of 1) lets no pod be evicted, so no node drains."""
    budgets = [(values, o) for values, o in _all(rendered) if o["kind"] == "PodDisruptionBudget"]
    assert {values for values, _ in budgets} == set(VALUES)
    for values, budget in budgets:
        spec, name = budget["spec"], budget["metadata"]["name"]
        assert ("minAvailable" in spec) != ("maxUnavailable" in spec), f"{values}: {name}"
        assert spec.get("maxUnavailable", 1) >= 1 and spec.get("minAvailable", 0) < _replicas(rendered[values], name), (
            f"{values}: {name}: {spec}"
        )
    production = {o["metadata"]["name"]: o["spec"] for values, o in budgets if values == "production"}
    assert production["loopline-scorer"]["minAvailable"] == 2


def test_the_training_runtime_runs_on_the_training_nodes(rendered: dict[str, list[dict]]) -> None:
    values = yaml.safe_load((CHART / "values-production.yaml").read_text())["training"]
    (runtime,) = [o for o in rendered["production"] if o["kind"] == "ClusterTrainingRuntime"]
    (pod,) = _pod_specs(runtime)
    assert (pod["nodeSelector"], pod["tolerations"]) == (values["nodeSelector"], values["tolerations"])


def test_the_settings_hooks_are_reapplied_at_rollback(rendered: dict[str, list[dict]]) -> None:
    hooks = [
        o
        for o in rendered["default"]
        if o["kind"] in {"ConfigMap", "Secret"} and o["metadata"]["name"] in {"loopline-settings", "loopline-secrets"}
    ]
    assert len(hooks) == 2
    for hook in hooks:
        assert set(hook["metadata"]["annotations"]["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade", "pre-rollback"}


def test_what_the_chart_repeats_is_the_settings_defaults(rendered: dict[str, list[dict]], helm: Path) -> None:
    """Where the chart falls back to a setting's default (no `settings:` naming it), it is Loopline's default."""
    objects = {(o["kind"], o["metadata"]["name"]): o for o in rendered["production"]}
    keda = objects["ScaledObject", "loopline-scorer-kafka"]["spec"]["triggers"][0]["metadata"]
    assert keda["consumerGroup"] == ServingSettings().kafka_group_id
    (monitor,) = objects["Deployment", "loopline-monitor"]["spec"]["template"]["spec"]["containers"]
    assert monitor["ports"] == [{"name": "http", "containerPort": MonitorSettings().metrics_port}]
    for door in (("Deployment", "loopline-scorer"), ("StatefulSet", "loopline-scorer-kafka")):
        assert objects[door]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > ServingSettings().shutdown_timeout_s
    longer = render(overrides={"settings.serving.shutdown_timeout_s": 100}, helm=helm)
    scorer = next(o for o in longer if o["kind"] == "Deployment" and o["metadata"]["name"] == "loopline-scorer")
    assert scorer["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 100


def test_generated_chart_files_are_current() -> None:
    assert stale_files() == [], "run `python -m loopline.chart_files`"


@pytest.mark.parametrize("values", VALUES)
def test_flink_deployments_run_what_print_command_prints(rendered: dict[str, list[dict]], values: str) -> None:
    commands = {"loopline-feature-job": ["stream", "submit"], "loopline-feedback-joiner": ["feedback", "join"]}
    deployments = [o for o in rendered[values] if o["kind"] == "FlinkDeployment"]
    assert {d["metadata"]["name"] for d in deployments} == set(commands)
    for deployment in deployments:
        job = deployment["spec"]["job"]
        printed = CliRunner().invoke(
            app,
            [
                *commands[deployment["metadata"]["name"]],
                "--jobmanager",
                "jobmanager:8081",
                "--print-command",
                "--image",
                "--parallelism",
                str(job["parallelism"]),
            ],
        )
        assert printed.exit_code == 0, printed.output
        line = printed.output.split()
        assert job["args"] == line[line.index("--pyModule") :]
        assert (job["entryClass"], job["jarURI"]) == (PYTHON_DRIVER, FlinkImage().python_jar(version("apache-flink")))
        assert (job["upgradeMode"], deployment["spec"]["flinkConfiguration"]["high-availability.type"]) == (
            "last-state",
            "kubernetes",
        )


def _pod_settings(rendered: list[dict], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's settings made the scorer pod's: the chart's settings file and the pod's environment (the
    Secret's values), and no other LOOPLINE_* variable."""
    (config,) = [o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "loopline-settings"]
    path = tmp_path / "loopline.yaml"
    path.write_text(config["data"]["loopline.yaml"])
    for name in [n for n in os.environ if n.startswith("LOOPLINE_")]:
        monkeypatch.delenv(name)
    (scorer,) = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"] == "loopline-scorer"]
    for name, value in pod_environment(rendered, scorer["spec"]["template"]["spec"]["containers"][0], "scorer-0").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOOPLINE_CONFIG", str(path))


@pytest.mark.parametrize("values", VALUES)
def test_the_settings_the_pods_read_are_valid(
    rendered: dict[str, list[dict]], values: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _pod_settings(rendered[values], tmp_path, monkeypatch)
    settings = Settings()
    assert settings.serving.host == "0.0.0.0" and settings.kafka.bootstrap.endswith(":9092")
    assert settings.kafka.replication.factor == (3 if values == "production" else 1)
    assert settings.checkpoint_dir.endswith("/checkpoints/features")
    # The Redis is the Secret's (redis-nodes), not the settings file's.
    assert "nodes" not in yaml.safe_load(Path(os.environ["LOOPLINE_CONFIG"]).read_text())["redis"]
    assert settings.redis.nodes == yaml.safe_load((CHART / "values.yaml").read_text())["redis"]["nodes"]


def test_the_image_entry_runs_the_job_with_the_pods_settings(
    rendered: dict[str, list[dict]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a FlinkDeployment's args start (loopline/flink_image_job.py): the job module, given the settings of the pod's
    ConfigMap and Secret (a password from the environment, never from the args), at the args' parallelism, with the
    image's jars."""
    jars = {
        "connector": flink_connector_jar(Settings().resolved_jars_dir),
        "features": feature_operators_jar(Settings()),
        "joiner": joiner_operators_jar(Settings()),
    }
    image = FlinkImage(flink_home=tmp_path / "flink")
    image.lib.mkdir(parents=True)
    for jar in jars.values():
        (image.lib / jar.name).symlink_to(jar)
    _pod_settings(rendered["production"], tmp_path, monkeypatch)
    monkeypatch.setenv("LOOPLINE_REDIS__PASSWORD", "from-the-secret")
    monkeypatch.setenv("LOOPLINE_PROJECT", str(template_path("fraud")))  # the project the image bakes (its environment)
    module, (features,) = job_arguments(FEATURE_JOB, 6, image)
    job = JobSettings.from_json(features)
    assert (module, job.parallelism, job.metrics_port) == ("streams.feature_job", 6, None)
    assert job.project_path == template_path("fraud") and job.source_topics == {}, "the project's topics as it names them"
    assert (job.connector_jar, job.operators_jar) == (image.lib / jars["connector"].name, image.lib / jars["features"].name)
    assert (
        "password=from-the-secret" in job.redis_connection
        and job.checkpoint_dir == "file:///var/lib/loopline/flink/checkpoints/features"
    )
    module, (joiner,) = job_arguments(JOINER, 2, image)
    assert (module, JoinerSettings.from_json(joiner).operators_jar) == (
        "feedback_loop.joiner_job",
        image.lib / jars["joiner"].name,
    )


def test_a_replaced_kafka_door_pod_keeps_its_transactional_id(rendered: dict[str, list[dict]]) -> None:
    """The exactly-once door runs as a StatefulSet: its pods are named by ordinal, the same for a replacement, and each
    takes its name as its instance (its transactional id's suffix), so a successor fences its predecessor's open
    transaction on its first call; the governing Service exists and the autoscaler scales the StatefulSet."""
    for values, objects in rendered.items():
        by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        door = by_name["StatefulSet", "loopline-scorer-kafka"]
        assert ("Deployment", "loopline-scorer-kafka") not in by_name, values
        spec = door["spec"]
        governing = by_name["Service", spec["serviceName"]]["spec"]
        assert spec["podManagementPolicy"] == "Parallel" and governing["clusterIP"] == "None", values
        (container,) = spec["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["LOOPLINE_SERVING__INSTANCE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, values
        for scaler in (o for o in objects if o["kind"] == "ScaledObject"):
            assert scaler["spec"]["scaleTargetRef"]["kind"] == "StatefulSet", values
