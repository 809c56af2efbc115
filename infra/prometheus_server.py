"""Prometheus from Debian's ``prometheus`` package: a plain process with its own config and data under the stack's
home, scraping every Loopline process and evaluating the alert rules under ``infra/prometheus/``."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import requests

from infra.errors import StackError
from infra.jars import require_tool
from infra.service import ManagedService

#: The alert rule files every stack loads.
RULES_DIR = Path(__file__).parent / "prometheus"


def stack_rule_files() -> list[Path]:
    """The rule files every stack's Prometheus evaluates: each ``*.rules.yml`` under RULES_DIR."""
    return sorted(RULES_DIR.glob("*.rules.yml"))


def alert_names(rule_files: Sequence[Path] | None = None) -> set[str]:
    """The alerts the rule files define (default: the stack's, under ``infra/prometheus/``)."""
    import yaml

    files = stack_rule_files() if rule_files is None else rule_files
    return {
        rule["alert"]
        for path in files
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def alerts(address: str, timeout_s: float = 5.0) -> list[dict]:
    """The alerts pending or firing now at the Prometheus at ``address`` (its ``/api/v1/alerts``: each with
    ``labels``, ``state``, ``activeAt``). Raises StackError when it does not answer or answers with an error."""
    try:
        reply = requests.get(f"{address}/api/v1/alerts", timeout=timeout_s)
        reply.raise_for_status()
        return reply.json()["data"]["alerts"]
    except (requests.RequestException, ValueError, KeyError, TypeError) as err:
        raise StackError(f"prometheus at {address} did not list its alerts: {err}", "loopline stack up starts it") from err


@cache
def _server_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"version (\S+)", out)
    return found.group(1) if found else "unknown"


class PrometheusServer(ManagedService):
    """A local Prometheus scraping ``targets`` (job name → ``host:port`` list) every ``scrape_interval_s`` and evaluating
    ``rule_files`` (default: every ``*.rules.yml`` under ``infra/prometheus/``)."""

    name = "prometheus"
    cmdline_marker = "prometheus"

    def __init__(
        self,
        host: str,
        port: int,
        targets: dict[str, list[str]],
        scrape_interval_s: float,
        data_dir: Path,
        run_dir: Path,
        log_dir: Path,
        start_timeout_s: float = 30.0,
        rule_files: Sequence[Path] | None = None,
    ) -> None:
        super().__init__(run_dir, log_dir, start_timeout_s)
        self.host, self.port, self.targets, self.scrape_interval_s = host, port, targets, scrape_interval_s
        self.rule_files = stack_rule_files() if rule_files is None else list(rule_files)
        self.data_dir = data_dir / "prometheus"
        self.config_file = self.data_dir / "prometheus.yml"

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def ports(self) -> dict[str, tuple[str, int]]:
        return {"web": (self.host, self.port)}

    def version(self) -> str:
        binary = shutil.which("prometheus")
        return _server_version(binary) if binary else "not installed"

    def config(self) -> dict:
        """The Prometheus configuration: scrape jobs and rule files (JSON is YAML)."""
        interval = f"{self.scrape_interval_s:g}s"
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in self.targets.items()
            ],
        }

    def start(self) -> bool:
        """Start Prometheus, or, when it already runs, rewrite its config and have it reload: targets and rule files
        added since it started are picked up by `stack up`."""
        started = super().start()
        if not started:
            self.prepare()
            try:
                requests.post(f"{self.address}/-/reload", timeout=10).raise_for_status()
            except requests.RequestException as err:
                raise StackError(
                    f"prometheus at {self.address} did not reload its config: {err}", f"see {self.log_file}"
                ) from err
        return started

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(json.dumps(self.config(), indent=2))

    def command(self) -> list[str]:
        return [
            require_tool("prometheus", "prometheus"),
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--storage.tsdb.retention.time=7d",
            "--web.enable-lifecycle",
        ]

    def ready(self) -> bool:
        """Prometheus' own readiness endpoint answers 200."""
        try:
            return requests.get(f"{self.address}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def wipe(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)
