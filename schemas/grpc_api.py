"""The gRPC messages and service stubs, compiled from ``schemas/scoring.proto`` at first use (no generated code to drift)."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]


@cache
def scoring_api():
    """``(messages, services)`` modules of ``scoring.proto`` (needs grpcio-tools)."""
    import grpc

    # protos_and_services looks the file up on sys.path, by the path it is imported under.
    if str(_ROOT) not in sys.path:
        sys.path.append(str(_ROOT))
    return grpc.protos_and_services("schemas/scoring.proto")
