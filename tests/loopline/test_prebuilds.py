"""`loopline stack setup` builds ahead of first use what would otherwise be compiled by the first job, scorer or
training run, and what it built is what they then use."""

from __future__ import annotations

import glob
import zipfile
from pathlib import Path

import pytest

from loopline.components import feature_operators_jar, job_archives, job_settings, joiner_operators_jar, joiner_settings
from loopline.prebuilds import prebuilds
from loopline.settings import Settings
from streams.job_archives import cache_dir


def _build(settings: Settings, which: str) -> str:
    (prebuild,) = [p for p in prebuilds(settings) if which in p.name]
    return prebuild.build()


def test_setup_builds_the_operator_jars_the_jobs_then_take(applied: Settings, tmp_path: Path) -> None:
    # A jar cache with the fetched Maven jars and none of Loopline's own operators.
    fresh = applied.model_copy(update={"jars_dir": tmp_path / "jars"})
    (tmp_path / "jars").mkdir()
    for fetched in applied.resolved_jars_dir.iterdir():
        if fetched.name != "loopline":
            (tmp_path / "jars" / fetched.name).symlink_to(fetched)
    built = [Path(_build(fresh, "feature job's JVM")), Path(_build(fresh, "joiner's JVM"))]
    assert built == [feature_operators_jar(fresh), joiner_operators_jar(fresh)]
    assert all(jar.is_file() and jar.is_relative_to(tmp_path / "jars") for jar in built)
    built_at = [jar.stat().st_mtime_ns for jar in built]
    assert job_settings(fresh).operators_jar == built[0] and joiner_settings(fresh).operators_jar == built[1]
    assert [jar.stat().st_mtime_ns for jar in built] == built_at, "the jobs took the jars setup built: nothing compiled again"


def test_setup_generates_the_grpc_modules(applied: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = Path(_build(applied, "gRPC"))
    assert folder.is_relative_to(tmp_path / "loopline" / "grpc") and (folder / "schemas" / "scoring_pb2_grpc.py").is_file()


def test_setup_builds_the_op_deepspeed_initialize_would_compile(applied: Settings) -> None:
    """In the environment training runs in (torch's own extensions cache, where `make setup` built it: a second build
    takes seconds); on a CUDA host there is nothing to build."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    result = _build(applied, "DeepSpeed")
    if torch.cuda.is_available():
        assert result == "cuda: nothing to build", result
        return
    assert result == "cpu: shared-memory communication op built", result
    # torch keeps each extension under <root>/py<version>_<cuda>/<name>/.
    assert glob.glob(str(Path(get_default_build_root()) / "*" / "deepspeed_shm_comm" / "*.so")), "the op is in torch's cache"


def test_setup_builds_the_job_environment_a_cluster_submission_ships(settings: Settings) -> None:
    built = Path(_build(settings, "jobs' Python environment"))
    assert built == job_archives(settings).environment and built.is_relative_to(cache_dir())
    assert "bin/python" in zipfile.ZipFile(built).namelist(), "the venv's interpreter, copied in"
