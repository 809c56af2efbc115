"""Feature defaults, declared with the features: a Feast field tag the scorer falls back to on a miss.

    Field(name="clicks_1h", dtype=Int64, tags={DEFAULT_TAG: "0"})

A feature without the tag has no default: a miss leaves it None (and flagged).
"""

from __future__ import annotations

#: The Feast field tag holding a feature's default, as text.
DEFAULT_TAG = "default"

_PARSERS = {"INT64": int, "INT32": int, "DOUBLE": float, "FLOAT": float, "STRING": str, "BOOL": lambda t: t == "true"}


def declared_default(field) -> float | int | str | bool | None:
    """The default a Feast field declares in its tags, typed as the field, or None."""
    text = field.tags.get(DEFAULT_TAG)
    if text is None:
        return None
    return _PARSERS[field.dtype.to_value_type().name](text)


def declared_defaults(views) -> dict[str, float | int | str | bool | None]:
    """The default each feature of Feast feature ``views`` declares, by ``view:feature`` (None where none)."""
    from feature_store.config import feature_fields

    return {f"{view.name}:{f.name}": declared_default(f) for view in views for f in feature_fields(view)}
