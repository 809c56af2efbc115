"""The feature job's JVM operators (``streams/jvm``), compiled against PyFlink's own Flink jars.

The per-event work of the job (lateness, sliding windows, batching for the offline log) runs in
the JVM, where keyed state is a heap object rather than a round trip to a Python worker; Python
keeps what needs the contracts and Feast (decoding, dead letters, online and offline writes) and
gets its rows in Arrow batches. The jar is built once per source version and cached.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

SOURCES = Path(__file__).with_name("jvm") / "src"


class OperatorsBuildError(RuntimeError):
    """The JVM operators could not be compiled (no JDK, or a compile error)."""


def flink_classpath() -> str:
    """PyFlink's own jars, as a class path: what the operators compile and run against."""
    spec = importlib.util.find_spec("pyflink")
    assert spec is not None and spec.submodule_search_locations, "PyFlink is not installed"
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return ":".join(str(jar) for jar in sorted(lib.glob("*.jar")))


def _source_digest(sources: list[tuple[Path, Path]]) -> str:
    digest = hashlib.sha256()
    for root, source in sources:
        digest.update(source.relative_to(root).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def operators_jar(build_dir: Path, roots: Sequence[Path] = (SOURCES,), name: str = "loopline-operators") -> Path:
    """The jar of the Java sources under ``roots`` (the feature job's by default), in ``build_dir``, compiled with the
    JDK's ``javac`` if these sources have no jar yet (another job adds its own root to the feature job's)."""
    located = sorted((root, source) for root in roots for source in root.rglob("*.java"))
    sources = [source for _, source in located]
    jar = build_dir / f"{name}-{_source_digest(located)}.jar"
    if jar.exists():
        return jar
    javac = shutil.which("javac")
    if javac is None:
        raise OperatorsBuildError("`javac` is not installed (fix: apt-get install openjdk-17-jdk-headless)")
    build_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build_dir) as classes:
        result = subprocess.run(
            [javac, "-nowarn", "--release", "17", "-d", classes, "-cp", flink_classpath(), *map(str, sources)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise OperatorsBuildError(f"javac failed: {result.stderr.strip()[-2000:]}")
        partial = jar.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(Path(classes).rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
        partial.rename(jar)
    return jar
