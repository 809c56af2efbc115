"""Create or update Kafka topics from their specs with the Kafka admin API, idempotently."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, IsolationLevel, KafkaException, Message, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from schemas.kafka_config import admin_settings, consumer_settings
from schemas.topics import TopicSpec
from streams.errors import StreamsError

_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class TopicChange:
    """What ``apply_topics`` did to one topic."""

    topic: str
    action: str  # "created", "updated" or "unchanged"
    detail: str = ""


class TopicSpecError(StreamsError, ValueError):
    """A topic spec cannot be applied to the existing topic (for example fewer partitions)."""


def _admin(bootstrap_servers: str, client_config: Mapping[str, str] | None) -> AdminClient:
    return AdminClient(admin_settings(bootstrap_servers, client_config))


def _wait_until_usable(admin: AdminClient, names: list[str]) -> None:
    """Block until every partition of ``names`` answers a ListOffsets request, so the topics are usable on return.

    Metadata names a leader a moment before that leader serves the partition; clients that ask
    for offsets in between get NOT_LEADER_FOR_PARTITION.
    """
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        topics = admin.list_topics(timeout=_TIMEOUT_S).topics
        if all(name in topics and topics[name].partitions for name in names):
            requests = {
                TopicPartition(name, partition): OffsetSpec.latest() for name in names for partition in topics[name].partitions
            }
            try:
                for future in admin.list_offsets(requests, request_timeout=_TIMEOUT_S).values():
                    future.result()
                return
            except KafkaException:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {', '.join(names)} not usable after {_TIMEOUT_S:.0f} s")
        time.sleep(0.1)


def apply_topics(
    bootstrap_servers: str,
    specs: Iterable[TopicSpec],
    client_config: Mapping[str, str] | None = None,
    replication_factor: int = 1,
    min_insync_replicas: int = 1,
) -> list[TopicChange]:
    """Make the cluster's topics match ``specs``: create missing ones (``replication_factor`` replicas each, writes
    acknowledged by ``min_insync_replicas`` of them), add partitions, set configs.

    Running it again changes nothing. Kafka cannot remove partitions, so a spec with fewer
    partitions than the topic has raises TopicSpecError; a topic with another replica count is
    reported (changing it is a partition reassignment, ``kafka-reassign-partitions``), not changed.
    """
    admin = _admin(bootstrap_servers, client_config)
    specs = list(specs)
    existing = admin.list_topics(timeout=_TIMEOUT_S).topics
    changes: list[TopicChange] = []

    def configs(spec: TopicSpec, replicas: int = replication_factor) -> dict[str, str]:
        # A min ISR above a topic's replicas would refuse every acks=all write to it (a topic made before the stack
        # grew keeps its replicas): it is held at their count.
        return {**spec.configs(), "min.insync.replicas": str(min(min_insync_replicas, replicas))}

    to_create = [spec for spec in specs if spec.name not in existing]
    if to_create:
        futures = admin.create_topics(
            [
                NewTopic(s.name, num_partitions=s.partitions, replication_factor=replication_factor, config=configs(s))
                for s in to_create
            ],
            operation_timeout=_TIMEOUT_S,
        )
        for spec in to_create:
            futures[spec.name].result()
            changes.append(TopicChange(spec.name, "created", f"{spec.partitions} partitions × {replication_factor} replicas"))
        _wait_until_usable(admin, [spec.name for spec in to_create])

    present = [spec for spec in specs if spec.name in existing]
    if not present:
        return changes
    resources = [ConfigResource(ConfigResource.Type.TOPIC, spec.name) for spec in present]
    current_configs = {res.name: future.result() for res, future in admin.describe_configs(resources).items()}
    for spec in present:
        details = []
        have = len(existing[spec.name].partitions)
        if have > spec.partitions:
            raise TopicSpecError(
                f"topic {spec.name} has {have} partitions but its spec asks for {spec.partitions}; "
                "Kafka cannot remove partitions (recreate the topic or raise the spec)"
            )
        if have < spec.partitions:
            admin.create_partitions([NewPartitions(spec.name, spec.partitions)])[spec.name].result()
            details.append(f"partitions {have} -> {spec.partitions}")
        notes = []
        replicas = {len(partition.replicas) for partition in existing[spec.name].partitions.values()}
        if replicas != {replication_factor}:
            notes.append(
                f"keeps {'/'.join(map(str, sorted(replicas)))} replicas (settings: {replication_factor}; "
                "reassign its partitions to change)"
            )
        if min(replicas) < min_insync_replicas:
            notes.append(f"min ISR held at {min(replicas)} (settings: {min_insync_replicas}): it has {min(replicas)} replicas")
        wanted = configs(spec, min(replicas))
        drifted = {key: value for key, value in wanted.items() if current_configs[spec.name][key].value != value}
        if drifted:
            resource = ConfigResource(
                ConfigResource.Type.TOPIC,
                spec.name,
                incremental_configs=[
                    ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET) for key, value in drifted.items()
                ],
            )
            admin.incremental_alter_configs([resource])[resource].result()
            details.extend(f"{key}={value}" for key, value in drifted.items())
        changes.append(TopicChange(spec.name, "updated" if details else "unchanged", ", ".join(details + notes)))
    return changes


def open_transaction_partitions(
    bootstrap_servers: str, names: Iterable[str], client_config: Mapping[str, str] | None = None
) -> list[str]:
    """``topic-partition`` of each partition of ``names`` whose last stable offset lags its end: a transaction is
    open on it (read_committed readers stop there until it ends)."""
    admin = _admin(bootstrap_servers, client_config)
    topics = admin.list_topics(timeout=_TIMEOUT_S).topics
    partitions = [TopicPartition(name, p) for name in names if name in topics for p in topics[name].partitions]

    def offsets(isolation: IsolationLevel) -> dict[tuple[str, int], int]:
        requests = {tp: OffsetSpec.latest() for tp in partitions}
        answers = admin.list_offsets(requests, isolation_level=isolation, request_timeout=_TIMEOUT_S)
        return {(tp.topic, tp.partition): future.result().offset for tp, future in answers.items()}

    ends, stable = offsets(IsolationLevel.READ_UNCOMMITTED), offsets(IsolationLevel.READ_COMMITTED)
    return sorted(f"{topic}-{partition}" for (topic, partition), end in ends.items() if stable[topic, partition] < end)


def topic_sizes(bootstrap_servers: str, names: Iterable[str], client_config: Mapping[str, str] | None = None) -> dict[str, int]:
    """Records currently held by each topic (high minus low watermark, summed over partitions)."""
    consumer = Consumer(consumer_settings(bootstrap_servers, client_config, "loopline-topic-sizes", read_committed=False))
    try:
        topics = consumer.list_topics(timeout=_TIMEOUT_S).topics
        sizes = {}
        for name in names:
            if name not in topics:
                continue
            total = 0
            for partition in topics[name].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=_TIMEOUT_S)
                total += high - low
            sizes[name] = total
        return sizes
    finally:
        consumer.close()


def read_topic(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    since_ms: int | None = None,
) -> list[Message]:
    """Every committed record ``topic`` holds now (read_committed, from each partition's start to its end); with
    ``since_ms``, from each partition's first record whose Kafka timestamp is at or after it."""
    return read_topic_from(bootstrap_servers, topic, client_config, timeout_s, since_ms=since_ms).messages


@dataclass(frozen=True)
class TopicRead:
    """What ``read_topic_from`` read: the records, and per partition the position the next read starts from."""

    messages: list[Message]
    positions: dict[int, int]


def read_topic_from(
    bootstrap_servers: str,
    topic: str,
    client_config: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    *,
    since_ms: int | None = None,
    positions: Mapping[int, int] | None = None,
) -> TopicRead:
    """The committed records of ``topic`` (read_committed) up to each partition's end now, from each partition's start;
    with ``since_ms``, from its first record whose Kafka timestamp is at or after it; with ``positions`` (an earlier
    read's; ``since_ms`` is then passed over), from there: a partition they do not name (added since) from its start,
    a position the topic no longer holds (retention) from its oldest record. The returned positions follow the last
    record read: a read from them starts with the first record this one did not return."""
    consumer = Consumer(consumer_settings(bootstrap_servers, client_config, "loopline-reader"))
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.list_topics(topic, timeout=_TIMEOUT_S).topics[topic].partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=_TIMEOUT_S) for tp in partitions}
        if positions is not None:
            ends = {p: (max(positions.get(p, low), low), high) for p, (low, high) in ends.items()}
        elif since_ms is not None:
            # offsets_for_times gives the first offset at or after the time (-1 when every record is older: start at the end);
            # a time before 1970 (a window reaching back past it) reads from the start, as 0 does.
            found = consumer.offsets_for_times([TopicPartition(topic, p, max(since_ms, 0)) for p in ends], timeout=_TIMEOUT_S)
            ends = {
                tp.partition: (
                    ends[tp.partition][1] if tp.offset < 0 else max(tp.offset, ends[tp.partition][0]),
                    ends[tp.partition][1],
                )
                for tp in found
            }
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ends.items()])
        # Offsets count transaction markers and aborted records too: read until each position reaches its end.
        reached = {p: low for p, (low, _) in ends.items()}
        messages: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while any(reached[p] < high for p, (_, high) in ends.items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end within {timeout_s:.0f} s")
            messages += [m for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
            reached |= {tp.partition: tp.offset for tp in consumer.position(partitions) if tp.offset >= 0}
        return TopicRead(messages, reached)
    finally:
        consumer.close()
