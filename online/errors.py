"""What can go wrong scoring one request, each error with its answer on every door.

Feast's errors carry their own transport status; so do these. A door has one ``except
ScoringError``: HTTP answers ``http_status``, gRPC aborts with ``grpc_code``, and the Kafka door
dead-letters the request with ``reason`` — or, for a ``retriable`` error (the scorer is busy or
not ready, which is no fault of the request), waits and tries again, so nothing is dropped.
"""

from __future__ import annotations

from typing import ClassVar


class ScoringError(Exception):
    """Scoring one request failed; ``field`` names the request field at fault, when one is."""

    http_status: ClassVar[int] = 500
    #: The name of the ``grpc.StatusCode`` (kept as text so this module needs no gRPC).
    grpc_code: ClassVar[str] = "INTERNAL"
    #: The dead-letter reason on the Kafka door.
    reason: ClassVar[str] = "scoring_failed"
    #: Not the request's fault: the same request may succeed later.
    retriable: ClassVar[bool] = False
    #: The error's name in an HTTP answer (``{"error": ...}``).
    title: ClassVar[str] = "internal error"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def answer(self) -> dict[str, str]:
        """The JSON body a client gets."""
        body = {"error": self.title, "reason": str(self)}
        if self.field is not None:
            body["field"] = self.field
        return body


class InvalidRequest(ScoringError):
    """The request breaks its contract, or the model cannot use one of its values."""

    http_status, grpc_code, reason, title = 422, "INVALID_ARGUMENT", "invalid", "invalid request"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field)


class PayloadTooLarge(ScoringError):
    """The request is larger than the door accepts."""

    http_status, grpc_code, reason, title = 413, "RESOURCE_EXHAUSTED", "too_large", "request too large"


class UnknownModel(ScoringError):
    """The request names a model this scorer does not serve."""

    http_status, grpc_code, reason, title = 404, "NOT_FOUND", "unknown_model", "unknown model"

    def __init__(self, name: str, served: str) -> None:
        super().__init__(f"model {name!r} is not served here (this scorer serves {served!r})", "model_name")


class Unauthenticated(ScoringError):
    """The request carries no valid bearer token."""

    http_status, grpc_code, reason, title = 401, "UNAUTHENTICATED", "unauthenticated", "unauthenticated"


class Overloaded(ScoringError):
    """The scorer is full (``serving.max_in_flight`` requests in flight, a batcher's queue or the prediction log's
    full): the request is refused rather than queued without bound."""

    http_status, grpc_code, reason, title, retriable = 503, "RESOURCE_EXHAUSTED", "overloaded", "overloaded", True


class ModelNotReady(ScoringError):
    """No model is loaded yet: retry once the scorer is ready."""

    http_status, grpc_code, reason, title, retriable = 503, "UNAVAILABLE", "not_ready", "not ready", True


class PredictionLogUnavailable(ScoringError):
    """The request was scored but Kafka did not acknowledge its prediction record in time: retry it
    (a retried request that was logged after all is one more record with the same request id)."""

    http_status, grpc_code, reason, title, retriable = 503, "UNAVAILABLE", "log_unavailable", "prediction log unavailable", True


class ScoringFailed(ScoringError):
    """A fault of the scorer, not of the request (e.g. the model returned no finite score)."""
