"""The site's reference pages, generated from the code at build time so that they cannot drift from it.

mkdocs-gen-files runs this file on every `mkdocs build` (``plugins: gen-files`` in mkdocs.yml). Each page under
``docs/reference/`` is a short hand-written introduction; the tables below it come from here: every CLI command from
the Typer app, every setting from the composed ``Settings`` model, every Prometheus metric from the classes that define
them (instantiated on a fresh registry), every alert rule from ``infra/prometheus/*.rules.yml``, and the recorded
benchmark runs from ``benchmarks/RESULTS.md``; and the contributing page's import table from
``tests/test_import_table.py``.
"""

from __future__ import annotations

import enum
import importlib.util
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mkdocs_gen_files
import typer
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from feedback_loop.monitor_metrics import MonitorMetrics
from loopline.cli import app
from loopline.settings import Settings
from online.metrics import ScorerMetrics

REPO = Path(__file__).resolve().parents[1]
RULES = sorted((REPO / "infra" / "prometheus").glob("*.rules.yml"))
#: Every class that defines Prometheus metrics, each taking the collector registry to define them on.
METRIC_CLASSES = (ScorerMetrics, MonitorMetrics)
#: The operate guide, from the reference pages: each alert links to its section there.
OPERATE_GUIDE = "../guides/operate.md"


def cell(text: object) -> str:
    """``text`` as one Markdown table cell: on one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def code(text: object) -> str:
    """``text`` as inline code inside a table cell (a backtick inside it widens the fence)."""
    text = cell(text)
    fence = "``" if "`" in text else "`"
    return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"


# -- the CLI ---------------------------------------------------------------------------------------------------------


def cli_commands() -> Iterator[tuple[str, Any]]:
    """(``loopline stack up``, its Click command) for the app and every command and group under it, depth first."""
    pending = [("loopline", typer.main.get_command(app))]
    while pending:
        path, command = pending.pop(0)
        yield path, command
        subcommands = getattr(command, "commands", {})
        pending[0:0] = [(f"{path} {name}", subcommands[name]) for name in sorted(subcommands)]


def param_type(param: Any) -> str:
    """The type a command's parameter takes, from its annotation (Typer's own Click keeps it there) or Click's name."""
    descriptor = getattr(param, "type_descriptor", None)
    return type_name(descriptor.annotation) if descriptor else param.type.name


def cli_page() -> str:
    """Every command: its help, its arguments and options (names, type, default, help)."""
    lines = []
    for path, command in cli_commands():
        level = "#" * min(2 + path.count(" "), 4)
        lines += [f"{level} `{path}`", "", (command.help or "").strip(), ""]
        params = [p for p in command.params if p.name != "help"]
        if params:
            lines += ["| argument or option | type | default | help |", "| --- | --- | --- | --- |"]
            for param in params:
                names = ", ".join(param.opts + param.secondary_opts) if param.param_type_name == "option" else param.name
                default = "" if param.default in (None, PydanticUndefined) or callable(param.default) else param.default
                help_text = getattr(param, "help", None) or ""
                lines.append(f"| {code(names)} | {cell(param_type(param))} | {cell(default)} | {cell(help_text)} |")
            lines.append("")
    return "\n".join(lines)


# -- settings --------------------------------------------------------------------------------------------------------


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The settings models an annotation holds: itself, or inside ``X | None``, ``dict[str, X]``, ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def type_name(annotation: Any) -> str:
    """An annotation as a reader writes it: ``int``, ``Path | None``, ``Literal['ack', 'async', 'off']``."""
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return " | ".join(type_name(arg) for arg in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    return str(annotation).replace("typing.", "").replace("pathlib.", "")


def default_text(field: FieldInfo) -> str:
    """The field's default as a user would write it, secrets masked, whole sections left to their own rows."""
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, SecretStr):
        return "****"
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, Path):
        value = str(value)
    return (
        "null"
        if value is None
        else yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
    )


def settings_fields(
    model: type[BaseModel] = Settings, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], FieldInfo]]:
    """(the key path, the field) of every setting, walking the composed model's sections recursively, in order.

    A section held in a dict (``monitor.feature_thresholds``) is named with ``<key>`` for the dict's key."""
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        yield path, field
        for inner in _models_in(field.annotation):
            is_mapping = typing.get_origin(field.annotation) is dict or any(
                typing.get_origin(arg) is dict for arg in typing.get_args(field.annotation)
            )
            yield from settings_fields(inner, (*path, "<key>") if is_mapping else path)


def settings_page() -> str:
    """One table per top-level section: each setting's key, environment variable, type, default and description."""
    header = [
        "| setting (settings file key) | environment variable | type | default | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    lines = ["## General", "", *header]
    for path, field in settings_fields():
        sections = _models_in(field.annotation)
        if len(path) == 1 and sections:
            lines += ["", f"## {path[0]}", "", " ".join((sections[0].__doc__ or "").split()), "", *header]
            continue
        key = ".".join(path)
        env = "LOOPLINE_" + "__".join(part.upper() for part in path)
        description = field.description or (f"Section: {' '.join((sections[0].__doc__ or '').split())}" if sections else "—")
        lines.append(
            f"| {code(key)} | {code(env)} | {code(type_name(field.annotation))} | {code(default_text(field))} |"
            f" {cell(description)} |"
        )
    return "\n".join(lines) + "\n"


# -- metrics and alerts ----------------------------------------------------------------------------------------------


def metric_families() -> Iterator[tuple[str, Any, tuple[str, ...]]]:
    """(the defining class, the metric family, its label names) of every metric the metric classes define, each class
    instantiated on a fresh registry. A labelled metric has no samples until used, so its label names are read from
    the metric object itself (prometheus_client keeps them in ``_labelnames``)."""
    for cls in METRIC_CLASSES:
        registry = CollectorRegistry()
        holder = cls(registry)
        labels = {
            metric.describe()[0].name: metric._labelnames
            for metric in vars(holder).values()
            if isinstance(metric, MetricWrapperBase)
        }
        for family in registry.collect():
            yield f"{cls.__module__}.{cls.__name__}", family, labels.get(family.name, ())


def exported_name(family: Any) -> str:
    """The name Prometheus stores: a counter's family is named without the ``_total`` its samples carry, an info's
    without its ``_info``."""
    return family.name + {"counter": "_total", "info": "_info"}.get(family.type, "")


def metrics_page() -> str:
    """Every metric: exported name, type, labels, help and where it is defined."""
    lines = ["| metric | type | labels | help | defined in |", "| --- | --- | --- | --- | --- |"]
    for owner, family, label_names in metric_families():
        labels = ", ".join(label_names) or "—"
        lines.append(
            f"| {code(exported_name(family))} | {family.type} | {cell(labels)} | {cell(family.documentation)} | {code(owner)} |"
        )
    return "\n".join(lines) + "\n"


def alert_rules() -> Iterator[tuple[str, dict]]:
    """(the rules file's name, the rule) of every alerting rule."""
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    yield path.name, rule


def alerts_page() -> str:
    """Every alert: expression, hold time, severity, summary and description, a link to what to do when it fires."""
    lines = []
    for file_name, rule in alert_rules():
        annotations = rule.get("annotations", {})
        lines += [
            f"## {rule['alert']}",
            "",
            f"| | |\n| --- | --- |\n| file | `infra/prometheus/{file_name}` |",
            f"| for | {cell(rule.get('for', 'fires at once'))} |",
            f"| severity | {cell(rule.get('labels', {}).get('severity', '—'))} |",
            f"| summary | {cell(annotations.get('summary', ''))} |",
        ]
        for key in ("description", "runbook"):
            if key in annotations:
                lines.append(f"| {key} | {cell(annotations[key])} |")
        lines += [
            "",
            "```promql",
            rule["expr"].strip(),
            "```",
            "",
            f"When it fires: [operate]({OPERATE_GUIDE}#{rule['alert'].lower()}).",
            "",
        ]
    return "\n".join(lines)


# -- benchmark results -----------------------------------------------------------------------------------------------


def benchmark_results_page() -> str:
    """``benchmarks/RESULTS.md`` as it is, its links to the site made relative to the page's place in it."""
    return (REPO / "benchmarks" / "RESULTS.md").read_text().replace("](../docs/reference/", "](")


def import_table_page() -> str:
    """The design's folder table as ``tests/test_import_table.py`` holds it (read from there, so the page is what the
    test enforces): each package and the packages it may import."""
    spec = importlib.util.spec_from_file_location("import_table", REPO / "tests" / "test_import_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = [
        f"| `{package}/` | {', '.join(f'`{name}`' for name in sorted(allowed)) or 'nothing of ours'} |"
        for package, allowed in module.TALKS_TO.items()
    ]
    return "\n".join(["| package | may import |", "| --- | --- |", *rows]) + "\n"


def write_pages() -> None:
    """Each page's generated part, after the hand-written introduction of the same file."""
    for name, page in (
        ("reference/cli.md", cli_page),
        ("reference/settings.md", settings_page),
        ("reference/metrics.md", metrics_page),
        ("reference/alerts.md", alerts_page),
        ("contributing.md", import_table_page),
    ):
        with mkdocs_gen_files.open(name, "a") as out:
            out.write("\n" + page())
    with mkdocs_gen_files.open("reference/benchmark-results.md", "w") as out:
        out.write(benchmark_results_page())
    mkdocs_gen_files.set_edit_path("reference/benchmark-results.md", "../benchmarks/RESULTS.md")


write_pages()
