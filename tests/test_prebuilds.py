"""`loopline stack setup` builds ahead of first use what would otherwise be compiled by the first job, scorer or
training run, and what it built is what they then use."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

from loopline.components import feature_operators_jar, job_settings, joiner_operators_jar, joiner_settings
from loopline.prebuilds import prebuilds
from loopline.settings import Settings


def test_setup_builds_what_first_use_would_and_the_jobs_use_it(applied: Settings, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # A jar cache with the fetched Maven jars and none of Loopline's own operators.
    fresh = applied.model_copy(update={"jars_dir": tmp_path / "jars-fresh"})
    (tmp_path / "jars-fresh").mkdir()
    for fetched in applied.resolved_jars_dir.iterdir():
        if fetched.name != "loopline":
            (tmp_path / "jars-fresh" / fetched.name).symlink_to(fetched)

    made = {prebuild.name: prebuild.build() for prebuild in prebuilds(fresh)}
    jars = [feature_operators_jar(fresh), joiner_operators_jar(fresh)]
    assert all(jar.is_file() and jar.is_relative_to(tmp_path / "jars-fresh") for jar in jars)
    built_at = [jar.stat().st_mtime_ns for jar in jars]
    assert job_settings(fresh).operators_jar == jars[0] and joiner_settings(fresh).operators_jar == jars[1]
    assert [jar.stat().st_mtime_ns for jar in jars] == built_at, "the jobs took the jars setup built: nothing compiled again"
    assert glob.glob(str(tmp_path / "cache" / "loopline" / "grpc" / "*" / "schemas" / "scoring_pb2_grpc.py"))

    deepspeed = next(result for name, result in made.items() if "DeepSpeed" in name)
    assert deepspeed == "cpu: shared-memory communication op built", deepspeed
    extensions = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    assert glob.glob(str(extensions / "*" / "deepspeed_shm_comm" / "*.so")), "the op DeepSpeed's initialize loads is in torch's cache"
