"""Real Kafka: topics applied are what kcat sees; kcat-produced events are validated; bad ones are dead-lettered."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from infra.service import wait_until
from schemas import DeadLetterRecord, Record
from schemas.topics import DEAD_LETTERS, TOPICS, TopicSpec
from schemas.validation import decode
from streams.topics import TopicSpecError, apply_topics
from streams.validating_consumer import ValidatingConsumer
from tests.support.templates import FRAUD, TRANSACTIONS, TransactionEvent

#: The fraud project's transactions, read by their contract.
TRANSACTION_DECODER = {TRANSACTIONS.name: FRAUD.decoder(TRANSACTIONS.name)}


def kcat(bootstrap: str, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["kcat", "-b", bootstrap, *args], input=stdin, capture_output=True, text=True, check=True, timeout=30
    ).stdout


def test_applied_topics_are_visible_to_kcat(bootstrap: str) -> None:
    metadata = json.loads(kcat(bootstrap, "-L", "-J"))
    partitions = {topic["topic"]: len(topic["partitions"]) for topic in metadata["topics"]}
    for spec in TOPICS:
        assert partitions[spec.name] == spec.partitions


def test_topics_apply_is_idempotent_and_repairs_drift(bootstrap: str) -> None:
    topics = (*FRAUD.topics, *TOPICS)  # the session's project's and Loopline's own, as `loopline topics apply` applies them
    assert {change.action for change in apply_topics(bootstrap, topics)} == {"unchanged"}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    drifted = ConfigResource(
        ConfigResource.Type.TOPIC,
        TRANSACTIONS.name,
        incremental_configs=[ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([drifted])[drifted].result()
    # The broker applies config changes from the metadata log asynchronously: wait until it shows the drift.
    described = ConfigResource(ConfigResource.Type.TOPIC, TRANSACTIONS.name)
    assert wait_until(lambda: admin.describe_configs([described])[described].result()["retention.ms"].value == "1000", 10.0)
    changes = {change.topic: change for change in apply_topics(bootstrap, topics)}
    assert changes[TRANSACTIONS.name].action == "updated"
    assert f"retention.ms={TRANSACTIONS.retention_ms}" in changes[TRANSACTIONS.name].detail
    assert {change.action for change in apply_topics(bootstrap, topics)} == {"unchanged"}


def test_a_grown_shape_never_sets_a_min_isr_above_an_existing_topics_replicas(bootstrap: str) -> None:
    # The stack's topics were made with one replica; settings of a three-broker shape (3 replicas, 2 in sync) must not
    # give them a min ISR of 2, which would refuse every acks=all write to them.
    changes = {c.topic: c for c in apply_topics(bootstrap, [TRANSACTIONS], replication_factor=3, min_insync_replicas=2)}
    assert "keeps 1 replicas" in changes[TRANSACTIONS.name].detail and "min ISR held at 1" in changes[TRANSACTIONS.name].detail
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = ConfigResource(ConfigResource.Type.TOPIC, TRANSACTIONS.name)
    assert admin.describe_configs([described])[described].result()["min.insync.replicas"].value == "1"


def test_fewer_partitions_than_the_topic_has_is_refused(bootstrap: str) -> None:
    shrunk = TopicSpec(TRANSACTIONS.name, TransactionEvent, "user_id", partitions=2, retention_ms=TRANSACTIONS.retention_ms)
    with pytest.raises(TopicSpecError, match="cannot remove partitions"):
        apply_topics(bootstrap, [shrunk])


def _transaction(event_id: str) -> dict:
    return {
        "schema_version": 1,
        "event_id": event_id,
        "event_time_ms": 1_700_000_000_000,
        "user_id": "u-kcat",
        "merchant_id": "m00001",
        "amount": 42.0,
        "currency": "EUR",
        "merchant_category": "grocery",
        "channel": "online",
        "country": "DE",
    }


def test_kcat_events_are_validated_and_bad_ones_dead_lettered(bootstrap: str) -> None:
    good_id, bad_id = str(uuid.uuid4()), str(uuid.uuid4())
    bad = {**_transaction(bad_id), "amount": "lots"}
    lines = f"u-kcat|{json.dumps(_transaction(good_id))}\nu-kcat|{json.dumps(bad)}\nu-kcat|{{not json\n"
    kcat(bootstrap, "-P", "-t", TRANSACTIONS.name, "-p", "3", "-K", "|", stdin=lines)

    seen: list[Record] = []
    consumer = ValidatingConsumer(bootstrap, f"test-{uuid.uuid4()}", TRANSACTION_DECODER, DEAD_LETTERS.name, "test-validator")
    try:
        counts = consumer.run_until_caught_up(timeout_s=60, on_valid=lambda _t, record: seen.append(record))
    finally:
        consumer.close()
    assert good_id in {record.event_id for record in seen}
    assert bad_id not in {record.event_id for record in seen}
    assert counts[TRANSACTIONS.name].dead_lettered >= 2

    letters: list[DeadLetterRecord] = []
    reader = ValidatingConsumer(
        bootstrap,
        f"test-{uuid.uuid4()}",
        {DEAD_LETTERS.name: lambda b: decode(DeadLetterRecord, b)},
        DEAD_LETTERS.name,
        "test-reader",
    )
    try:
        reader.run_until_caught_up(timeout_s=60, on_valid=lambda _t, record: letters.append(record))
    finally:
        reader.close()
    ours = [letter for letter in letters if letter.key == "u-kcat" and letter.source_partition == 3]
    by_field = {letter.error_field: letter for letter in ours}
    assert by_field["amount"].reason == "invalid" and "valid number" in by_field["amount"].error
    assert json.loads(by_field["amount"].payload)["event_id"] == bad_id
    assert by_field["<payload>"].payload == "{not json"
    for letter in (by_field["amount"], by_field["<payload>"]):
        assert letter.source_topic == TRANSACTIONS.name and letter.consumer == "test-validator"
        original = kcat(bootstrap, "-C", "-t", TRANSACTIONS.name, "-p", "3", "-o", str(letter.source_offset), "-c", "1", "-e")
        assert original.rstrip("\n") == letter.payload


def test_committed_offsets_mean_nothing_is_read_twice(bootstrap: str) -> None:
    group = f"test-{uuid.uuid4()}"
    first = ValidatingConsumer(bootstrap, group, TRANSACTION_DECODER, DEAD_LETTERS.name)
    try:
        first.run_until_caught_up(timeout_s=60)
    finally:
        first.close()
    event_id = str(uuid.uuid4())
    kcat(bootstrap, "-P", "-t", TRANSACTIONS.name, "-K", "|", stdin=f"u-kcat|{json.dumps(_transaction(event_id))}\n")
    seen: list[Record] = []
    second = ValidatingConsumer(bootstrap, group, TRANSACTION_DECODER, DEAD_LETTERS.name)
    try:
        counts = second.run_until_caught_up(timeout_s=60, on_valid=lambda _t, record: seen.append(record))
    finally:
        second.close()
    assert [record.event_id for record in seen] == [event_id]
    assert counts[TRANSACTIONS.name].dead_lettered == 0
