"""What a PyFlink job ships to a Flink cluster whose TaskManagers have only a bare Python and Java: its Python
environment and Loopline's code, as two archives.

The environment is a venv over the TaskManagers' own interpreter (``python -m venv --copies``: the interpreter is
copied in, its standard library is the TaskManagers'), holding only what the jobs' Python functions import, at the
versions installed here, so the workers unpickle exactly what the client pickled. It is built once per requirement
set (minutes) and cached under ``~/.cache/loopline/job-env/<digest>.zip``; ``flink run -pyarch`` unpacks it beside
every Python worker and ``-pyexec`` runs its interpreter. Loopline's code changes more often, so it travels apart,
as a small zip on the workers' ``PYTHONPATH`` (``-pyfs``), rebuilt when a source file changes.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import py_compile
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from streams.errors import StreamsError

#: What the jobs' Python functions import on a TaskManager: PyFlink's worker (it pulls Beam, pandas, pyarrow) and
#: pydantic (the record contracts). Not Feast: the online writes run in the JVM, with the layout the client took from
#: Feast when it built the job.
WORKER_REQUIREMENTS = ("apache-flink", "pydantic")
#: PyFlink's jars, scripts and configuration (~250 MB): the cluster has its own, a worker needs none of them.
_NOT_SHIPPED = {"apache-flink-libraries"}
#: Loopline's packages whose code the jobs' functions run (``schemas`` imports nothing; the rest import no further up).
CODE_PACKAGES = ("schemas", "streams", "feature_store", "feedback_loop")
_ROOT = Path(__file__).resolve().parents[1]


class JobArchiveError(StreamsError, RuntimeError):
    """The job environment cannot be built: ``str(err)`` says what and the fix."""


def cache_dir() -> Path:
    """Where the archives are kept: the user's cache (``$XDG_CACHE_HOME``, else ``~/.cache``), ``loopline/job-env``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "loopline" / "job-env"


def pinned_requirements(
    python_full_version: str, roots: Iterable[str] = WORKER_REQUIREMENTS, excluded: Iterable[str] = _NOT_SHIPPED
) -> list[str]:
    """``name==version`` for each distribution ``roots`` need, transitively (with their extras), on a Python of
    ``python_full_version`` (the markers are the target's: redis-py needs async-timeout below 3.11.3), at the versions
    installed in this interpreter; the ``excluded`` distributions (by default PyFlink's own jars) and what only they
    need left out."""
    excluded = {canonicalize_name(name) for name in excluded}
    target = {"python_full_version": python_full_version, "python_version": python_full_version.rsplit(".", 1)[0]}
    pinned: dict[str, tuple[str, frozenset[str]]] = {}
    todo = [Requirement(root) for root in roots]
    while todo:
        requirement = todo.pop()
        name, extras = canonicalize_name(requirement.name), frozenset(requirement.extras)
        if name in excluded or (name in pinned and extras <= pinned[name][1]):
            continue
        try:
            dist = distribution(requirement.name)
        except PackageNotFoundError:
            raise JobArchiveError(
                f"{requirement.name}, which the jobs need on Python {python_full_version}, is not installed "
                f"here, so its version is unknown — fix: pip install {requirement}"
            ) from None
        extras |= pinned.get(name, ("", frozenset()))[1]
        pinned[name] = (dist.version, extras)
        for text in dist.requires or []:
            needed = Requirement(text)
            if needed.marker is None or any(needed.marker.evaluate({**target, "extra": extra}) for extra in extras or {""}):
                todo.append(needed)
    return [f"{name}=={version}" for name, (version, _) in sorted(pinned.items())]


def python_version(python: str) -> str:
    """The full version (``3.11.2``) of the interpreter at ``python``; JobArchiveError when it is not this
    interpreter's ``major.minor`` (the workers unpickle what this one pickles, and load wheels built for it)."""
    try:
        result = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        raise JobArchiveError(f"{python} does not run — fix: set flink.python to the TaskManagers' Python 3") from None
    theirs, ours = result.stdout.strip(), f"{sys.version_info.major}.{sys.version_info.minor}"
    if theirs.rsplit(".", 1)[0] != ours:
        raise JobArchiveError(
            f"the TaskManagers' Python ({python}) is {theirs}, the jobs' is {ours} — fix: set "
            f"flink.python to a Python {ours} present at that path on every TaskManager"
        )
    return theirs


def environment_archive(base_python: str, requirements: Sequence[str], directory: Path | None = None) -> Path:
    """The zip of a venv over ``base_python`` (the TaskManagers' interpreter) with ``requirements`` installed from the
    package index, built unless cached under a digest of both."""
    digest = hashlib.sha256("\n".join([base_python, *requirements]).encode()).hexdigest()[:12]
    directory = directory or cache_dir()
    archive = directory / f"loopline-job-env-{digest}.zip"
    if archive.exists():
        return archive
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as work:
        venv, listed = Path(work) / "env", Path(work) / "requirements.txt"
        listed.write_text("\n".join(requirements) + "\n")
        _run([base_python, "-m", "venv", "--copies", "--without-pip", str(venv)], "venv")
        # This interpreter's pip installs into the venv: the bare Python needs no pip of its own. Every
        # distribution is pinned, so no resolution happens (and none pulls PyFlink's jars back in).
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(venv / "bin" / "python"),
                "install",
                "--no-deps",
                "--no-compile",
                "--quiet",
                "-r",
                str(listed),
            ],
            "pip install",
        )
        # Byte code checked by hash, not by the sources' times (which unpacking does not keep): a worker imports Feast
        # and Beam without compiling them, which on a busy TaskManager took longer than a checkpoint's interval.
        compileall.compile_dir(venv / "lib", quiet=1, workers=0, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        _zip(venv, archive)
    return archive


def code_archive(directory: Path | None = None, packages: Sequence[str] = CODE_PACKAGES) -> Path:
    """A zip of Loopline's ``packages`` (their ``.py`` files), named by a digest of them; made unless it exists."""
    sources = sorted(path for package in packages for path in (_ROOT / package).rglob("*.py") if "__pycache__" not in path.parts)
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.relative_to(_ROOT).as_posix().encode() + b"\0" + source.read_bytes())
    directory = directory or cache_dir()
    archive = directory / f"loopline-code-{digest.hexdigest()[:12]}.zip"
    if not archive.exists():
        directory.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(f".{archive.name}-{os.getpid()}")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zipped:
            for source in sources:
                zipped.write(source, source.relative_to(_ROOT).as_posix())
        partial.rename(archive)
    return archive


def _run(command: list[str], step: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        last = " | ".join((result.stdout + result.stderr).strip().splitlines()[-3:])
        raise JobArchiveError(
            f"building the job environment failed at {step}: {last} — fix: check access to the package "
            "index (pip's settings) and retry `loopline stack setup`"
        )


def _zip(venv: Path, archive: Path) -> None:
    """Zip ``venv``'s files (their modes kept, so its interpreter stays executable once unpacked); links are left out
    (a venv's only one is ``lib64 -> lib``)."""
    partial = archive.with_name(f".{archive.name}-{os.getpid()}")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zipped:
        for path in sorted(venv.rglob("*")):
            if path.is_file() and not path.is_symlink():
                zipped.write(path, path.relative_to(venv).as_posix())
    partial.rename(archive)
