"""The exactly-once Kafka door's transactions commit by time, at a record limit or on demand, on the real broker; a
failed one drops everything handed over until the door has rewound."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from infra.service import wait_until
from online.kafka_scoring import Output
from online.kafka_transactions import TRANSACTION_RETRY_BACKOFF, TransactionWriter, transactional_producer_config
from schemas.kafka_config import KafkaSettingConflict
from tests.support.kafka_log import LogReader

#: Topics of this module's own. The writer's records are not predictions (other tests decode every record of
#: scoring.predictions), and the offsets it commits are made up: on the real requests topic a group joining later
#: would start there, behind every earlier test's requests.
OUTPUT, INPUT = (f"test.kafka-transactions-{part}.{uuid.uuid4().hex[:8]}" for part in ("out", "in"))


class Member:
    """A consumer group member on the module's input topic (whose metadata a transaction's offsets are committed as)."""

    def __init__(self, bootstrap: str, group: str) -> None:
        self.group = group
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        self.consumer.subscribe([INPUT])
        assert wait_until(lambda: self.consumer.poll(0.2) is None and bool(self.consumer.assignment()), 60), "a group assignment"

    def metadata(self) -> object:
        return self.consumer.consumer_group_metadata()

    def committed(self, partition: int) -> int:
        return self.consumer.committed([TopicPartition(INPUT, partition)], timeout=10)[0].offset


class Writer:
    """A :class:`TransactionWriter` whose commits are kept: (the request ids, when) for each."""

    def __init__(self, bootstrap: str, interval_s: float, max_records: int = 1000) -> None:
        self.commits: list[tuple[list[str], float]] = []
        self.raise_after_commit = False
        self.stopping = threading.Event()
        transactional_id = f"test-{uuid.uuid4()}"
        config = transactional_producer_config(bootstrap, None, transactional_id, interval_s=interval_s, broker_timeout_s=10)
        self.writer = TransactionWriter(
            config,
            interval_s=interval_s,
            max_records=max_records,
            broker_timeout_s=10,
            committed=self._committed,
            stopping=self.stopping,
        )
        assert self.writer.start()

    def _committed(self, outputs: list[Output], at: float) -> None:
        self.commits.append(([o.key for o in outputs], time.monotonic()))
        if self.raise_after_commit:
            raise RuntimeError("the door's bookkeeping failed")

    def hand(self, member: Member, request_ids: list[str], next_offset: int) -> None:
        outputs = [Output(OUTPUT, rid.encode(), rid) for rid in request_ids]
        self.writer.hand(outputs, {(INPUT, 0): next_offset}, member.metadata())

    def close(self) -> None:
        self.stopping.set()
        self.writer.close()


@pytest.fixture(scope="module", autouse=True)
def topics(bootstrap: str) -> Iterator[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for created in admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1) for topic in (OUTPUT, INPUT)]
    ).values():
        created.result(30)
    yield OUTPUT
    for deleted in admin.delete_topics([OUTPUT, INPUT]).values():
        deleted.result(30)


@pytest.fixture
def member(bootstrap: str) -> Iterator[Member]:
    joined = Member(bootstrap, f"txn-{uuid.uuid4()}")
    yield joined
    joined.consumer.close()


def _ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


def _door_producer(client_config: dict | None, transactional_id: str = "t", interval_s: float = 0.05) -> dict:
    return transactional_producer_config("b", client_config, transactional_id, interval_s=interval_s, broker_timeout_s=10)


def test_the_producer_lowers_the_retry_backoff_unless_the_client_config_sets_it() -> None:
    assert _door_producer(None)["retry.backoff.ms"] == TRANSACTION_RETRY_BACKOFF["retry.backoff.ms"]
    assert _door_producer({"retry.backoff.ms": 250})["retry.backoff.ms"] == 250
    assert _door_producer(None, "ours")["transactional.id"] == "ours"
    with pytest.raises(KafkaSettingConflict, match=r"transactional\.id"):
        _door_producer({"transactional.id": "theirs"}, "ours")


def test_the_transaction_timeout_outlasts_what_the_writer_settles_and_is_below_librdkafkas_minute() -> None:
    """The broker never aborts a transaction the writer is still settling (its interval plus 1.5 broker timeouts), and
    one a crashed door left open holds read_committed readers well under librdkafka's default minute; the user's
    client_config still decides."""
    for interval_s in (0.05, 1.0):
        timeout_ms = _door_producer(None, interval_s=interval_s)["transaction.timeout.ms"]
        assert (interval_s + 1.5 * 10) * 1000 < timeout_ms < 60_000, (interval_s, timeout_ms)
    assert _door_producer({"transaction.timeout.ms": "90000"})["transaction.timeout.ms"] == "90000"


def test_chunks_handed_within_an_interval_commit_together_once_it_has_passed(bootstrap: str, member: Member) -> None:
    writer, reader = Writer(bootstrap, interval_s=1.0), LogReader(bootstrap, OUTPUT, from_end=True)
    first, second = _ids(2), _ids(3)
    try:
        handed = time.monotonic()
        writer.hand(member, first, 10)
        time.sleep(0.6)  # the second chunk is scored later, within the first's interval
        writer.hand(member, second, 15)
        assert wait_until(lambda: writer.commits, 30), "a commit"
        ((keys, at),) = writer.commits
        assert keys == first + second
        assert at - handed >= 1.0, "committed before its interval was over"
        # The interval runs from the first chunk: counted from the second, the commit would come after 1.6 s.
        assert at - handed < 1.5, f"committed {at - handed:.2f} s after the first chunk"
        assert wait_until(lambda: {v.decode() for v in reader.poll()} >= set(first + second), 30), "the records readable"
        assert member.committed(0) == 15
        assert writer.writer.pending == 0
    finally:
        writer.close()
        reader.close()


def test_a_transaction_commits_early_at_its_record_limit_or_when_asked_to_settle(bootstrap: str, member: Member) -> None:
    writer = Writer(bootstrap, interval_s=60.0, max_records=4)
    try:
        handed = time.monotonic()
        writer.hand(member, _ids(2), 2)
        writer.hand(member, _ids(2), 4)
        assert wait_until(lambda: writer.commits, 30), "a commit at the record limit"
        keys, at = writer.commits[0]
        assert len(keys) == 4 and at - handed < 10, "the record limit, not the 60 s interval, closed the transaction"
        later = _ids(1)
        writer.hand(member, later, 5)
        assert writer.writer.settle(), "settling did not commit"
        assert writer.commits[-1][0] == later and writer.writer.pending == 0
        assert member.committed(0) == 5
    finally:
        writer.close()


def test_a_failed_transaction_drops_what_was_handed_until_the_door_reopens(bootstrap: str) -> None:
    writer, reader = Writer(bootstrap, interval_s=0.2), LogReader(bootstrap, OUTPUT, from_end=True)
    member = Member(bootstrap, f"txn-{uuid.uuid4()}")
    other: Member | None = None
    try:
        writer.hand(member, committed := _ids(1), 1)
        assert wait_until(lambda: writer.commits, 30), "the first commit"
        stale = member.metadata()
        # The group moves on (its member leaves, another joins): offsets sent as the old member are refused, and the
        # transaction aborts.
        member.consumer.close()
        other = Member(bootstrap, member.group)
        lost = _ids(2)
        writer.writer.hand([Output(OUTPUT, rid.encode(), rid) for rid in lost], {(INPUT, 0): 3}, stale)
        assert wait_until(lambda: writer.writer.failed, 60), "the transaction to fail"
        assert writer.writer.pending == 0
        writer.hand(other, dropped := _ids(1), 4)  # handed before the door rewound: dropped
        assert writer.writer.pending == 0
        writer.writer.reopen()
        writer.hand(other, after := _ids(1), 4)
        assert wait_until(lambda: len(writer.commits) == 2, 30), "a commit after reopening"
        assert writer.commits[1][0] == after
        assert wait_until(lambda: after[0] in {v.decode() for v in reader.poll()}, 30), "the record after reopening"
        readable = {v.decode() for v in reader.poll()}
        assert committed[0] in readable and not readable & set(lost + dropped)
        assert other.committed(0) == 4
    finally:
        writer.close()
        reader.close()
        if other is not None:
            other.consumer.close()


def test_the_writer_goes_on_after_its_commit_callback_raises(bootstrap: str, member: Member) -> None:
    writer = Writer(bootstrap, interval_s=0.1)
    writer.raise_after_commit = True
    try:
        writer.hand(member, first := _ids(1), 1)
        assert wait_until(lambda: writer.commits, 30), "the first commit"
        writer.hand(member, second := _ids(1), 2)
        assert wait_until(lambda: len(writer.commits) == 2, 30), "no commit after the callback raised"
        assert [keys for keys, _ in writer.commits] == [first, second]
        assert not writer.writer.failed and member.committed(0) == 2
    finally:
        writer.close()
