"""``loopline schemas``: record contracts and their compatibility."""

from __future__ import annotations

import typer

from loopline.cli import context
from loopline.components import project
from schemas.compatibility import check_registered_schemas

app = typer.Typer(help="Record contracts and their compatibility.")


@app.command("check")
def schemas_check() -> None:
    """Fail if an event contract of the project, or a record of Loopline's own, changed in a way that breaks existing
    readers or events already written."""
    from schemas.compatibility import check_project_contracts

    for name, outcome in {**check_project_contracts(project(context.settings())), **check_registered_schemas()}.items():
        context.console.print(f"{name}: {outcome}")


@app.command("register")
def schemas_register() -> None:
    """Record the project's current contracts as registered (under contracts/registered/), refused if a change is
    breaking."""
    from schemas.compatibility import register_project_contracts

    for path in register_project_contracts(project(context.settings())):
        context.console.print(f"registered {path}")
