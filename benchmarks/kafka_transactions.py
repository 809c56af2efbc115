"""What one exactly-once transaction of the Kafka door costs: back-to-back transactions, librdkafka's retry backoff
against the door's.

On a private stack (127.0.0.1 only), a transactional producer does what the door's writer does for each transaction
(``online/kafka_transactions.py``): begin, produce a batch of prediction-sized records, send the consumer group's offsets,
commit; the next transaction begins at once, as the door's does when requests keep coming. Two producers take turns
in rounds of 20 (so the first of each round follows the other producer's), alike but for ``retry.backoff.ms``:
librdkafka's default, and the door's ``TRANSACTION_RETRY_BACKOFF`` (a transaction begun while the last one's markers are
still being written is answered CONCURRENT_TRANSACTIONS and retried after that backoff). Figures: per setting, p50/p99 of
the whole transaction and of ``send_offsets_to_transaction`` and ``commit_transaction``; the ratio of the default's p50 to
the door's, computed here. Machine: the 2-core box this runs on, the broker on it. The last line printed is one JSON
object.

    python benchmarks/kafka_transactions.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.progress import track

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import percentile, private_stack, report  # noqa: E402  (this folder)
from infra.service import wait_until  # noqa: E402
from online.kafka_scoring import DOOR_CLIENT_DEFAULTS, door_consumer_settings  # noqa: E402
from online.kafka_transactions import TRANSACTION_RETRY_BACKOFF  # noqa: E402
from schemas.kafka_config import transactional_producer_settings  # noqa: E402
from schemas.topics import PREDICTIONS, SCORE_REQUESTS  # noqa: E402

console = Console()
#: Records per transaction: a polled batch at ~1,000 requests/s.
BATCH = 64
RECORD = b"p" * 400
#: Transactions each setting runs before its figures count (connections, coordinator lookups).
WARM_UP = 10


def _assigned_consumer(bootstrap: str, client_config: dict[str, str], group_id: str) -> Consumer:
    """A member of ``group_id`` holding the requests topic's partitions: its metadata is what a transaction's offsets
    are sent with."""
    consumer = Consumer(door_consumer_settings(bootstrap, client_config, group_id))
    consumer.subscribe([SCORE_REQUESTS.name])

    def assigned() -> bool:
        consumer.poll(0.2)  # the group's join happens inside poll
        return bool(consumer.assignment())

    if not wait_until(assigned, 60, 0.0):
        raise RuntimeError(f"{group_id} was assigned no partition of {SCORE_REQUESTS.name} within 60 s")
    return consumer


def _transaction(producer: Producer, consumer: Consumer, n: int) -> tuple[float, float, float]:
    """One of the door's transactions: (total, send_offsets, commit) in milliseconds."""
    began = time.perf_counter()
    producer.begin_transaction()
    for i in range(BATCH):
        producer.produce(PREDICTIONS.name, RECORD, f"r{n}-{i}")
    offsets_at = time.perf_counter()
    offsets = [TopicPartition(p.topic, p.partition, n + 1) for p in consumer.assignment()]
    producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 10)
    commit_at = time.perf_counter()
    producer.commit_transaction(10)
    ended = time.perf_counter()
    return (ended - began) * 1e3, (commit_at - offsets_at) * 1e3, (ended - commit_at) * 1e3


def _summary(name: str, rows: list[tuple[float, float, float]]) -> dict:
    figures = {}
    for column, part in enumerate(("transaction", "send_offsets", "commit")):
        values = [row[column] for row in rows]
        figures[f"{name}_{part}_p50_ms"] = round(statistics.median(values), 2)
        figures[f"{name}_{part}_p99_ms"] = round(percentile(values, 0.99), 2)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 transactions per setting (within a minute)")
    args = parser.parse_args()
    per_setting = 100 if args.quick else 600
    began = time.monotonic()
    with private_stack(console, "loopline-txn-") as settings:
        bootstrap, client_config = settings.kafka.bootstrap, settings.kafka.client_config
        consumer = _assigned_consumer(bootstrap, client_config, f"txn-bench-{uuid.uuid4().hex[:8]}")
        settings_by_name = {"librdkafka_default": {}, "door": TRANSACTION_RETRY_BACKOFF}
        producers = {}
        for name, extra in settings_by_name.items():
            # Built as the door builds its producer, the setting among its defaults: a client_config wins in both alike.
            transactional_id = f"txn-bench-{name}-{uuid.uuid4().hex[:8]}"
            producer = Producer(
                transactional_producer_settings(bootstrap, client_config, transactional_id, {**DOOR_CLIENT_DEFAULTS, **extra})
            )
            producer.init_transactions(30)
            for n in range(WARM_UP):
                _transaction(producer, consumer, n)
            producers[name] = producer
        rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in producers}
        # The two take turns in rounds, so a slower moment of the machine falls on both.
        rounds, per_round = per_setting // 20, 20
        for r in track(range(rounds), description="transactions", console=console):
            for name, producer in producers.items():
                rows[name] += [_transaction(producer, consumer, WARM_UP + r * per_round + i) for i in range(per_round)]
        consumer.close()
    figures: dict = {
        "records_per_transaction": BATCH,
        "transactions_per_setting": per_setting,
        "door_retry_backoff_ms": TRANSACTION_RETRY_BACKOFF["retry.backoff.ms"],
    }
    for name, measured in rows.items():
        figures |= _summary(name, measured)
    figures["default_over_door_transaction_p50"] = round(
        figures["librdkafka_default_transaction_p50_ms"] / figures["door_transaction_p50_ms"], 2
    )
    report(
        console,
        "exactly-once transactions, back to back",
        args.quick,
        figures,
        {
            "door_transaction_p50_ms": f"librdkafka's default: {figures['librdkafka_default_transaction_p50_ms']} ms",
        },
        began,
    )


if __name__ == "__main__":
    main()
