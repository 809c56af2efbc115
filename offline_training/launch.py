"""Starting a training run: ``torchrun`` over ``offline_training.train``, and moving a checkpoint between world sizes.

``launch_training`` is what ``loopline train`` calls. It starts ``processes`` workers on this node
(``torch.distributed.run``, i.e. ``torchrun``), one node of the :class:`~offline_training.rendezvous.NodeGroup`
it is given: alone by default, or one of N nodes that meet at a rendezvous and share the output folder
(a volume every node mounts). The ``deepspeed`` launcher with a hostfile runs the same module with the
same arguments and ``--no_local_rank`` (the trainer reads ``LOCAL_RANK`` from the environment). Without CUDA,
DeepSpeed is told to use the CPU (``DS_ACCELERATOR=cpu``, gloo).

ZeRO partitions optimizer state by data-parallel rank, so a checkpoint loads only on the world
size that wrote it. To resume on another one, :func:`convert_to_universal` turns it into a
universal checkpoint (``deepspeed.checkpoint.ds_to_universal``: one file per parameter and state,
unpartitioned) and the workers load that instead; ``launch_training(resume=True)`` does so by
itself when the world size differs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from offline_training.errors import OfflineTrainingError
from offline_training.rendezvous import ONE_NODE, NodeGroup

#: Where a run keeps its checkpoints, under its output folder.
CHECKPOINTS = "checkpoints"
#: The file DeepSpeed reads the newest checkpoint's tag from, and its universal counterpart.
LATEST, LATEST_UNIVERSAL = "latest", "latest_universal"
#: A universal checkpoint's tag is the source tag with this suffix.
UNIVERSAL_SUFFIX = "_universal"
#: The lines of output a TrainingError carries.
TAIL_LINES = 40
#: Training processes per node on a machine without a visible GPU.
CPU_PROCESSES = 2
#: cuBLAS's workspace configuration under ``torch.use_deterministic_algorithms(True)`` (offline_training/train.py): with
#: CUDA 10.2 or later, cuBLAS is deterministic only with a fixed workspace (``:4096:8`` or ``:16:8``), set before its
#: first call; without it, deterministic mode raises at the first matmul on a GPU. On the CPU it is ignored.
CUBLAS_WORKSPACE_CONFIG = ":4096:8"


class TrainingError(OfflineTrainingError, RuntimeError):
    """A training run failed; ``output`` holds its last lines, ``log`` the path of the whole log."""

    def __init__(self, returncode: int, output: str, log: Path) -> None:
        self.returncode, self.output, self.log = returncode, output, log
        super().__init__(
            f"training exited with status {returncode}; its last lines:\n{output}\n"
            f"Full log: {log}. Fix the cause, then launch again with resume=True (--resume) to continue "
            "from the last checkpoint."
        )


def latest_tag(checkpoints: Path, universal: bool = False) -> str:
    """The tag of the newest checkpoint under ``checkpoints`` (its universal one with ``universal``)."""
    pointer = Path(checkpoints) / (LATEST_UNIVERSAL if universal else LATEST)
    if not pointer.is_file():
        raise FileNotFoundError(f"no checkpoint to resume from: {pointer} does not exist (start without --resume)")
    return pointer.read_text().strip()


def checkpoint_world_size(checkpoints: Path) -> int | None:
    """How many data-parallel processes wrote the newest checkpoint (None: unpartitioned, ZeRO stage 0)."""
    tag_dir = Path(checkpoints) / latest_tag(checkpoints)
    # One optimizer-state shard per data-parallel rank: zero_pp_rank_<rank>_mp_rank_00_optim_states.pt.
    return len(list(tag_dir.glob("*zero_pp_rank_*_mp_rank_*_optim_states.pt"))) or None


def convert_to_universal(checkpoints: Path, workers: int = 1) -> str:
    """Convert the newest checkpoint under ``checkpoints`` to a universal one beside it; its tag.

    Idempotent: a conversion already done is reused. ``latest_universal`` is written last, so a
    conversion cut short is redone. ``workers`` > 1 extracts shards in parallel processes (large models).
    """
    from deepspeed.checkpoint import ds_to_universal

    checkpoints = Path(checkpoints)
    tag = latest_tag(checkpoints)
    universal = f"{tag}{UNIVERSAL_SUFFIX}"
    if (checkpoints / LATEST_UNIVERSAL).is_file() and latest_tag(checkpoints, universal=True) == universal:
        return universal
    shutil.rmtree(checkpoints / universal, ignore_errors=True)
    ds_to_universal.main(
        argparse.Namespace(
            input_folder=str(checkpoints / tag),
            output_folder=str(checkpoints / universal),
            num_extract_workers=workers,
            num_merge_workers=workers,
            keep_temp_folder=False,
            strict=True,
            inject_missing_state=False,
        )
    )
    (checkpoints / LATEST_UNIVERSAL).write_text(universal)
    return universal


def visible_gpus() -> int:
    """How many GPUs this process may use, without starting CUDA (no torch): as many as ``CUDA_VISIBLE_DEVICES`` lists
    when it is set (empty or ``-1``: none; CUDA stops at the first entry that is not a device), else the lines of
    ``nvidia-smi -L`` where it runs, else 0."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        count = 0
        for entry in (item.strip() for item in listed.split(",")):
            if not entry or entry.startswith("-"):
                break
            count += 1
        return count
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return 0
    try:
        result = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in result.stdout.splitlines()) if result.returncode == 0 else 0


def default_processes() -> int:
    """Training processes per node when none are asked for (``feedback.train_processes`` unset): one per visible GPU
    (NCCL wants one rank per device), else :data:`CPU_PROCESSES` on the CPU."""
    return visible_gpus() or CPU_PROCESSES


def _worker_env() -> dict[str, str]:
    """The launcher's and workers' environment: DeepSpeed on the CPU where there is no CUDA; one math thread each; cuBLAS
    deterministic (:data:`CUBLAS_WORKSPACE_CONFIG`, in the workers' environment before anything imports torch)."""
    import torch

    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    # Processes, not threads, are the parallelism; a fixed thread count also keeps reductions reproducible.
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    # The workers' store is their own, not the rendezvous': torchrun's shared one breaks restarts (pytorch#135712).
    # Measured here: a node that rejoined after a kill waited for a key its round never set, until both timed out.
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return env


#: What DeepSpeed's communication backend builds as it initializes (``deepspeed.comm.torch.build_shm_op``): on the
#: CPU accelerator its shared-memory collectives, a C++ extension compiled into torch's extensions cache (minutes on 2
#: cores); elsewhere nothing. Run in a worker's environment, so the accelerator is the one training will use.
_BUILD_COMM_OPS = """
from deepspeed.comm.torch import build_shm_op
from deepspeed.accelerator import get_accelerator
print(f"{get_accelerator().device_name()}: {'shared-memory communication op built' if build_shm_op() else 'nothing to build'}")
"""


def build_deepspeed_ops() -> str:
    """Build what DeepSpeed would otherwise compile in the first training run's ``initialize`` (cached by torch; a
    second call takes seconds); what was built. RuntimeError with the compiler's last lines when the build fails."""
    result = subprocess.run([sys.executable, "-c", _BUILD_COMM_OPS], env=_worker_env(), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            "building DeepSpeed's ops failed: " + " | ".join((result.stdout + result.stderr).strip().splitlines()[-5:])
        )
    return result.stdout.strip().splitlines()[-1]


def lower_priority(pid: int, niceness: int) -> None:
    """Make process ``pid``, which runs in a session of its own, and everything it starts ``niceness`` steps nicer than
    this process (at most 19). Both its own nice value and, where the kernel schedules each session as one group
    (autogroup: then a process's nice counts only against its own session's), its session's group's."""
    if niceness <= 0:
        return
    nice = min(os.getpriority(os.PRIO_PROCESS, 0) + niceness, 19)
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(nice))


def stop_training(launcher: subprocess.Popen) -> None:
    """Kill a training launcher and its workers now (SIGKILL), as a node's loss would. torchrun starts each worker in a
    session of its own, so the launcher's session alone does not hold them; once it is gone, nothing would stop them."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(launcher.pid)
        for process in [*root.children(recursive=True), root]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def launch_training(
    snapshot_dir: Path | str,
    config: Path,
    out_dir: Path,
    processes: int = 2,
    resume: bool = False,
    tracking_uri: str | None = None,
    extra: Sequence[str] = (),
    echo: TextIO | None = None,
    niceness: int = 0,
    on_start: Callable[[subprocess.Popen], None] | None = None,
    nodes: NodeGroup = ONE_NODE,
) -> subprocess.CompletedProcess:
    """Train on the snapshot at ``snapshot_dir`` (a path or an fsspec URL) with ``processes`` workers on this node of
    ``nodes``, ``niceness`` steps nicer than this process (``lower_priority``); outputs land in ``out_dir``, which every
    node of a multi-node run must see as one folder (a shared volume). The launcher runs in a session of its own;
    ``on_start`` gets it as it starts (to stop it and its workers from elsewhere: :func:`stop_training`), and both are
    stopped if this call ends by an exception.

    The workers' output is appended to ``out_dir/train.log`` (node 0; node R's to ``train.node<R>.log``) and, with
    ``echo``, copied there as it comes (the progress bar). With ``resume``, training continues from the newest
    checkpoint, converted to a universal one first (by node 0) when it was written by another number of processes
    than ``processes`` × ``nodes.nnodes``. Raises :class:`TrainingError` when a worker fails beyond
    ``nodes.max_restarts``; returns the finished process with its output.
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    # An fsspec URL goes to the workers as given; a path is made absolute, as the other folders are.
    snapshot = str(snapshot_dir) if "://" in str(snapshot_dir) else str(Path(snapshot_dir).resolve())
    arguments = ["--snapshot", snapshot, "--config", str(Path(config).resolve()), "--out", str(out_dir)]
    if resume:
        arguments.append("--resume")
        written_by = checkpoint_world_size(out_dir / CHECKPOINTS)
        if written_by is not None and written_by != processes * nodes.nnodes:
            if nodes.node_rank == 0:  # the others' workers wait for node 0 at the rendezvous, so for the conversion
                convert_to_universal(out_dir / CHECKPOINTS)
            arguments.append("--universal")
    if tracking_uri:
        arguments += ["--tracking-uri", tracking_uri]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *nodes.torchrun_arguments(processes),
        "-m",
        "offline_training.train",
        *arguments,
        *extra,
    ]
    log, output = out_dir / ("train.log" if nodes.node_rank == 0 else f"train.node{nodes.node_rank}.log"), bytearray()
    with (
        open(log, "ab") as sink,
        subprocess.Popen(
            command, env=_worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        ) as process,
    ):
        try:
            lower_priority(process.pid, niceness)
            if on_start is not None:
                on_start(process)
            for chunk in iter(lambda: process.stdout.read1(1 << 16), b""):
                sink.write(chunk)
                sink.flush()  # the log is live: a `tail -f` (on any node, on the shared volume) sees what the workers said
                output += chunk
                if echo is not None:
                    echo.write(chunk.decode(errors="replace"))
                    echo.flush()
            returncode = process.wait()
        except BaseException:  # interrupted, or the echo failed: the workers do not outlive their launcher's caller
            stop_training(process)
            raise
    text = output.decode(errors="replace")
    if returncode != 0:
        raise TrainingError(returncode, "\n".join(text.splitlines()[-TAIL_LINES:]), log)
    return subprocess.CompletedProcess(command, returncode, stdout=text)
