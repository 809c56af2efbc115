"""What a door accepts as a score request: the contract, within limits, or a clear error.

Every door turns what a client sent into a ``ScoreRequest`` here, so a request that one door
refuses is refused by all of them with the same field and reason (HTTP 422/413, gRPC
INVALID_ARGUMENT/RESOURCE_EXHAUSTED, a dead letter on Kafka).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from online.errors import InvalidRequest, PayloadTooLarge
from schemas.records import ScoreRequest
from schemas.validation import ContractViolation, decode


@dataclass(frozen=True)
class RequestLimits:
    """How large a score request may be."""

    max_body_bytes: int = 65_536
    max_entity_keys: int = 8
    max_request_fields: int = 64
    #: The longest request id, entity key, request field name or string value, in characters.
    max_key_length: int = 256
    max_json_depth: int = 32
    #: How far ahead of this machine's clock a request may be stamped, in seconds (a clock a little ahead is usual; a
    #: day ahead is a bug, and every window read as of it would be empty).
    max_ahead_s: float = 5.0


def parse_request(payload: bytes, limits: RequestLimits) -> ScoreRequest:
    """The request in ``payload`` (JSON); PayloadTooLarge or InvalidRequest naming the field at fault."""
    if len(payload) > limits.max_body_bytes:
        raise PayloadTooLarge(f"request of {len(payload):,} bytes; the limit is {limits.max_body_bytes:,}")
    try:
        request = decode(ScoreRequest, payload, max_depth=limits.max_json_depth)
    except ContractViolation as violation:
        raise InvalidRequest(violation.field, violation.reason) from None
    check_limits(request, limits)
    return request


def check_limits(request: ScoreRequest, limits: RequestLimits) -> None:
    """InvalidRequest naming the first part of ``request`` beyond ``limits``, its time included: stamped further ahead of
    this machine's clock than ``limits.max_ahead_s`` is refused, never clamped (a clamped request would be logged and
    judged as of a time it did not name)."""
    ahead_ms = request.requested_at_ms - time.time_ns() // 1_000_000  # in integers: the contract bounds no timestamp
    if ahead_ms > limits.max_ahead_s * 1000:
        ahead = f"{ahead_ms / 1000:,.1f} s" if ahead_ms < 10**15 else "more than 30,000 years"
        raise InvalidRequest("requested_at_ms", f"{ahead} ahead of the scorer's clock; at most {limits.max_ahead_s:g} s")
    if len(request.entity_keys) > limits.max_entity_keys:
        raise InvalidRequest("entity_keys", f"{len(request.entity_keys)} keys; at most {limits.max_entity_keys}")
    if len(request.request_fields) > limits.max_request_fields:
        raise InvalidRequest("request_fields", f"{len(request.request_fields)} fields; at most {limits.max_request_fields}")
    longest = limits.max_key_length
    if len(request.request_id) > longest:
        raise InvalidRequest("request_id", f"longer than {longest} characters")
    for name, key in request.entity_keys.items():
        if len(name) > longest or len(key) > longest:
            raise InvalidRequest(f"entity_keys.{name[:longest]}", f"name or key longer than {longest} characters")
    for name, value in request.request_fields.items():
        if len(name) > longest or (isinstance(value, str) and len(value) > longest):
            raise InvalidRequest(f"request_fields.{name[:longest]}", f"name or value longer than {longest} characters")
