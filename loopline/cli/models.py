"""``loopline models``, ``release`` and ``rollback``: model versions in the registry and their aliases."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from loopline.cli import context
from loopline.cli.context import actor
from loopline.components import project
from loopline.tables import alias_history_table, release_step_line
from offline_training.release import ModelRelease
from schemas.model_registry import PROD_ALIAS

app = typer.Typer(help="Model versions in the MLflow registry: register, canary, promote.")


ModelNameOption = Annotated[str | None, typer.Option(help="Registered model name (default: serving.model_name).")]


def _release(name: str | None) -> tuple[ModelRelease, str]:
    """The settings' model registry, and the model name to act on."""
    from loopline.components import model_release

    config = context.settings()
    return model_release(config), name or config.serving.model_name


@app.command("register")
def models_register(
    path: Annotated[Path, typer.Argument(help="The ONNX file (schemas/model_contract.py).", exists=True, dir_okay=False)],
    alias: Annotated[str | None, typer.Option(help="Point this alias (prod, canary) at the new version.")] = None,
    name: ModelNameOption = None,
) -> None:
    """Register a model file as a new version, its SHA-256 recorded for serving to verify. A model trained elsewhere is
    checked first as the project would serve it (online/model_admission.py): in the model contract, its inputs the
    project's features and request fields with their kinds, finite scores (probabilities for a binary label)."""
    from online.model_admission import ModelRejected, admit_model

    declared = project(context.settings())
    try:
        inputs = admit_model(path, declared.feature_repo, declared.labels.kind)
    except ModelRejected as err:
        raise typer.BadParameter(str(err), param_hint="PATH") from None
    release, name = _release(name)
    version = release.register(name, path)
    context.console.print(
        f"{len(inputs)} inputs, as the {declared.name} project declares them: "
        + ", ".join(f"{i.name} ({i.kind})" for i in inputs),
        highlight=False,
    )
    if alias:
        release.set_alias(name, alias, version, actor(), "registered with --alias")
    context.console.print(f"registered {name} v{version}" + (f" as {alias}" if alias else ""))


@app.command("first")
def models_first(
    alias: Annotated[str | None, typer.Option(help="Point this alias at it.")] = PROD_ALIAS,
    name: ModelNameOption = None,
) -> None:
    """Register the project's hand-set first model (model.first_model in loopline_project.yaml: a weight per input and
    a bias) as a new version, prod by default: something to serve, and to log features with, before any training."""
    from loopline.project import write_first_model

    config = context.settings()
    declared = project(config)
    path = write_first_model(declared, config.home.absolute() / "models" / f"{declared.name}-first.onnx")
    models_register(path, alias, name)


@app.command("promote")
def models_promote(
    version: Annotated[str, typer.Argument(help="The version to serve as prod.")],
    reason: Annotated[str, typer.Option(help="Why, for the alias history.")] = "promoted by hand",
    name: ModelNameOption = None,
) -> None:
    """Point prod at VERSION (scorers hot-swap at their next poll) and end any canary."""
    release, name = _release(name)
    release.promote(name, version, actor(), reason)
    context.console.print(f"{name} prod → v{version}")


@app.command("canary")
def models_canary(
    version: Annotated[str, typer.Argument(help="The version to try on part of the traffic.")],
    share: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of requests (by request-id hash).")] = 0.1,
    name: ModelNameOption = None,
) -> None:
    """Send SHARE of the traffic to VERSION (alias canary)."""
    release, name = _release(name)
    release.start_canary(name, version, share, actor())
    context.console.print(f"{name} canary → v{version} on {share:.0%} of requests")


@app.command("history")
def models_history(name: ModelNameOption = None) -> None:
    """Every alias change: when, who or what, which alias, from which version to which, and why."""
    release, name = _release(name)
    context.console.print(alias_history_table(release.history(name), title=f"{name}: alias history"))


def release(
    target: Annotated[str, typer.Argument(help="A VERSION to release as a canary, or `watch`.")],
    canary: Annotated[float, typer.Option(min=0.0, max=100.0, help="Percent of requests the canary takes.")] = 5.0,
    once: Annotated[bool, typer.Option(help="watch: look once and apply the verdict, then stop.")] = False,
    name: ModelNameOption = None,
) -> None:
    """`loopline release VERSION --canary 5` sends 5 % of requests to VERSION; `loopline release watch` watches the
    canary against prod (the scorers' metrics, labeled feedback) until the policy promotes or rolls it back."""
    if target != "watch":
        model_release, name = _release(name)
        model_release.start_canary(name, target, canary / 100, actor(), f"released as a canary on {canary:g} % of requests")
        context.console.print(f"{name} v{target} is the canary on {canary:g} % of requests; `loopline release watch` decides")
        return
    from loopline.components import release_controller

    config = context.settings()
    controller = release_controller(config)
    while True:
        outcome = controller.step()
        if outcome is None:
            context.console.print("no canary is out")
            return
        decision, canary_stats, prod_stats = outcome
        context.console.print(release_step_line(decision, canary_stats, prod_stats, controller.policy.quality), highlight=False)
        if once or decision.action != "wait":
            return
        time.sleep(config.release.poll_s)


def rollback(
    reason: Annotated[str, typer.Option(help="Why, for the alias history.")] = "rolled back by hand",
    name: ModelNameOption = None,
) -> None:
    """Point prod back at the version it replaced (and end any canary), in one command."""
    release, name = _release(name)
    version = release.rollback(name, actor(), reason)
    context.console.print(f"{name} prod → v{version} (rolled back)")
