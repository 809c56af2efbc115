"""The janitor's reading of ``kafka-transactions.sh find-hanging``: the table Kafka 4.4 printed for a transaction a
kill -9 of the lone broker left hanging (scorer's offsets and predictions, markers skipped as "Couldn't find leader
endpoint"), recorded from a fault drill. Its cells are padded to the column's width, which an exact match of the
header missed: the janitor then found nothing to abort. The drill (``tests/loopline/test_fault_drill.py``) runs the janitor on
the real broker and reports its aborts."""

from __future__ import annotations

from infra.kafka import parse_hanging_transactions

_HEADER = (
    "Topic              \tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\tLastTimestamp\tDuration(min)\t"
)
_FOUND = "\n".join(
    [
        "[2026-12-01 21:24:56,101] INFO Kafka version: 4.4.0 (org.apache.kafka.common.utils.internals.AppInfoParser)",
        _HEADER,
        (
            "scoring.predictions\t5        \t2         \t6            \t2               \t1724       \t1796160175135"
            "\t1            \t"
        ),
        (
            "__consumer_offsets \t0        \t2         \t6            \t2               \t1028       \t1796160175283"
            "\t1            \t"
        ),
    ]
)


def test_each_row_of_the_padded_table_is_a_hanging_transaction() -> None:
    assert parse_hanging_transactions(_FOUND) == [("scoring.predictions", 5, 1724), ("__consumer_offsets", 0, 1028)]


def test_a_table_without_rows_or_without_a_header_is_nothing_hanging() -> None:
    assert parse_hanging_transactions(_HEADER + "\n") == []
    assert parse_hanging_transactions("Failed to describe producers: timed out\n") == []
    assert parse_hanging_transactions(_FOUND + "\nWARN\tsomething else\tx\ty\tz\tw\n") == parse_hanging_transactions(_FOUND)
