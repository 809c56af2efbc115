"""The documentation site (mkdocs.yml, docs/): it builds with ``--strict``, every local link and anchor in the built
pages and in README.md resolves, the generated reference pages name everything the code defines (commands, settings,
metrics, alerts; the lists computed from the code here, not from the generator), and a page renders in headless
Chromium (Debian's ``chromium``). The screenshot is kept in .loopline/test-artifacts/. No stack needed."""

from __future__ import annotations

import ast
import html
import os
import re
import shutil
import subprocess
import sys
import typing
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import typer
import yaml
from pydantic import BaseModel

from loopline.cli import app
from loopline.settings import Settings
from tests.support.paths import REPO

ARTIFACTS = REPO / ".loopline" / "test-artifacts"
#: The packages whose processes export Prometheus metrics (benchmarks' and tests' own registries are not Loopline's).
METRIC_PACKAGES = ("schemas", "feature_store", "streams", "online", "feedback_loop", "offline_training", "infra", "loopline")
METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


class _Page(HTMLParser):
    """A built page's links (``href`` and ``src``), its element ids, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.links.append(value)
            elif name in ("id", "name") and value:
                self.ids.add(value)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    return page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as `make docs` builds it, into a temporary folder."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def _page_text(site: Path, page: str) -> str:
    return " ".join(html.unescape(" ".join(_parse(site / page / "index.html").text)).split())


def _target(site: Path, page: Path, link: str) -> tuple[Path, str] | None:
    """The built file a local link points at and its fragment; None for a link off the site."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
        return None
    # A root-relative link (the 404 page's, which is served from any depth) is relative to the site's root.
    base = site.resolve() if parts.path.startswith("/") else page.parent
    path = page if not parts.path else (base / unquote(parts.path).lstrip("/")).resolve()
    if path.is_dir() or parts.path.endswith("/"):
        path = path / "index.html"
    return path, unquote(parts.fragment)


def test_every_local_link_and_anchor_in_the_built_site_resolves(site: Path) -> None:
    pages = {path.resolve(): _parse(path) for path in site.rglob("*.html")}
    broken = []
    for path, page in pages.items():
        for link in page.links:
            target = _target(site, path, link)
            if target is None:
                continue
            file, fragment = target
            if not file.exists():
                broken.append(f"{path.relative_to(site.resolve())}: {link} (no {file})")
            elif fragment and file.suffix == ".html" and fragment not in pages[file].ids:
                broken.append(f"{path.relative_to(site.resolve())}: {link} (no anchor #{fragment})")
    assert len(pages) > 20
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_the_readmes_relative_links_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", (REPO / "README.md").read_text())
    local = [link for link in links if not urlsplit(link).scheme and not link.startswith("#")]
    missing = [link for link in local if not (REPO / urlsplit(link).path).exists()]
    assert len(local) > 10
    assert not missing, f"README.md links to files that do not exist: {missing}"


def _commands(command, path: str = "loopline"):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, f"{path} {name}")


def test_the_cli_page_names_every_command(site: Path) -> None:
    commands = list(_commands(typer.main.get_command(app)))
    text = _page_text(site, "reference/cli")
    assert len(commands) > 30
    assert [command for command in commands if command not in text] == []


def _setting_keys(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        yield prefix + name
        pending = [field.annotation]
        while pending:
            annotation = pending.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                held_in_dict = typing.get_origin(field.annotation) is dict or any(
                    typing.get_origin(arg) is dict for arg in typing.get_args(field.annotation)
                )
                yield from _setting_keys(annotation, f"{prefix}{name}.<key>." if held_in_dict else f"{prefix}{name}.")
            else:
                pending += typing.get_args(annotation)


def test_the_settings_page_names_every_setting_with_its_variable(site: Path) -> None:
    keys = list(_setting_keys(Settings))
    text = _page_text(site, "reference/settings")
    assert len(keys) > 150
    missing = [key for key in keys if key not in text]
    unnamed = [key for key in keys if "LOOPLINE_" + key.upper().replace(".", "__") not in text]
    assert missing == [] and unnamed == []


def _metric_names() -> set[str]:
    """Every metric name a Loopline package defines: the first argument of a prometheus_client metric's constructor."""
    names = set()
    for package in METRIC_PACKAGES:
        for module in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(module.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) in METRIC_TYPES
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    names.add(node.args[0].value)
    return names


def test_the_metrics_page_names_every_metric_defined_in_the_code(site: Path) -> None:
    names = _metric_names()
    text = _page_text(site, "reference/metrics")
    assert len(names) > 30
    assert sorted(name for name in names if name not in text) == []


def test_the_alerts_page_names_every_alert_and_the_operate_guide_says_what_to_do(site: Path) -> None:
    alerts = [
        rule["alert"]
        for path in sorted((REPO / "infra" / "prometheus").glob("*.rules.yml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    reference = _parse(site / "reference" / "alerts" / "index.html")
    operate = _parse(site / "guides" / "operate" / "index.html")
    assert len(alerts) > 10
    assert [alert for alert in alerts if alert.lower() not in reference.ids] == []
    assert [alert for alert in alerts if f"../../guides/operate/#{alert.lower()}" not in reference.links] == []
    assert [alert for alert in alerts if alert.lower() not in operate.ids] == [], "alerts the operate guide has no section for"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (make setup installs it)")
def test_a_page_renders_in_headless_chromium(site: Path) -> None:
    page = (site / "guides" / "operate" / "index.html").as_uri()
    args = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000", "--virtual-time-budget=5000"]
    dom = subprocess.run([*args, "--dump-dom", page], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Operate: alerts and what to do" in dom.stdout and "LooplineFeatureSkew" in dom.stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "docs-operate.png"
    screenshot.unlink(missing_ok=True)
    shot = subprocess.run([*args, f"--screenshot={screenshot}", page], capture_output=True, text=True, timeout=120)
    assert shot.returncode == 0 and screenshot.stat().st_size > 20_000, shot.stderr[-2000:]
