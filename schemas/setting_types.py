"""Types the components' settings models share (``loopline/settings.py`` composes the models and reads them)."""

from __future__ import annotations

import json
from typing import Any


def comma_separated(value: Any) -> Any:
    """``"a:9092,b:9092"`` or ``'["a:9092", "b:9092"]'`` (an environment variable's forms) as a list; a list as it is."""
    if isinstance(value, str):
        if value.lstrip().startswith("["):
            return json.loads(value)
        addresses = [part.strip() for part in value.split(",") if part.strip()]
        if value.strip() and not addresses:
            raise ValueError(f"{value!r} names no node: give host:port[,host:port...], or leave it unset for the stack's own")
        return addresses
    return value
