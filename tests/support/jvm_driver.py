"""A Java test driver (``tests/support/jvm``) as a process the tests talk to line by line: built with the operators it
drives into one jar, started once per module."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.jars import flink_connector_jar, operator_libraries
from loopline.settings import Settings
from streams.operators_jar import SOURCES, flink_classpath, operators_jar

DRIVERS = Path(__file__).with_name("jvm")


class JvmDriver:
    """One running driver: ``ask`` sends lines and reads its one-line answer."""

    def __init__(self, jar: Path, main_class: str) -> None:
        self.process = subprocess.Popen(
            ["java", "-cp", f"{jar}:{flink_classpath()}", f"dev.loopline.streams.{main_class}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )

    def tell(self, *lines: str) -> None:
        """Send ``lines`` (the driver answers none of them)."""
        assert self.process.stdin is not None
        self.process.stdin.write("".join(f"{line}\n" for line in lines))
        self.process.stdin.flush()

    def ask(self, *lines: str) -> str:
        """Send ``lines``; the driver's answer to the last, without its newline."""
        self.tell(*lines)
        assert self.process.stdout is not None
        return self.process.stdout.readline().rstrip("\n")

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


@contextmanager
def jvm_driver(folder: Path, main_class: str) -> Iterator[JvmDriver]:
    """The driver ``main_class`` built into a jar under ``folder`` with the operators and their libraries, running."""
    jars = Settings().resolved_jars_dir
    driver = JvmDriver(
        operators_jar(folder, operator_libraries(jars), flink_connector_jar(jars), (SOURCES, DRIVERS), main_class), main_class
    )
    try:
        yield driver
    finally:
        driver.close()
