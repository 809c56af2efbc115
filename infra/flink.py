"""The Flink runtime: PyFlink's own (from PyPI) plus the Flink Kafka SQL connector jar (from Maven Central).

There is no long-running Flink process in the embedded stack: each job starts a local
mini-cluster inside PyFlink. What must hold is that the connector was built for the Flink
version PyFlink ships, which this module checks.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from infra.errors import StackError
from infra.jars import connector_flink_minor, flink_connector_jar, pinned_versions
from infra.service import ServiceStatus


def pyflink_version() -> str:
    """The installed apache-flink version."""
    try:
        return version("apache-flink")
    except PackageNotFoundError:
        raise StackError("PyFlink (apache-flink) is not installed", "pip install -e . (or `make demo`)") from None


def check_connector_matches(flink_version: str, connector_version: str) -> None:
    """Raise StackError unless the connector (``5.0.0-2.2``) was built for this Flink (``2.2.x``)."""
    built_for = connector_flink_minor(connector_version)
    flink_minor = ".".join(flink_version.split(".")[:2])
    if built_for != flink_minor:
        raise StackError(
            f"flink-sql-connector-kafka {connector_version} is built for Flink {built_for}, but PyFlink is {flink_version}",
            f"pin apache-flink=={built_for}.* in pyproject.toml or a connector for {flink_minor} in infra/pom.xml",
        )


class FlinkRuntime:
    """PyFlink plus its Kafka connector jar, checked to match."""

    name = "flink"

    def __init__(self, jars_dir: Path) -> None:
        self.jars_dir = jars_dir

    @property
    def connector_jar(self) -> Path:
        """The connector jar jobs add to ``pipeline.jars``."""
        return flink_connector_jar(self.jars_dir)

    def check(self) -> None:
        """Raise StackError if the connector is missing or does not match PyFlink."""
        check_connector_matches(pyflink_version(), pinned_versions().flink_kafka_connector)
        if not self.connector_jar.exists():
            raise StackError(f"the Flink Kafka connector is missing ({self.connector_jar})", "run `loopline stack setup`")

    def status(self) -> ServiceStatus:
        """Ready when the versions match and the jar is there; jobs run on an embedded mini-cluster."""
        try:
            self.check()
            state = "ready"
        except StackError as err:
            state = f"error: {err.problem}"
        return ServiceStatus(
            self.name,
            state,
            "embedded",
            f"{pyflink_version()} / connector {pinned_versions().flink_kafka_connector}",
            None,
            str(self.connector_jar),
        )
