"""Counting a request once: the memory of recent request ids readers keep."""

from __future__ import annotations

import pytest

from feedback_loop.request_dedup import RecentRequests


def test_a_repeat_within_the_memory_is_caught_and_the_oldest_ids_are_forgotten() -> None:
    recent = RecentRequests(capacity=3)
    assert [recent.first_time(i) for i in ("a", "b", "a", "c")] == [True, True, False, True]
    assert recent.first_time("d") and recent.first_time("a"), "a, the oldest of four, was forgotten"
    assert not recent.first_time("d")
    with pytest.raises(ValueError, match="at least 1"):
        RecentRequests(0)
