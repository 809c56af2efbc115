"""Reaching the scorer as a cluster would: a bearer token on scoring and model status, open probes and
metrics, the standard gRPC health service and server reflection (what grpcurl and Kubernetes use)."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from loopline.serving import build_scorer
from loopline.settings import Settings
from offline_training.onnx_models import write_linear_model
from schemas.grpc_api import scoring_api
from tests.support.scoring import score_request, serving_doors

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    inputs = ["user_transaction_features:txn_count_5m", "request:amount"]
    return write_linear_model(tmp_path_factory.mktemp("model") / "m.onnx", inputs, np.array([0.1, 0.01]), -1.0)


def _grpc_score(address: str, metadata: tuple = ()) -> grpc.StatusCode:
    messages, services = scoring_api()
    with grpc.insecure_channel(address) as channel:
        try:
            services.ScorerStub(channel).Score(
                messages.ScoreRequest(
                    request_id="access-1",
                    entity_keys={"user_id": "u"},
                    requested_at_ms=1,
                    request_fields={"amount": struct_pb2.Value(number_value=3.0)},
                ),
                metadata=metadata,
                timeout=5,
            )
            return grpc.StatusCode.OK
        except grpc.RpcError as err:
            return err.code()


def test_a_bearer_token_guards_scoring_and_model_status_but_not_probes(
    applied: Settings, model_path: Path, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    settings = applied.model_copy(update={"serving": applied.serving.model_copy(update={"auth_token_file": token_file})})
    with serving_doors(settings, build_scorer(settings, model_path)) as (url, grpc_address):
        body = score_request("access-user", 3.0)
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
            answer = requests.post(f"{url}/v1/score", json=body, headers=headers, timeout=5)
            assert answer.status_code == 401 and answer.json()["error"] == "unauthenticated", headers
            assert requests.get(f"{url}/v1/models/status", headers=headers, timeout=5).status_code == 401
        good = {"authorization": f"Bearer {TOKEN}"}
        assert requests.post(f"{url}/v1/score", json=body, headers=good, timeout=5).status_code == 200
        assert requests.get(f"{url}/v1/models/status", headers=good, timeout=5).json()["models"]["prod"]["version"] == "file"
        for open_path in ("/metrics", "/v1/models/ready", "/v1/health/live"):
            assert requests.get(f"{url}{open_path}", timeout=5).status_code == 200, open_path
        metrics = requests.get(f"{url}/metrics", timeout=5).text
        assert 'loopline_scoring_requests_total{door="http",status="401"} 3.0' in metrics

        assert _grpc_score(grpc_address) == grpc.StatusCode.UNAUTHENTICATED
        assert _grpc_score(grpc_address, (("authorization", "Bearer wrong"),)) == grpc.StatusCode.UNAUTHENTICATED
        assert _grpc_score(grpc_address, (("authorization", f"Bearer {TOKEN}"),)) == grpc.StatusCode.OK


def test_grpc_serves_health_and_reflection(applied: Settings, model_path: Path) -> None:
    settings = applied.model_copy(update={"serving": applied.serving.model_copy(update={"auth_token": SecretStr(TOKEN)})})
    with serving_doors(settings, build_scorer(settings, model_path)) as (url, grpc_address):
        with grpc.insecure_channel(grpc_address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "loopline.scoring.v1.Scorer"):
                status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
                assert status == health_pb2.HealthCheckResponse.SERVING, service
            reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
            replies = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
            services = {s.name for reply in replies for s in reply.list_services_response.service}
            assert {"loopline.scoring.v1.Scorer", "grpc.health.v1.Health"} <= services
        assert _grpc_score(grpc_address) == grpc.StatusCode.UNAUTHENTICATED, "the token guards Score, not health"
        metrics = requests.get(f"{url}/metrics", timeout=5).text
        assert 'loopline_scoring_requests_total{door="grpc",status="UNAUTHENTICATED"} 1.0' in metrics
