"""What a job ships to a Flink cluster: the environment's requirements are the TaskManagers' (their Python's markers),
pinned to this environment's versions, without PyFlink's jars; the code archive holds the packages the jobs import."""

from __future__ import annotations

import zipfile
from importlib.metadata import version

import pytest

from streams.job_archives import CODE_PACKAGES, JobArchiveError, code_archive, pinned_requirements, python_version


def test_requirements_follow_the_taskmanagers_python() -> None:
    older, newer = pinned_requirements("3.11.2"), pinned_requirements("3.11.7")
    # redis-py needs async-timeout below Python 3.11.3 only: the workers' interpreter decides, not this one.
    assert set(older) - set(newer) == {f"async-timeout=={version('async-timeout')}"}
    names = {line.split("==")[0] for line in older}
    assert {"apache-flink", "apache-beam", "pydantic", "pandas", "pyarrow"} <= names
    assert "feast" not in names, "the workers write nothing through Feast: the online writes run in the JVM"
    assert "apache-flink-libraries" not in names and f"apache-flink=={version('apache-flink')}" in older


def test_the_taskmanagers_python_must_be_this_version(tmp_path) -> None:
    assert python_version("/usr/bin/python3").startswith("3.11.")
    with pytest.raises(JobArchiveError, match=r"flink\.python"):
        python_version(str(tmp_path / "no-python"))


def test_code_archive_holds_the_jobs_packages(tmp_path) -> None:
    archive = code_archive(tmp_path)
    names = zipfile.ZipFile(archive).namelist()
    assert {
        "streams/feature_job.py",
        "feedback_loop/joiner_job.py",
        "schemas/records.py",
        "feature_store/online_write.py",
    } <= set(names)
    assert {name.split("/")[0] for name in names} == set(CODE_PACKAGES)
    assert code_archive(tmp_path) == archive, "the same sources, the same archive"
