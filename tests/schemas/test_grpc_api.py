"""The gRPC modules of ``schemas/scoring.proto``: generated once by setup into a cache, else compiled at first use;
both give the same messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

#: Loads the API the way the gRPC door does and reports where it came from and a serialised request.
_LOAD = """
import json
from schemas.grpc_api import scoring_api
messages, services = scoring_api()
request = messages.ScoreRequest(request_id="r-1", model_name="fraud")
print(json.dumps({"file": getattr(messages, "__file__", None), "loader": type(messages.__spec__.loader).__name__,
                  "bytes": request.SerializeToString().hex(), "stub": hasattr(services, "ScorerStub")}))
"""


def _load(cache: Path) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    out = subprocess.run([sys.executable, "-c", _LOAD], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_setup_generates_the_modules_once_and_the_door_loads_them(tmp_path: Path) -> None:
    compiled = _load(tmp_path)
    assert compiled["file"] is None and compiled["loader"] == "ProtoLoader", (
        "nothing generated yet: grpc_tools compiled it in memory"
    )

    generate = "from schemas.grpc_api import generate_scoring_api; print(generate_scoring_api())"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    folder = Path(
        subprocess.run(
            [sys.executable, "-c", generate], cwd=REPO, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    assert folder.is_relative_to(tmp_path / "loopline" / "grpc")
    assert sorted(p.name for p in (folder / "schemas").iterdir()) == ["scoring_pb2.py", "scoring_pb2_grpc.py"]

    generated = _load(tmp_path)
    assert generated["file"] == str(folder / "schemas" / "scoring_pb2.py") and generated["loader"] == "SourceFileLoader"
    assert generated["stub"] and compiled["stub"]
    assert generated["bytes"] == compiled["bytes"], "the generated messages are the proto's"
