"""What every command shares: the console it prints on, the settings in force, who acts, and times as given.

Commands reach ``console`` and ``settings`` as attributes of this module (``context.console``), never by importing the
names, so that a test swaps either for every command in one place."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from rich.console import Console

from loopline.settings import Settings

console = Console()


def settings(**overrides: Any) -> Settings:
    """The settings in force for this command (``overrides``: its options that set settings, by section)."""
    return Settings(**overrides)


def actor() -> str:
    """Who makes a release step from the CLI, for the alias history."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container's user without a passwd entry or $USER
        user = "unknown user"
    return f"{user} (loopline CLI)"


def epoch_ms(text: str | None) -> int | None:
    """An ISO-8601 time (UTC unless it says otherwise) as epoch milliseconds."""
    if text is None:
        return None
    from datetime import datetime

    moment = datetime.fromisoformat(text)
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)
