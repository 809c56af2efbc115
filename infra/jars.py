"""The JVM artifacts of the stack, fetched from Maven Central with the versions pinned in ``infra/pom.xml``."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from infra.errors import StackError

POM = Path(__file__).with_name("pom.xml")
_MAVEN_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


@dataclass(frozen=True)
class PinnedVersions:
    """The versions pinned in the pom: the Kafka broker, the Flink Kafka SQL connector, and the operators' libraries
    (``artifact-version.jar`` names)."""

    kafka: str
    flink_kafka_connector: str
    operator_libraries: tuple[str, ...]


def connector_flink_minor(connector_version: str) -> str:
    """The Flink minor version a Flink Kafka connector was built for (``5.0.0-2.2`` -> ``2.2``)."""
    return connector_version.rsplit("-", 1)[-1]


@cache
def pinned_versions() -> PinnedVersions:
    """Read the pinned versions from ``infra/pom.xml`` (the only place they are written)."""
    props = ET.parse(POM).getroot().find("m:properties", _MAVEN_NS)
    assert props is not None, f"{POM} has no <properties>"

    def prop(name: str) -> str:
        element = props.find(f"m:{name}", _MAVEN_NS)
        assert element is not None and element.text, f"{POM} does not pin {name}"
        return element.text.strip()

    execution = ET.parse(POM).getroot().find(".//m:execution[m:id='operator-libraries']", _MAVEN_NS)
    assert execution is not None, f"{POM} has no operator-libraries execution"
    libraries = []
    for item in execution.iterfind(".//m:artifactItem", _MAVEN_NS):
        artifact, version = item.findtext("m:artifactId", namespaces=_MAVEN_NS), item.findtext("m:version", namespaces=_MAVEN_NS)
        assert artifact and version, f"{POM}: an operator library without artifactId or version"
        for name in ("jedis.version", "avro.version", "jackson.version"):
            version = version.replace(f"${{{name}}}", prop(name))
        libraries.append(f"{artifact}-{version}.jar")
    return PinnedVersions(
        kafka=prop("kafka.version"),
        flink_kafka_connector=prop("flink.kafka.connector.version"),
        operator_libraries=tuple(libraries),
    )


def require_tool(tool: str, debian_package: str) -> str:
    """The path of ``tool`` on PATH, or a StackError saying which Debian package provides it."""
    path = shutil.which(tool)
    if path is None:
        raise StackError(f"`{tool}` is not installed", f"apt-get install {debian_package}")
    return path


def kafka_jars_dir(jars_dir: Path) -> Path:
    """Where the broker's jars (and their dependencies) are cached."""
    return jars_dir / f"kafka-{pinned_versions().kafka}"


def flink_connector_jar(jars_dir: Path) -> Path:
    """The cached Flink Kafka SQL connector jar."""
    return jars_dir / "flink" / f"flink-sql-connector-kafka-{pinned_versions().flink_kafka_connector}.jar"


def operator_libraries(jars_dir: Path) -> list[Path]:
    """The cached jars the feature job's JVM operators use (Jedis, Avro, Jackson and their dependencies), packed into
    their jar."""
    return [jars_dir / "operator-libraries" / name for name in pinned_versions().operator_libraries]


def _maven(goal: str, output_dir: Path) -> None:
    mvn = require_tool("mvn", "maven")
    require_tool("java", "openjdk-17-jre-headless")
    result = subprocess.run(
        [mvn, "-q", "-B", "-f", str(POM), goal, f"-DoutputDirectory={output_dir}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        shutil.rmtree(output_dir, ignore_errors=True)
        last = " | ".join(result.stdout.strip().splitlines()[-3:])
        raise StackError(f"Maven could not fetch the stack's jars: {last}", "check access to Maven Central and retry")


def ensure_jars(jars_dir: Path) -> list[Path]:
    """Fetch the broker and connector jars unless they are cached; return what was fetched."""
    fetched = []
    kafka_dir = kafka_jars_dir(jars_dir)
    version = pinned_versions().kafka
    if not all((kafka_dir / f"{artifact}-{version}.jar").exists() for artifact in ("kafka_2.13", "kafka-tools")):
        _maven("dependency:copy-dependencies", kafka_dir)
        fetched.append(kafka_dir)
    connector = flink_connector_jar(jars_dir)
    if not connector.exists():
        _maven("dependency:copy", connector.parent)
        fetched.append(connector)
    libraries = operator_libraries(jars_dir)
    if not all(library.exists() for library in libraries):
        _maven("dependency:copy@operator-libraries", libraries[0].parent)
        fetched.append(libraries[0].parent)
    return fetched
