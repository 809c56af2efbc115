"""Settings: defaults, LOOPLINE_* environment variables and the YAML file."""

from __future__ import annotations

import json
import os

import pytest

from feature_store.redis_connection import redis_client
from feedback_loop.settings import SkewThresholdSettings
from loopline.project import init_project
from loopline.settings import Settings, UnknownSettingError, forget_stack_shape, remember_stack_shape, settings_environment
from schemas.project import load_project
from tests.support.templates import FRAUD


def test_environment_overrides_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPLINE_KAFKA__PORT", "19999")
    monkeypatch.setenv("LOOPLINE_HOME", "/tmp/elsewhere")
    settings = Settings()
    assert settings.kafka.bootstrap == "127.0.0.1:19999"
    assert str(settings.resolved_data_dir) == "/tmp/elsewhere/data"


def test_yaml_file_is_read_and_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    config = tmp_path / "loopline.yaml"
    config.write_text("redis:\n  port: 16400\nkafka:\n  port: 19100\n")
    monkeypatch.setenv("LOOPLINE_CONFIG", str(config))
    monkeypatch.setenv("LOOPLINE_KAFKA__PORT", "19200")
    settings = Settings()
    assert settings.redis.port == 16400
    assert settings.kafka.port == 19200


def test_missing_config_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("LOOPLINE_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(FileNotFoundError, match=r"absent\.yaml"):
        Settings()


def test_invalid_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPLINE_REDIS__PORT", "70000")
    with pytest.raises(ValueError, match=r"redis\.port"):
        Settings()


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("LOOPLINE_REGISTRY__TRACKING_URI", "LOOPLINE_MODEL_REGISTRY__TRACKING_URI"),  # renamed: it would fall back silently
        ("LOOPLINE_SERVING__HTTP_PROT", "LOOPLINE_SERVING__HTTP_PORT"),
        ("LOOPLINE_STREEM__GROUP_ID", "LOOPLINE_STREAM__GROUP_ID"),
        ("LOOPLINE_KAFKA__PORT__X", "LOOPLINE_KAFKA__PORT"),
    ],
)
def test_a_variable_naming_no_setting_is_refused_with_the_closest_names(
    monkeypatch: pytest.MonkeyPatch, name: str, suggested: str
) -> None:
    monkeypatch.setenv(name, "1")
    with pytest.raises(UnknownSettingError, match=f"{name} names no setting .*did you mean {suggested}"):
        Settings()


def test_a_mapping_setting_takes_any_key_and_the_config_file_variable_is_not_a_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setenv("LOOPLINE_KAFKA__CLIENT_CONFIG__SECURITY_PROTOCOL", "SSL")
    monkeypatch.setenv("LOOPLINE_MONITOR__THRESHOLDS__PSI_ALERT", "0.3")
    config = tmp_path / "loopline.yaml"
    config.write_text("redis:\n  port: 16401\n")
    monkeypatch.setenv("LOOPLINE_CONFIG", str(config))
    settings = Settings()
    assert settings.kafka.client_config == {"security_protocol": "SSL"}  # pydantic-settings lower-cases the key
    assert settings.monitor.thresholds.psi_alert == 0.3 and settings.redis.port == 16401


def test_cluster_settings_reach_a_child_process_and_the_redis_clients(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    settings = Settings(
        kafka={"client_config": {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "ssl.ca.location": "/etc/ca.pem"}},
        redis={"host": "redis.internal", "port": 6380, "password": "p4ss", "ssl": True},
        serving={"auth_token": "t0ken", "limits": {"max_body_bytes": 4096}},
    )
    assert settings.redis_connection == "redis.internal:6380,password=p4ss,ssl=true"
    for name in [n for n in os.environ if n.startswith("LOOPLINE_")]:
        monkeypatch.delenv(name)
    for name, value in settings_environment(settings).items():
        if name.startswith("LOOPLINE_"):
            monkeypatch.setenv(name, value)
    child = Settings()
    assert child.kafka.client_config == settings.kafka.client_config
    assert child.redis_connection == settings.redis_connection
    assert (child.auth_token, child.serving.limits.max_body_bytes) == ("t0ken", 4096)
    client = redis_client(child.redis_connection)
    assert client.connection_pool.connection_kwargs["password"] == "p4ss"
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"


def test_the_project_is_found_where_the_command_runs_and_its_declarations_are_the_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    project = init_project(tmp_path / "shop", "fraud")
    monkeypatch.chdir(project / "feature_repo")  # below the project's folder, as `feast` runs in its repo
    settings = Settings()
    assert settings.project_path == project
    assert settings.feast_registry_path == project / "feature_repo" / "data" / "registry.db"
    assert (settings.serving.model_name, settings.serving.feature_budget_ms) == ("fraud", 20.0)
    assert (settings.feedback.labels_topic, settings.feedback.horizon_s) == ("events.labels", 7 * 86_400)
    assert settings.feedback.train_config == project / "model" / "train.yaml"
    monkeypatch.setenv("LOOPLINE_SERVING__MODEL_NAME", "fraud-v2")  # an operator's setting still wins
    assert Settings().serving.model_name == "fraud-v2"


def test_a_projects_skew_thresholds_are_the_monitors_settings_beneath_the_operators(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    project = init_project(tmp_path / "city", "delivery")
    monkeypatch.chdir(project)
    declared = load_project(project).spec.monitoring.skew_thresholds
    assert declared, "the delivery template declares its zone features' own thresholds"
    thresholds = Settings().monitor.feature_thresholds
    name, limits = next(iter(declared.items()))
    assert set(thresholds) == set(declared) and thresholds[name].psi_alert == limits["psi_alert"]
    assert thresholds[name].linf_alert == SkewThresholdSettings().linf_alert, "what the project leaves unset keeps the default"
    monkeypatch.setenv("LOOPLINE_MONITOR__FEATURE_THRESHOLDS", json.dumps({name: {"psi_alert": 9.0}}))
    operator = Settings().monitor.feature_thresholds[name]
    assert (operator.psi_alert, operator.js_alert) == (9.0, limits["js_alert"]), "the operator's value wins, key by key"
    monkeypatch.setenv("LOOPLINE_MONITOR__FEATURE_THRESHOLDS", json.dumps({name: {"psi_warn": 20.0}}))
    with pytest.raises(ValueError, match=r"psi_warn 20\.0 is above psi_alert"):
        Settings()


def test_without_a_project_a_command_says_how_to_make_one(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from schemas.project import ProjectError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProjectError, match="loopline init DIR --template fraud"):
        _ = Settings().project_path
    monkeypatch.setenv("LOOPLINE_PROJECT", str(tmp_path / "nowhere"))
    with pytest.raises(ProjectError, match="nowhere is not a Loopline project"):
        _ = Settings().project_path


@pytest.mark.parametrize("value", ["k1:9092, k2:9092,k3:9092", '["k1:9092", "k2:9092", "k3:9092"]'])
def test_a_kafka_cluster_is_named_by_a_list_of_brokers(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("LOOPLINE_KAFKA__BOOTSTRAP_SERVERS", value)
    kafka = Settings().kafka
    assert kafka.bootstrap_servers == ["k1:9092", "k2:9092", "k3:9092"]
    assert kafka.bootstrap == "k1:9092,k2:9092,k3:9092"
    monkeypatch.delenv("LOOPLINE_KAFKA__BOOTSTRAP_SERVERS")
    assert Settings(kafka={"port": 19092, "brokers": 3}).kafka.bootstrap == "127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096"


def test_a_broker_list_naming_no_broker_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPLINE_KAFKA__BOOTSTRAP_SERVERS", ",,,")
    with pytest.raises(ValueError, match="names no node"):
        Settings()


@pytest.mark.parametrize("value", ["r1:6379, r2:6380", '["r1:6379", "r2:6380"]'])
def test_an_external_redis_cluster_is_named_by_its_nodes(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """redis.nodes, not the stack's port + i (which behind one Service names addresses that do not exist), reach the
    connection string Feast and every Loopline Redis client parse their nodes from."""
    from feast.infra.online_stores.redis import RedisOnlineStore

    from feature_store.config import feast_config

    monkeypatch.setenv("LOOPLINE_REDIS__NODES", value)
    monkeypatch.setenv("LOOPLINE_REDIS__MODE", "cluster")
    monkeypatch.setenv("LOOPLINE_REDIS__PASSWORD", "p4ss")
    settings = Settings()
    assert settings.redis.nodes == ["r1:6379", "r2:6380"] and settings.redis_cluster
    assert settings.redis_connection == "r1:6379,r2:6380,password=p4ss"
    config = feast_config(None, settings.redis_connection, FRAUD.feature_repo, redis_cluster=settings.redis_cluster)
    assert (config.online_store.connection_string, config.online_store.redis_type) == (settings.redis_connection, "redis_cluster")
    nodes, params = RedisOnlineStore._parse_connection_string(config.online_store.connection_string)
    assert [(n["host"], int(n["port"])) for n in nodes] == [("r1", 6379), ("r2", 6380)] and params["password"] == "p4ss"
    child = {n: v for n, v in settings_environment(settings).items() if n.startswith("LOOPLINE_REDIS")}
    assert json.loads(child["LOOPLINE_REDIS__NODES"]) == ["r1:6379", "r2:6380"]
    monkeypatch.delenv("LOOPLINE_REDIS__NODES")
    assert Settings().redis_connection.split(",")[:6] == [f"127.0.0.1:{6379 + i}" for i in range(6)], "the stack's own"
    monkeypatch.setenv("LOOPLINE_REDIS__NODES", ", ,")
    with pytest.raises(ValueError, match="names no node"):
        Settings()


def test_replicas_must_fit_the_cluster() -> None:
    with pytest.raises(ValueError, match=r"min_insync_replicas \(3\) exceeds kafka\.replication_factor \(2\)"):
        Settings(kafka={"bootstrap_servers": ["k:9092"], "replication_factor": 2, "min_insync_replicas": 3})
    with pytest.raises(ValueError, match="replication_factor 3 needs as many brokers; the stack starts 1"):
        Settings(kafka={"replication_factor": 3})
    assert Settings(kafka={"brokers": 3, "replication_factor": 3, "min_insync_replicas": 2}).kafka.replication_factor == 3


def test_row_writes_wait_for_a_replica_where_the_shape_has_one() -> None:
    assert Settings().redis.replica_acks == 0, "one Redis: no replica to wait for"
    assert Settings(redis={"mode": "cluster", "cluster_replicas": 1}).redis.replica_acks == 1
    assert Settings(redis={"mode": "cluster", "cluster_replicas": 1, "write_acks": 0}).redis.replica_acks == 0
    assert Settings(redis={"nodes": ["r:7000"]}).redis.replica_acks == 0, "a Redis elsewhere: as its operator says"
    assert Settings(redis={"nodes": ["r:7000"], "write_acks": 2}).redis.replica_acks == 2
    with pytest.raises(ValueError, match="write_acks 2: the stack's own Redis has 1 replica"):
        Settings(redis={"mode": "cluster", "cluster_replicas": 1, "write_acks": 2})
    with pytest.raises(ValueError, match="write_acks 1: the stack's own Redis has 0 replica"):
        Settings(redis={"write_acks": 1})


def test_the_stack_shape_is_remembered_beneath_explicit_settings(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("LOOPLINE_HOME", str(tmp_path))
    assert Settings().kafka.brokers == 1
    remember_stack_shape(tmp_path, {"kafka": {"brokers": 3}})
    assert Settings().kafka.brokers == 3, "a later command sees the stack `stack up --kafka-brokers 3` started"
    monkeypatch.setenv("LOOPLINE_KAFKA__BROKERS", "2")
    assert Settings().kafka.brokers == 2, "an explicit setting wins"
    monkeypatch.delenv("LOOPLINE_KAFKA__BROKERS")
    forget_stack_shape(tmp_path)
    assert Settings().kafka.brokers == 1


def test_loopline_config_masks_the_secrets_in_the_kafka_client_config(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from typer.testing import CliRunner

    from loopline.cli import app

    config = tmp_path / "loopline.yaml"
    config.write_text(
        "kafka:\n  client_config:\n    security.protocol: SASL_SSL\n    sasl.username: loopline\n    sasl.password: s3cret-pw\n"
        "    ssl.key.password: k3y-pw\n    sasl.oauthbearer.client.secret: 0auth-secret\n"
        "    sasl.jaas.config: 'org.apache.kafka.common.security.plain.PlainLoginModule required password=\"j4as\";'\n"
    )
    monkeypatch.setenv("LOOPLINE_CONFIG", str(config))
    monkeypatch.setenv("LOOPLINE_KAFKA__CLIENT_CONFIG__SASL_OAUTHBEARER_TOKEN", "t0ken-env")
    monkeypatch.setenv("LOOPLINE_REDIS__PASSWORD", "redis-pw")
    result = CliRunner().invoke(app, ["config"])
    assert result.exit_code == 0, result.output
    for secret in ("s3cret-pw", "k3y-pw", "0auth-secret", "j4as", "t0ken-env", "redis-pw"):
        assert secret not in result.output
    shown = json.loads(result.output)
    masked = "**********"
    assert shown["kafka"]["client_config"] == {
        "security.protocol": "SASL_SSL",
        "sasl.username": "loopline",
        "sasl.password": masked,
        "ssl.key.password": masked,
        "sasl.oauthbearer.client.secret": masked,
        "sasl.jaas.config": masked,
        "sasl_oauthbearer_token": masked,
    }
    assert shown["redis"]["password"] == masked
    assert Settings().kafka.client_config["sasl.password"] == "s3cret-pw", "only the printout is masked"


def test_a_client_config_contradicting_what_a_client_needs_is_one_line_with_the_fix(tmp_path) -> None:
    import subprocess
    import sys

    project = init_project(tmp_path / "shop", "fraud")
    env = {
        **os.environ,
        "LOOPLINE_HOME": str(tmp_path / "home"),
        "LOOPLINE_PROJECT": str(project),
        "LOOPLINE_KAFKA__PORT": "1",
        "LOOPLINE_KAFKA__CLIENT_CONFIG": json.dumps({"bootstrap.servers": "elsewhere:9092"}),
    }
    refused = subprocess.run(
        [sys.executable, "-c", "from loopline.cli import main; main()", "topics", "apply"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    line = " ".join(refused.stderr.split())
    assert "kafka.client_config sets bootstrap.servers='elsewhere:9092'" in line and "fix: remove bootstrap.servers" in line
