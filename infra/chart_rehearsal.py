"""A rendered chart's containers run as processes on this machine: a rehearsal of its workloads against a local stack.

Each container runs its own command and args with its own environment (literal values, the keys of the chart's
Secrets and ConfigMaps, the pod's name) over the image's (``infra/images/dockerfile_env.py``), and its ConfigMap and
Secret volumes written out as files. One translation is made, and only one: ``Layout``, where the pod's paths are on
this machine (the image's folders, the volumes' mountPaths), applied to every argument, variable and mounted file.
The cluster's addresses are not translated here: the chart is rendered with values that name the local stack. So a
typo in a command, an option, a variable or a path of the chart fails its rehearsal.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infra.errors import StackError
from infra.images.dockerfile_env import image_environment
from infra.service import wait_until

#: Where a pod's probes and ports are reached here (every rehearsed process shares this machine's network).
LOCALHOST = "127.0.0.1"


class RehearsalError(StackError):
    """A workload that did not do what its manifest promises here: what, and the end of its output."""

    def __init__(self, workload: str, problem: str, output: str) -> None:
        tail = "\n".join(output.strip().splitlines()[-25:])
        super().__init__(f"{workload}: {problem}\n{tail}", "fix the chart's command, args, env or mounts for this workload")


@dataclass(frozen=True)
class Layout:
    """Where paths of a pod are on this machine: each pod path (a folder of the image, a volume's mountPath) and the
    folder that stands for it here. ``local`` rewrites a path wherever it starts (a value, a ``file://`` URI, a
    ``PATH`` entry); the longest prefix wins."""

    paths: Mapping[str, Path]

    def local(self, text: str) -> str:
        if not self.paths:
            return text
        prefixes = "|".join(re.escape(p.rstrip("/")) for p in sorted(self.paths, key=len, reverse=True))
        by_prefix = {p.rstrip("/"): str(host) for p, host in self.paths.items()}
        return re.sub(rf"(?<![\w.-])({prefixes})(?=/|$|[^\w.-])", lambda m: by_prefix[m.group(1)], text)

    def with_paths(self, paths: Mapping[str, Path]) -> Layout:
        """This layout and ``paths`` (a pod's own volumes) over it."""
        return Layout({**self.paths, **paths})


def _find(objects: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if not found:
        raise KeyError(f"the chart renders no {kind} {name}")
    return found[0]


def _pod_and_container(obj: dict) -> tuple[dict, dict]:
    """A workload's pod spec and its (first) container; a FlinkDeployment's pod template's main container."""
    spec = obj["spec"]["podTemplate"]["spec"] if obj["kind"] == "FlinkDeployment" else obj["spec"]["template"]["spec"]
    return spec, spec["containers"][0]


def _data(obj: dict) -> dict[str, str]:
    """A ConfigMap's or Secret's entries as text (a Secret's ``data`` decoded, its ``stringData`` over it)."""
    decoded = (
        {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
        if obj["kind"] == "Secret"
        else dict(obj.get("data", {}))
    )
    return decoded | obj.get("stringData", {})


def pod_environment(objects: list[dict], container: dict, pod_name: str) -> dict[str, str]:
    """The container's ``env`` as the kubelet gives it, from the rendered ``objects``: values, Secret and ConfigMap
    keys (an optional missing key leaves its variable out), and the pod's name."""
    env = {}
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = str(variable["value"])
            continue
        source = variable["valueFrom"]
        if "fieldRef" in source:
            if source["fieldRef"]["fieldPath"] != "metadata.name":
                raise KeyError(f"{variable['name']}: only metadata.name is rehearsed, not {source['fieldRef']['fieldPath']}")
            env[variable["name"]] = pod_name
            continue
        kind, ref = ("Secret", source["secretKeyRef"]) if "secretKeyRef" in source else ("ConfigMap", source["configMapKeyRef"])
        data = _data(_find(objects, kind, ref["name"]))
        if ref["key"] in data:
            env[variable["name"]] = data[ref["key"]]
        elif not ref.get("optional", False):
            raise KeyError(f"{variable['name']}: {kind} {ref['name']} has no key {ref['key']}")
    return env


def volume_files(objects: list[dict], pod: dict, container: dict) -> dict[str, dict[str, str]]:
    """The files of each ConfigMap or Secret volume the container mounts, by mountPath (items, if listed, pick keys),
    from the rendered ``objects``."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files: dict[str, dict[str, str]] = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume or "secret" in volume:
            kind, name = (
                ("ConfigMap", volume["configMap"]["name"])
                if "configMap" in volume
                else ("Secret", volume["secret"]["secretName"])
            )
            data = _data(_find(objects, kind, name))
            items = (volume.get("configMap") or volume.get("secret")).get("items")
            files[mount["mountPath"]] = {i["path"]: data[i["key"]] for i in items} if items else data
    return files


@dataclass
class PodProcess:
    """One workload's container, laid out here: its argv and environment translated by its layout, its files
    written, its ports by name and its probes; ``start`` runs it (its output in ``log``), ``stop`` ends it."""

    workload: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int]
    probes: dict[str, dict]
    layout: Layout
    cwd: Path
    log: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def start(self, argv: list[str] | None = None) -> PodProcess:
        """Run the container's command (or ``argv``, in its environment) in a session of its own."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                argv or self.argv,
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def run(self, timeout_s: float, argv: list[str] | None = None) -> str:
        """Run the command (or ``argv``) to its end, as a Job's: its output; RehearsalError when it fails or outlasts
        ``timeout_s``."""
        self.start(argv)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RehearsalError(self.workload, f"still running after {timeout_s:.0f} s", self.output()) from None
        if code != 0:
            raise RehearsalError(self.workload, f"exited {code}", self.output())
        return self.output()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_for(self, check: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Wait until ``check()`` holds while the process runs; RehearsalError when it exits first or time runs out."""
        held = wait_until(lambda: check() or not self.alive(), timeout_s, 0.25) and self.alive()
        if not held:
            state = f"exited {self.process.returncode}" if not self.alive() else f"not within {timeout_s:.0f} s"
            raise RehearsalError(self.workload, f"{what}: {state}", self.output())

    def probe(self, kind: str) -> bool:
        """Whether the container's ``kind`` probe (startupProbe, readinessProbe, livenessProbe) answers now."""
        probe = self.probes[kind]
        if "httpGet" in probe:
            port = self._port(probe["httpGet"]["port"])
            try:
                with urllib.request.urlopen(
                    f"http://{LOCALHOST}:{port}{probe['httpGet']['path']}", timeout=probe.get("timeoutSeconds", 1) + 1
                ) as answer:
                    return 200 <= answer.status < 400
            except (urllib.error.URLError, OSError):
                return False
        if "grpc" in probe:
            return _grpc_serving(f"{LOCALHOST}:{self._port(probe['grpc']['port'])}", probe["grpc"].get("service", ""))
        if "tcpSocket" in probe:
            with socket.socket() as s:
                return s.connect_ex((LOCALHOST, self._port(probe["tcpSocket"]["port"]))) == 0
        command = [self.layout.local(a) for a in probe["exec"]["command"]]
        result = subprocess.run(
            command, env=self.env, cwd=self.cwd, capture_output=True, timeout=probe.get("timeoutSeconds", 1) + 30
        )
        return result.returncode == 0

    def _port(self, port: int | str) -> int:
        return self.ports[port] if isinstance(port, str) else port

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM to the process's session, SIGKILL after ``grace_s``: its exit code (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


def _grpc_serving(address: str, service: str) -> bool:
    """A gRPC health check (``grpc.health.v1``) of ``address``, as the kubelet's gRPC probe makes it."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def lay_out(
    objects: list[dict], kind: str, name: str, layout: Layout, pod_dir: Path, claims: Mapping[str, Path], ordinal: int = 0
) -> PodProcess:
    """The container of the workload ``kind``/``name`` laid out here: its volumes in ``pod_dir`` (a claim's at
    ``claims[claim name]``, shared by the pods that mount it), its ConfigMap and Secret files written there, its
    command and args, environment and files translated by ``layout`` with the volumes over it. A FlinkDeployment's
    argv is its job's args (see ``flink_job_argv``). The pod is named as Kubernetes names it: a StatefulSet's by its
    ``ordinal`` (a replacement has its predecessor's name), any other's with a suffix of its own."""
    obj = _find(objects, kind, name)
    pod, container = _pod_and_container(obj)
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    paths = {}
    for mount in container.get("volumeMounts", []):
        claim = volumes[mount["name"]].get("persistentVolumeClaim", {}).get("claimName")
        paths[mount["mountPath"]] = claims[claim] if claim else pod_dir / "volumes" / mount["name"]
    pod_layout = layout.with_paths(paths)
    for folder in paths.values():
        folder.mkdir(parents=True, exist_ok=True)
    for mount_path, files in volume_files(objects, pod, container).items():
        for file_name, content in files.items():
            (paths[mount_path] / file_name).write_text(pod_layout.local(content))
    image = image_environment(obj["spec"]["image"] if kind == "FlinkDeployment" else container["image"])
    pod_name = f"{name}-{ordinal}" if kind == "StatefulSet" else f"{name}-{uuid.uuid4().hex[:5]}"
    env = {k: pod_layout.local(v) for k, v in {**image, **pod_environment(objects, container, pod_name)}.items()}
    argv = (
        obj["spec"]["job"]["args"] if kind == "FlinkDeployment" else [*container.get("command", []), *container.get("args", [])]
    )
    probes = {k: container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container}
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", []) if "name" in p}
    work = pod_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    return PodProcess(name, [pod_layout.local(a) for a in argv], env, ports, probes, pod_layout, work, pod_dir / "output.log")


#: FlinkDeployment configuration the session cluster owns (HA and metrics are its own, not a job's).
CLUSTER_OWNED = ("high-availability.", "metrics.", "taskmanager.")


def flink_job_argv(objects: list[dict], name: str, flink: PodProcess, jobmanager: str) -> list[str]:
    """What the Flink operator runs for the FlinkDeployment ``name`` (application mode: its ``job.entryClass`` from its
    ``job.jarURI`` with its ``job.args``), as a detached ``flink run`` of that class and jar to the session cluster at
    ``jobmanager``, with the deployment's job-level ``flinkConfiguration``; paths by ``flink``'s layout (``flink`` is
    the deployment laid out by ``lay_out``, whose argv is the job's args)."""
    spec = _find(objects, "FlinkDeployment", name)["spec"]
    job = spec["job"]
    options = [
        f"-D{k}={flink.layout.local(str(v))}"
        for k, v in spec.get("flinkConfiguration", {}).items()
        if not k.startswith(CLUSTER_OWNED)
    ]
    jar = flink.layout.local(job["jarURI"].removeprefix("local://"))
    # The image's FLINK_HOME (its environment is laid out already).
    return [
        str(Path(flink.env["FLINK_HOME"]) / "bin" / "flink"),
        "run",
        "--detached",
        "--jobmanager",
        jobmanager,
        "--parallelism",
        str(job["parallelism"]),
        *options,
        "--class",
        job["entryClass"],
        jar,
        *flink.argv,
    ]
