"""What would otherwise be built the first time it is used, built by `loopline stack setup` instead.

Found by starting from a machine with empty caches: DeepSpeed compiles its CPU communication op (C++) in the first
training run's ``initialize``, which on a busy machine was minutes inside the demo's training step; the feature job and
the joiner compile their JVM operators with ``javac`` when they first start; the scorer compiles the gRPC proto when
its gRPC door first starts; a job submitted to a Flink cluster ships a Python environment that pip fills (~30 s); the
chart's tests need the pinned helm, built from the Go module proxy where PATH has none (~1.5 min).
Each is cached by its inputs, so running them again costs little; setup's table shows what each took.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from loopline.components import feature_operators_jar, job_archives, joiner_operators_jar
from loopline.settings import Settings


@dataclass(frozen=True)
class Prebuild:
    """One thing built ahead of its first use: what it is, and the build (it returns what it made)."""

    name: str
    build: Callable[[], str]


def prebuilds(settings: Settings) -> list[Prebuild]:
    """Everything `loopline stack setup` builds ahead of its first use, for the stack of ``settings``."""

    def deepspeed_ops() -> str:
        if importlib.util.find_spec("deepspeed") is None:
            return "nothing: DeepSpeed is not installed (the train extra)"
        from offline_training.launch import build_deepspeed_ops

        return build_deepspeed_ops()

    def helm() -> str:
        from infra.helm_tool import helm_binary

        return str(helm_binary(settings.home.absolute() / "tools"))

    def grpc_modules() -> str:
        from schemas.grpc_api import generate_scoring_api

        return str(generate_scoring_api())

    return [
        Prebuild("the feature job's JVM operators", lambda: str(feature_operators_jar(settings))),
        Prebuild("the feedback joiner's JVM operators", lambda: str(joiner_operators_jar(settings))),
        Prebuild("the gRPC door's modules (schemas/scoring.proto)", grpc_modules),
        Prebuild(
            "the Flink jobs' Python environment, for clusters (a venv archive)", lambda: str(job_archives(settings).environment)
        ),
        Prebuild("helm for the Kubernetes chart's tests (Go, from the module proxy)", helm),
        Prebuild("DeepSpeed's communication op for training (C++, the longest)", deepspeed_ops),
    ]
