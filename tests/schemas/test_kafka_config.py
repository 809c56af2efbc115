"""schemas/kafka_config.py: one precedence rule for every Kafka client's settings, refusals, masked secrets. No stack."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from schemas.kafka_config import (
    MASK,
    KafkaSettingConflict,
    Requirement,
    admin_settings,
    client_settings,
    consumer_settings,
    is_secret,
    masked,
    producer_settings,
    transactional_producer_settings,
)

TLS = {"security.protocol": "SASL_SSL", "sasl.username": "loopline", "sasl.password": "s3cret-pw"}


def test_defaults_then_the_users_config_then_what_correctness_requires() -> None:
    settings = client_settings(
        "b:9092",
        {"linger.ms": "50", "security.protocol": "SSL"},
        defaults={"linger.ms": 5, "compression.type": "lz4"},
        required={"enable.idempotence": Requirement(True, "no duplicates")},
    )
    assert settings == {
        "linger.ms": "50",
        "compression.type": "lz4",
        "security.protocol": "SSL",
        "bootstrap.servers": "b:9092",
        "enable.idempotence": True,
    }


def test_each_client_kind_carries_its_requirements_over_the_users_tuning() -> None:
    producer = producer_settings("b", {**TLS, "linger.ms": "20"}, {"linger.ms": 5})
    assert producer["acks"] == "all" and producer["enable.idempotence"] is True and producer["linger.ms"] == "20"
    assert producer["sasl.password"] == "s3cret-pw", "the client itself gets the plain secret"
    transactional = transactional_producer_settings("b", TLS, "door-1", {"retry.backoff.ms": 20})
    assert transactional["transactional.id"] == "door-1" and transactional["retry.backoff.ms"] == 20
    consumer = consumer_settings("b", TLS, "group-a", {"session.timeout.ms": 10_000})
    assert consumer["group.id"] == "group-a" and consumer["enable.auto.commit"] is False
    assert consumer["isolation.level"] == "read_committed" and consumer["auto.offset.reset"] == "earliest"
    assert "isolation.level" not in consumer_settings("b", None, "sizes", read_committed=False)
    assert admin_settings("b", TLS, {"log_level": 0}) == {**TLS, "log_level": 0, "bootstrap.servers": "b"}


@pytest.mark.parametrize(
    ("build", "key", "value"),
    [
        (lambda config: producer_settings("b", config), "acks", "1"),
        (lambda config: producer_settings("b", config), "enable.idempotence", "false"),
        (lambda config: transactional_producer_settings("b", config, "ours"), "transactional.id", "theirs"),
        (lambda config: consumer_settings("b", config, "g"), "enable.auto.commit", "true"),
        (lambda config: consumer_settings("b", config, "g"), "isolation.level", "read_uncommitted"),
        (lambda config: consumer_settings("b", config, "g"), "group.id", "mine"),
        (lambda config: admin_settings("b", config), "bootstrap.servers", "elsewhere:9092"),
    ],
)
def test_a_user_setting_that_contradicts_a_requirement_is_refused_with_the_key_and_the_fix(build, key, value) -> None:
    with pytest.raises(KafkaSettingConflict) as refused:
        build({key: value})
    message = str(refused.value)
    assert f"kafka.client_config sets {key}=" in message and "fix: remove" in message


def test_a_user_setting_equal_to_the_requirement_passes_in_any_spelling() -> None:
    assert producer_settings("b", {"acks": "-1", "enable.idempotence": "true"})["acks"] == "all"
    assert consumer_settings("b", {"enable.auto.commit": "False", "isolation.level": "read_committed"}, "g")["group.id"] == "g"


def test_a_refusal_of_a_secret_key_does_not_print_its_value() -> None:
    with pytest.raises(KafkaSettingConflict) as refused:
        client_settings("b", {"sasl.password": "s3cret-pw"}, required={"sasl.password": Requirement("x", "test")})
    assert "s3cret-pw" not in str(refused.value) and MASK in str(refused.value)


def test_secrets_print_masked_in_either_key_spelling_and_reach_the_client_plain() -> None:
    config = {**TLS, "ssl.key.password": "k3y", "sasl_oauthbearer_token": "t0k", "ssl.ca.location": "/ca.pem"}
    assert masked(config) == {**config, "sasl.password": MASK, "ssl.key.password": MASK, "sasl_oauthbearer_token": MASK}
    assert masked({"x": SecretStr("typed")}) == {"x": MASK}
    typed = {**TLS, "sasl.password": SecretStr("s3cret-pw")}
    assert producer_settings("b", typed)["sasl.password"] == "s3cret-pw", "a client takes a typed secret's plain text"
    assert is_secret("sasl.jaas.config") and is_secret("ssl_key") and not is_secret("ssl.certificate.location")


#: A careless or hostile client_config: any keys (the ones the consumer needs among them), any text values.
_KEYS = st.sampled_from(["group.id", "enable.auto.commit", "auto.offset.reset", "isolation.level", "bootstrap.servers"])
_CONFIGS = st.dictionaries(_KEYS | st.text(max_size=30), st.text(max_size=50), max_size=8)


@given(_CONFIGS)
def test_no_client_config_ever_changes_what_a_consumer_needs(config: dict[str, str]) -> None:
    needs = {
        "bootstrap.servers": "b:9092",
        "group.id": "g",
        "enable.auto.commit": "false",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    try:
        settings = consumer_settings("b:9092", config, "g")
    except KafkaSettingConflict as refused:
        assert any(f"sets {key}=" in str(refused) for key in needs), refused
        return
    assert {key: str(settings[key]).lower() for key in needs} == needs
    assert all(settings[key] == value for key, value in config.items() if key not in needs)
