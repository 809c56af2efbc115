"""Starting a training run: ``torchrun`` over ``offline_training.train``, and moving a checkpoint between world sizes.

``launch_training`` is what ``loopline train`` calls. It starts ``processes`` workers on this
machine (``torch.distributed.run --standalone``, i.e. ``torchrun``); across nodes, run the same
module with ``torchrun --nnodes ... --rdzv-endpoint ...`` or the ``deepspeed`` launcher, with the
same arguments. Without CUDA, DeepSpeed is told to use the CPU (``DS_ACCELERATOR=cpu``, gloo).

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
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

#: Where a run keeps its checkpoints, under its output folder.
CHECKPOINTS = "checkpoints"
#: The file DeepSpeed reads the newest checkpoint's tag from, and its universal counterpart.
LATEST, LATEST_UNIVERSAL = "latest", "latest_universal"
#: A universal checkpoint's tag is the source tag with this suffix.
UNIVERSAL_SUFFIX = "_universal"
#: The lines of output a TrainingError carries.
TAIL_LINES = 40


class TrainingError(RuntimeError):
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
            input_folder=str(checkpoints / tag), output_folder=str(checkpoints / universal),
            num_extract_workers=workers, num_merge_workers=workers, keep_temp_folder=False,
            strict=True, inject_missing_state=False,
        )
    )  # fmt: skip
    (checkpoints / LATEST_UNIVERSAL).write_text(universal)
    return universal


def _worker_env() -> dict[str, str]:
    """The workers' environment: DeepSpeed on the CPU where there is no CUDA; one math thread each."""
    import torch

    env = dict(os.environ)
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    # Processes, not threads, are the parallelism; a fixed thread count also keeps reductions reproducible.
    env.setdefault("OMP_NUM_THREADS", "1")
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
        raise RuntimeError("building DeepSpeed's ops failed: " + " | ".join((result.stdout + result.stderr).strip().splitlines()[-5:]))
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


def launch_training(
    snapshot_dir: Path,
    config: Path,
    out_dir: Path,
    processes: int = 2,
    resume: bool = False,
    tracking_uri: str | None = None,
    extra: Sequence[str] = (),
    echo: TextIO | None = None,
    niceness: int = 0,
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> subprocess.CompletedProcess:
    """Train on the snapshot at ``snapshot_dir`` with ``processes`` workers, ``niceness`` steps nicer than this process
    (``lower_priority``); outputs land in ``out_dir``. The launcher runs in a session of its own (its workers with it);
    ``on_start`` gets it as it starts (to stop it from elsewhere: ``os.killpg(process.pid, ...)``), and it is stopped
    if this call ends by an exception.

    The workers' output is appended to ``out_dir/train.log`` and, with ``echo``, copied there as it
    comes (the progress bar). With ``resume``, training continues from the newest checkpoint, converted
    to a universal one first when it was written by another number of processes. Raises
    :class:`TrainingError` when a worker fails; returns the finished process with its output.
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    arguments = ["--snapshot", str(Path(snapshot_dir).resolve()), "--config", str(Path(config).resolve()), "--out", str(out_dir)]
    if resume:
        arguments.append("--resume")
        written_by = checkpoint_world_size(out_dir / CHECKPOINTS)
        if written_by is not None and written_by != processes:
            convert_to_universal(out_dir / CHECKPOINTS)
            arguments.append("--universal")
    if tracking_uri:
        arguments += ["--tracking-uri", tracking_uri]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               "-m", "offline_training.train", *arguments, *extra]  # fmt: skip
    log, output = out_dir / "train.log", bytearray()
    with (
        open(log, "ab") as sink,
        subprocess.Popen(command, env=_worker_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True) as process,
    ):
        try:
            lower_priority(process.pid, niceness)
            if on_start is not None:
                on_start(process)
            for chunk in iter(lambda: process.stdout.read1(1 << 16), b""):
                sink.write(chunk)
                output += chunk
                if echo is not None:
                    echo.write(chunk.decode(errors="replace"))
                    echo.flush()
            returncode = process.wait()
        except BaseException:  # interrupted, or the echo failed: the workers do not outlive their launcher's caller
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
    text = output.decode(errors="replace")
    if returncode != 0:
        raise TrainingError(returncode, "\n".join(text.splitlines()[-TAIL_LINES:]), log)
    return subprocess.CompletedProcess(command, returncode, stdout=text)
