"""A standalone Flink session cluster (a JobManager, TaskManagers) run from the PyFlink distribution.

The embedded mini-cluster is the default; this is the same Flink as a long-running cluster, what
``loopline stream submit --jobmanager`` targets. Its processes run in the foreground under the
stack's supervision, configured by a ``config.yaml`` written into their own conf dir.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from infra.errors import StackError
from infra.flink import pyflink_version
from infra.jars import require_tool
from infra.service import ManagedService


def pyflink_home() -> Path:
    """Where the PyFlink distribution (bin/, conf/, lib/) is installed."""
    import pyflink

    return Path(pyflink.__file__).parent


def rest_get(address: str, path: str, timeout_s: float = 2.0) -> dict:
    """GET a Flink REST endpoint (``address`` is host:port) and parse its JSON."""
    with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout_s) as response:
        return json.loads(response.read())


class _FlinkProcess(ManagedService):
    """One process of the cluster; subclasses name the script and how to tell it is ready."""

    script: str

    def __init__(self, conf_dir: Path, host: str, rest_port: int, run_dir: Path, log_dir: Path) -> None:
        super().__init__(run_dir, log_dir, start_timeout_s=90.0)
        self.conf_dir, self.host, self.rest_port = conf_dir, host, rest_port

    @property
    def address(self) -> str:
        return f"{self.host}:{self.rest_port}"

    def version(self) -> str:
        return pyflink_version()

    def command(self) -> list[str]:
        require_tool("java", "openjdk-17-jre-headless")
        return [str(pyflink_home() / "bin" / self.script), "start-foreground"]

    @property
    def lib_dir(self) -> Path:
        """The cluster's lib/: PyFlink's, plus flink-python, which runs Python functions on a cluster."""
        return self.conf_dir.parent / "lib"

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "FLINK_CONF_DIR": str(self.conf_dir),
            "FLINK_LIB_DIR": str(self.lib_dir),
            "FLINK_LOG_DIR": str(self.log_file.parent),
        }


class FlinkJobManager(_FlinkProcess):
    """The cluster's JobManager; it serves the REST API that jobs are submitted to."""

    name = "flink-jobmanager"
    cmdline_marker = "StandaloneSessionClusterEntrypoint"
    script = "jobmanager.sh"

    def __init__(
        self, conf_dir: Path, host: str, rest_port: int, rpc_port: int, run_dir: Path, log_dir: Path, slots: int = 2
    ) -> None:
        super().__init__(conf_dir, host, rest_port, run_dir, log_dir)
        self.rpc_port, self.slots = rpc_port, slots

    def ports(self) -> dict[str, tuple[str, int]]:
        return {"REST": (self.host, self.rest_port), "RPC": (self.host, self.rpc_port)}

    def prepare(self) -> None:
        """Write the cluster's conf dir: PyFlink's defaults, this cluster's ports, small memory. No Python: each job
        brings its own (``streams/job_archives.py``)."""
        self.lib_dir.mkdir(parents=True, exist_ok=True)
        for jar in [*(pyflink_home() / "lib").glob("*.jar"), *(pyflink_home() / "opt").glob("flink-python-*.jar")]:
            link = self.lib_dir / jar.name
            if not link.exists():
                link.symlink_to(jar)
        base = pyflink_home() / "conf"
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        for name in ("log4j-console.properties", "log4j.properties"):
            shutil.copy(base / name, self.conf_dir / name)
        config = yaml.safe_load((base / "config.yaml").read_text())
        config["jobmanager"]["rpc"] = {"address": self.host, "port": self.rpc_port}
        config["jobmanager"]["bind-host"] = self.host
        config["jobmanager"]["memory"] = {"process": {"size": "1024m"}}
        config["taskmanager"]["bind-host"] = self.host
        config["taskmanager"]["host"] = self.host
        config["taskmanager"]["numberOfTaskSlots"] = self.slots
        config["taskmanager"]["memory"] = {"process": {"size": "2048m"}}
        # A job's subtasks spread over the TaskManagers rather than filling one first: losing one costs each job a
        # share of its subtasks, and parallelism uses every machine.
        config["taskmanager"]["load-balance"] = {"mode": "SLOTS"}
        # A killed TaskManager refuses the JobManager's heartbeats at once; two refused, 2 s apart, mark it lost and
        # its jobs restart on the others (Flink's 10 s interval made that 20 s).
        config["heartbeat"] = {"interval": "2 s"}
        config["rest"] = {"address": self.host, "bind-address": self.host, "port": self.rest_port}
        # Each job's Python environment is unpacked here (~700 MB): inside the cluster's folder, which `flink down`
        # empties, not the host's /tmp, where a TaskManager killed before it could clean up would leave it.
        config["io"] = {"tmp": {"dirs": str(self.conf_dir.parent / "tmp")}}
        (self.conf_dir / "config.yaml").write_text(yaml.safe_dump(config))

    def ready(self) -> bool:
        """The REST API answers."""
        try:
            rest_get(self.address, "/overview")
        except (OSError, urllib.error.URLError, ValueError):
            return False
        return True


class FlinkTaskManager(_FlinkProcess):
    """One of the cluster's TaskManagers, ``index`` telling it from the others (its pid and log files); ready once
    the JobManager counts it among its registered ones."""

    cmdline_marker = "TaskManagerRunner"
    script = "taskmanager.sh"

    def __init__(self, conf_dir: Path, host: str, rest_port: int, run_dir: Path, log_dir: Path, index: int = 0) -> None:
        self.name, self.index = f"flink-taskmanager-{index}", index
        super().__init__(conf_dir, host, rest_port, run_dir, log_dir)

    def ports(self) -> dict[str, tuple[str, int]]:
        return {}

    def ready(self) -> bool:
        try:
            return rest_get(self.address, "/overview").get("taskmanagers", 0) > self.index
        except (OSError, urllib.error.URLError, ValueError):
            return False


def submit_job(command: list[str], address: str) -> str:
    """Run ``command``, a detached ``flink run`` to the cluster at ``address`` (REST host:port), and return the id of
    the job it submitted; StackError with the end of its output when it failed or named no job."""
    result = subprocess.run(command, capture_output=True, text=True)
    job_id = submitted_job_id(result.stdout)
    if result.returncode != 0 or not job_id:
        last = " | ".join((result.stdout + result.stderr).strip().splitlines()[-3:])
        raise StackError(f"`flink run` failed: {last}", f"check the cluster at {address} and its logs")
    return job_id


def submitted_job_id(output: str) -> str | None:
    """The id of the job a detached ``flink run`` says it submitted, in its output; None when it names none."""
    submitted = re.search(r"JobID ([0-9a-f]{32})", output)
    return submitted.group(1) if submitted else None


def list_jobs(address: str) -> list[dict]:
    """The cluster's jobs (id, name, state, start time) from its REST API."""
    return [
        {"id": job["jid"], "name": job["name"], "state": job["state"], "start_ms": job["start-time"]}
        for job in rest_get(address, "/jobs/overview")["jobs"]
    ]


def stop_with_savepoint(address: str, job_id: str, target_directory: str, timeout_s: float = 180.0) -> str:
    """Stop a job gracefully with a savepoint under ``target_directory`` (any Flink filesystem URI) and return the
    savepoint's location; StackError with Flink's reason when it failed or took longer than ``timeout_s``."""
    body = json.dumps({"targetDirectory": target_directory, "drain": False}).encode()
    request = urllib.request.Request(
        f"http://{address}/jobs/{job_id}/stop", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        trigger = json.loads(response.read())["request-id"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = rest_get(address, f"/jobs/{job_id}/savepoints/{trigger}", timeout_s=10)
        if answer["status"]["id"] == "COMPLETED":
            operation = answer["operation"]
            if "location" in operation:
                return operation["location"]
            cause = str(operation.get("failure-cause", {}).get("stack-trace", "")).strip().splitlines()[:1]
            raise StackError(
                f"the savepoint of job {job_id} failed: {' '.join(cause)}",
                f"see the JobManager's log at {address}; the job keeps running",
            )
        time.sleep(0.5)
    raise StackError(
        f"the savepoint of job {job_id} took longer than {timeout_s:.0f} s",
        f"see the JobManager's log at {address}; retry, or cancel the job and restore its newest checkpoint",
    )


def cancel_job(address: str, job_id: str) -> None:
    """Ask the cluster to cancel a job."""
    request = urllib.request.Request(f"http://{address}/jobs/{job_id}?mode=cancel", method="PATCH")
    with urllib.request.urlopen(request, timeout=10):
        pass
