"""The guide's examples are what Loopline takes: its contract is a contract, its project file a project file (over
the delivery template's contracts and Feast repo), its score request a score request the delivery model can be
served, and every command it runs exists."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from pathlib import Path

import click
import pytest
import typer
import yaml

from feature_store.model_inputs import typed_inputs
from loopline.cli import app
from loopline.project import template_path
from schemas.contracts import load_contract
from schemas.project import PROJECT_FILE, ProjectFile, load_project
from schemas.records import ScoreRequest

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_guides_contract_is_a_contract(tmp_path: Path) -> None:
    (contract,) = [b for b in _blocks("json") if '"type": "record"' in b]
    path = tmp_path / "click.avsc"
    path.write_text(contract)
    click = load_contract(path)
    event = click.decode(b'{"click_id": "c1", "clicked_at_ms": 1, "session_id": "s", "page": "cart"}')
    assert event.price is None and event.page == "cart"


def test_the_guides_project_file_loads_over_the_delivery_template(tmp_path: Path) -> None:
    (text,) = [b for b in _blocks("yaml") if b.startswith("name: delivery")]
    spec = ProjectFile.model_validate(yaml.safe_load(text))
    project_dir = tmp_path / "delivery"
    shutil.copytree(template_path("delivery"), project_dir)
    (project_dir / PROJECT_FILE).write_text(text)
    project = load_project(project_dir)
    assert project.spec == spec and project.labels.kind == "numeric"
    kinds = {i.name: i.kind for i in typed_inputs(project.feature_repo, spec.model.inputs)}
    assert kinds["courier_features:last_zone"] == kinds["request:cuisine"] == "text"


def test_the_guides_score_request_names_the_delivery_models_entities_and_fields() -> None:
    (curl,) = [line for b in _blocks("bash") for line in [b] if "curl" in b]
    body = json.loads(re.search(r"-d '(.*?)'", curl, flags=re.S).group(1))
    request = ScoreRequest.model_validate(body)
    project = load_project(template_path("delivery"))
    inputs = project.spec.model.inputs
    assert {f"request:{name}" for name in request.request_fields} == {i for i in inputs if i.startswith("request:")}
    assert set(request.entity_keys) == {"restaurant_id", "zone", "courier_id"}


def _command_lines() -> list[str]:
    """Each `loopline ...` command the guide gives: its shell blocks' lines (without their comments), and the commands
    written inline in its text."""
    in_blocks = {
        line.split("  #")[0].strip() for block in _blocks("bash") for line in block.splitlines() if line.startswith("loopline ")
    }
    inline = set(re.findall(r"`(loopline [^`<]+)`", GUIDE.read_text()))
    return sorted(in_blocks | {command.strip() for command in inline})


@pytest.mark.parametrize("module", sorted(set(re.findall(r"python -m ([\w.]+)", GUIDE.read_text()))))
def test_every_module_the_guide_runs_exists(module: str) -> None:
    assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("line", _command_lines())
def test_every_command_the_guide_runs_exists_with_its_options(line: str) -> None:
    command = typer.main.get_command(app)
    words = shlex.split(line)[1:]
    with click.Context(command) as context:
        while hasattr(command, "get_command") and words and not words[0].startswith("-"):  # a group: its subcommand
            command = command.get_command(context, words.pop(0))
            assert command is not None, f"`{line}`: no such command"
    options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    used = {word.split("=")[0] for word in words if word.startswith("--")}
    assert used <= options, f"`{line}`: {command.name} has no {sorted(used - options)}"
