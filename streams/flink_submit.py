"""The ``flink run`` command that submits a Loopline PyFlink job to a Flink cluster with everything it needs.

    flink run --detached --jobmanager HOST:PORT --parallelism N [--fromSavepoint PATH]
        --pyModule <the job's module> --pyFiles <Loopline's code, zip>
        --pyArchives <the job environment, zip>#jobenv --pyExecutable jobenv/bin/python
        --pyClientExecutable <this Python> <the job's settings, JSON>

The TaskManagers need only Java and the Python the environment was built over; the settings name the connector and
operators jars, which the job puts on ``pipeline.jars`` and the client uploads with the job graph. The arguments
from ``--pyModule`` on are a FlinkDeployment's ``job.args`` (entry class ``org.apache.flink.client.python.PythonDriver``),
``--parallelism`` and ``--fromSavepoint`` its ``job.parallelism`` and ``job.initialSavepointPath``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Where the environment archive is unpacked beside each Python worker (``-pyarch <zip>#<this>``).
ENVIRONMENT_DIR = "jobenv"


@dataclass(frozen=True)
class JobArchives:
    """The two archives a job ships (``streams/job_archives.py``): its Python environment and Loopline's code."""

    environment: Path
    code: Path


def flink_run_command(flink: Path, jobmanager: str, module: str, arguments: Sequence[str], archives: JobArchives, *,
                      parallelism: int, from_savepoint: str | None = None) -> list[str]:  # fmt: skip
    """``flink run`` submitting ``module`` (its ``__main__`` builds and executes the job, given ``arguments``), detached,
    to the cluster whose REST API is at ``jobmanager``, at ``parallelism``, restored from ``from_savepoint`` (a savepoint
    or retained checkpoint, any Flink filesystem URI) when given."""
    return [
        str(flink), "run", "--detached", "--jobmanager", jobmanager, "--parallelism", str(parallelism),
        *(["--fromSavepoint", from_savepoint] if from_savepoint else []),
        "--pyModule", module, "--pyFiles", str(archives.code),
        "--pyArchives", f"{archives.environment}#{ENVIRONMENT_DIR}", "--pyExecutable", f"{ENVIRONMENT_DIR}/bin/python",
        # The client compiles the job graph here, in this environment (it reads the Feast registry and starts the JVM).
        "--pyClientExecutable", sys.executable,
        *arguments,
    ]  # fmt: skip
