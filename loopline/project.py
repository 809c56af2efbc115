"""The project a command acts on: found as git finds its repository (or named), made from a template.

Loopline ships its templates as complete projects (``loopline/templates/<name>``), as ``feast init`` ships its own:
``loopline init DIR --template NAME`` copies one into a folder the user then owns. A command acts on
``--project DIR`` (the ``project`` setting, ``LOOPLINE_PROJECT``), else on the project holding the working
directory: the nearest folder at or above it with a ``loopline_project.yaml``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import shutil
import sys
from functools import lru_cache
from pathlib import Path

from schemas.project import PROJECT_FILE, Project, ProjectError, find_project, load_project

#: The templates Loopline ships, one folder each.
TEMPLATES = Path(__file__).with_name("templates")
#: What a copied template leaves behind: caches, and the data its Feast repo made where it was used in place.
_NOT_COPIED = ("__pycache__", "*.pyc", "data")


def template_names() -> list[str]:
    """The names of the templates Loopline ships."""
    return sorted(p.name for p in TEMPLATES.iterdir() if (p / PROJECT_FILE).is_file())


def template_path(name: str) -> Path:
    """The folder of the template ``name``; ProjectError naming the templates when there is none."""
    path = TEMPLATES / name
    if not (path / PROJECT_FILE).is_file():
        raise ProjectError(f"no template {name!r}; the templates are: {', '.join(template_names())}")
    return path


def init_project(directory: Path, template: str) -> Path:
    """Make a project in ``directory`` (new, or empty) from the template ``template``; its path. ProjectError when the
    folder already holds files (nothing of the user's is overwritten)."""
    source = template_path(template)
    directory = Path(directory).absolute()
    if directory.exists() and any(directory.iterdir()):
        raise ProjectError(f"{directory} is not empty; give a new folder (nothing there is overwritten)")
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns(*_NOT_COPIED), dirs_exist_ok=True)
    return directory


def project_path(named: Path | None, start: Path | None = None) -> Path:
    """The project a command acts on: ``named`` (the setting), else the one holding ``start`` (the working directory);
    ProjectError saying how to make or name one when there is none."""
    if named is not None:
        if not (Path(named) / PROJECT_FILE).is_file():
            raise ProjectError(
                f"{named} is not a Loopline project (no {PROJECT_FILE}); make one with `loopline init {named} --template fraud`"
            )
        return Path(named).absolute()
    found = find_project(start or Path.cwd())
    if found is None:
        raise ProjectError(
            f"no Loopline project here ({PROJECT_FILE} in {start or Path.cwd()} or above): make one with "
            "`loopline init DIR --template fraud` and run from it, or pass `loopline --project DIR ...`"
        )
    return found


def project_or_template(named: Path | None, template: str = "fraud") -> Path:
    """The project in force (``named``, else the one holding the working directory); else the template's folder: what
    the images and the chart carry when no project is at hand (the demo's)."""
    try:
        return project_path(named)
    except ProjectError:
        if named is not None:
            raise
        return template_path(template)


@lru_cache(maxsize=16)
def loaded_project(path: Path) -> Project:
    """The project at ``path``, read once per process."""
    return load_project(path)


def instance_of_template(home: Path, template: str) -> Path:
    """The project the demo of ``template`` runs: ``<home>/projects/<template>``, the template's files as this Loopline
    ships them (copied again each time, over an earlier version's), beside the data its Feast repo made there."""
    path = (home / "projects" / template).absolute()
    shutil.copytree(template_path(template), path, ignore=shutil.ignore_patterns(*_NOT_COPIED), dirs_exist_ok=True)
    return path


def world_class(project: Project) -> type:
    """The project's synthetic world (``world: file.py:ClassName`` in its project file), loaded from its folder once
    per process; ProjectError when it declares none."""
    declared = project.spec.world
    if declared is None:
        raise ProjectError(f"{project.path / PROJECT_FILE} declares no world (world: file.py:ClassName) to publish events from")
    file, _, name = declared.partition(":")
    return _world_class(project.resolve(file), name, project.path / PROJECT_FILE)


@lru_cache(maxsize=16)
def _world_class(file: Path, name: str, declared_in: Path) -> type:
    # A module of its own per file: two projects (a template and its copy) may both have a world.py.
    module_name = f"loopline_world_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ProjectError(f"{declared_in}: cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look a class's module up there
    spec.loader.exec_module(module)
    try:
        return getattr(module, name)
    except AttributeError:
        raise ProjectError(f"{file} has no {name}") from None


def world_of(project: Project, seed: int, start_ms: int, **options):
    """The project's synthetic world from ``start_ms``: ``options`` are ``WorldConfig``'s fields (``rate_per_s``,
    ``late_rate``, ...) and the world's own knobs (the fraud world's ``users``, ...), by name."""
    from streams.world import WorldConfig

    common = {field.name for field in dataclasses.fields(WorldConfig)}
    config = WorldConfig(
        **{k: v for k, v in options.items() if k in common}, knobs={k: v for k, v in options.items() if k not in common}
    )
    return world_class(project)(project, config, seed, start_ms)


def write_first_model(project: Project, path: Path) -> Path:
    """The project's hand-set first model (``model.first_model``: a weight per input, and a bias) as an ONNX file at
    ``path`` in the model contract: a logistic regression for a binary label, a linear one for a numeric label; inputs
    it gives no weight (a text among them) weigh nothing. ProjectError when the project declares none."""
    from feature_store.model_inputs import typed_inputs
    from offline_training.onnx_models import write_linear_model

    declared = project.spec.model.first_model
    if declared is None:
        raise ProjectError(f"{project.path / PROJECT_FILE} declares no model.first_model (weights by input, and a bias)")
    weights = dict(declared.get("weights", {}))
    unknown = sorted(set(weights) - set(project.spec.model.inputs))
    if unknown:
        raise ProjectError(f"{project.path / PROJECT_FILE}: model.first_model weighs {unknown}, which are not model.inputs")
    inputs = typed_inputs(project.feature_repo, project.spec.model.inputs)
    return write_linear_model(
        path,
        inputs,
        [float(weights.get(name, 0.0)) for name in project.spec.model.inputs],
        float(declared.get("bias", 0.0)),
        probability=project.labels.kind == "binary",
    )
