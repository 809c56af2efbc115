"""The ``flink run`` command that submits a Loopline PyFlink job to a Flink cluster, in one of two forms.

Shipped (a session cluster whose TaskManagers have only Java and a bare Python)::

    flink run --detached --jobmanager HOST:PORT --parallelism N [--fromSavepoint PATH]
        --pyModule <the job's module> --pyFiles <Loopline's code, zip>
        --pyArchives <the job environment, zip>#jobenv --pyExecutable jobenv/bin/python
        --pyClientExecutable <this Python> <the job's settings, JSON>

The settings name the connector and operators jars, which the job puts on ``pipeline.jars`` and the client uploads
with the job graph.

In a Loopline Flink image (``FlinkImage``: what ``infra/images`` builds, and a FlinkDeployment runs)::

    /opt/flink/bin/flink run ... --pyModule <an entry module of the image's>
        --pyExecutable /opt/loopline/venv/bin/python --pyClientExecutable /opt/loopline/venv/bin/python <job>

nothing is shipped: Loopline and its environment are in the image, the jars in its ``lib``, and the entry reads the
job's settings from the pod's environment (``LOOPLINE_CONFIG`` and ``LOOPLINE_*``, Secrets included), so no address or
password travels in the arguments. In both forms the arguments from ``--pyModule`` on are a FlinkDeployment's
``job.args`` (``deployment_args``; entry class ``PYTHON_DRIVER``), ``--parallelism`` and ``--fromSavepoint`` its
``job.parallelism`` and ``job.initialSavepointPath``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Where the environment archive is unpacked beside each Python worker (``-pyarch <zip>#<this>``).
ENVIRONMENT_DIR = "jobenv"
#: The Flink class that runs a Python job's module (a FlinkDeployment's ``job.entryClass``).
PYTHON_DRIVER = "org.apache.flink.client.python.PythonDriver"


@dataclass(frozen=True)
class JobArchives:
    """The two archives a job ships (``streams/job_archives.py``): its Python environment and Loopline's code."""

    environment: Path
    code: Path


@dataclass(frozen=True)
class FlinkImage:
    """The layout of a Loopline Flink image (``infra/images``): Flink where the official image keeps it, Loopline
    installed in a venv, the Kafka connector and the operators jars in Flink's ``lib`` under the names this machine's
    caches give them (``infra/jars.flink_connector_jar``, ``streams/operators_jar.operators_jar``)."""

    flink_home: Path = Path("/opt/flink")
    python: Path = Path("/opt/loopline/venv/bin/python")

    @property
    def flink(self) -> Path:
        """The image's ``flink`` command."""
        return self.flink_home / "bin" / "flink"

    @property
    def lib(self) -> Path:
        """Where the image's jars are (on every JobManager's and TaskManager's classpath)."""
        return self.flink_home / "lib"

    def python_jar(self, flink_version: str) -> str:
        """The PythonDriver's jar, as a FlinkDeployment's ``job.jarURI`` names it (the official image's ``opt``)."""
        return f"local://{self.flink_home}/opt/flink-python-{flink_version}.jar"


def flink_run_command(
    flink: Path,
    jobmanager: str,
    module: str,
    arguments: Sequence[str],
    shipping: JobArchives | FlinkImage,
    *,
    parallelism: int,
    from_savepoint: str | None = None,
) -> list[str]:
    """``flink run`` submitting ``module`` (its ``__main__`` builds and executes the job, given ``arguments``), detached,
    to the cluster whose REST API is at ``jobmanager``, at ``parallelism``, restored from ``from_savepoint`` (a savepoint
    or retained checkpoint, any Flink filesystem URI) when given: shipping the job's ``JobArchives``, or run by the
    Python of a ``FlinkImage``."""
    if isinstance(shipping, FlinkImage):
        python = ["--pyExecutable", str(shipping.python), "--pyClientExecutable", str(shipping.python)]
    else:
        python = [
            "--pyFiles",
            str(shipping.code),
            "--pyArchives",
            f"{shipping.environment}#{ENVIRONMENT_DIR}",
            "--pyExecutable",
            f"{ENVIRONMENT_DIR}/bin/python",
            # The client compiles the job graph here, in this environment (it reads the Feast registry and starts the JVM).
            "--pyClientExecutable",
            sys.executable,
        ]
    return [
        str(flink),
        "run",
        "--detached",
        "--jobmanager",
        jobmanager,
        "--parallelism",
        str(parallelism),
        *(["--fromSavepoint", from_savepoint] if from_savepoint else []),
        "--pyModule",
        module,
        *python,
        *arguments,
    ]


def deployment_args(command: Sequence[str]) -> list[str]:
    """The arguments of a ``flink run`` command that a FlinkDeployment's ``job.args`` take (from ``--pyModule`` on)."""
    return list(command[list(command).index("--pyModule") :])
