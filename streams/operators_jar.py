"""The feature job's JVM operators (``streams/jvm``), compiled against PyFlink's own Flink jars.

The per-event work of the job (lateness, sliding windows, batching for the offline log, the online writes) runs in
the JVM, where keyed state is a heap object rather than a round trip to a Python worker; Python keeps what needs the
contracts (decoding, dead letters, the offline parquet log) and gets its rows in Arrow batches. The libraries the
operators use (Jedis) are packed into the jar, so it goes wherever the job goes as one file (``pipeline.jars``,
``flink run -j``, the Flink image). The jar is built once per source and library version and cached.
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


def _source_digest(sources: list[tuple[Path, Path]], libraries: list[str]) -> str:
    digest = hashlib.sha256()
    for root, source in sources:
        digest.update(source.relative_to(root).as_posix().encode())
        digest.update(source.read_bytes())
    for library in libraries:
        digest.update(library.encode())
    return digest.hexdigest()[:12]


def operators_jar(
    build_dir: Path,
    libraries: Sequence[Path],
    connector: Path,
    roots: Sequence[Path] = (SOURCES,),
    name: str = "loopline-operators",
) -> Path:
    """The jar of the Java sources under ``roots`` (the feature job's by default) with the classes of ``libraries``
    (``infra/jars.operator_libraries``), in ``build_dir``, compiled with the JDK's ``javac`` if these sources have no
    jar yet (another job adds its own root to the feature job's). They compile against the Kafka ``connector`` jar too
    (the progress publisher asks Kafka for end offsets with the client it shades), which every job carries beside this
    one, so it is not packed."""
    located = sorted((root, source) for root in roots for source in root.rglob("*.java"))
    sources = [source for _, source in located]
    jar = build_dir / f"{name}-{_source_digest(located, [library.name for library in (*libraries, connector)])}.jar"
    if jar.exists():
        return jar
    missing = [library for library in (*libraries, connector) if not library.exists()]
    if missing:
        raise OperatorsBuildError(f"the operators' libraries are not fetched ({missing[0]}; fix: loopline stack setup)")
    javac = shutil.which("javac")
    if javac is None:
        raise OperatorsBuildError("`javac` is not installed (fix: apt-get install openjdk-17-jdk-headless)")
    build_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build_dir) as classes:
        result = subprocess.run(
            [
                javac,
                "-nowarn",
                "--release",
                "17",
                "-d",
                classes,
                "-cp",
                ":".join([flink_classpath(), *map(str, libraries), str(connector)]),
                *map(str, sources),
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise OperatorsBuildError(f"javac failed: {result.stderr.strip()[-2000:]}")
        partial = jar.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(Path(classes).rglob("*.class")):
                archive.write(path, path.relative_to(classes).as_posix())
            for library in libraries:
                _pack_library(archive, library)
        partial.rename(jar)
    return jar


def _pack_library(archive: zipfile.ZipFile, library: Path) -> None:
    """Copy a library jar's classes and resources into ``archive``: not its manifest, signatures or module
    descriptors (the merged jar is one unsigned, unnamed module), nor a name an earlier library already wrote."""
    taken = set(archive.namelist())
    with zipfile.ZipFile(library) as source:
        for entry in source.infolist():
            name = entry.filename
            if entry.is_dir() or name in taken or name.startswith("META-INF/") and not name.startswith("META-INF/services/"):
                continue
            if name.endswith("module-info.class"):
                continue
            archive.writestr(entry, source.read(entry))
