"""A model's inputs with their kinds, as a project's Feast repo declares them: what a model contract is built from."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from feature_store.config import feature_fields, parse_repo
from schemas.model_contract import REQUEST_PREFIX, ModelInput


def typed_inputs(repo_path: Path, names: Sequence[str]) -> list[ModelInput]:
    """``names`` (``view:feature``, ``request:<field>``) with their kinds: a feature by its dtype in its view, a request
    field by its type in a ``RequestSource`` of the repo; a String is a text, anything else a number (a boolean as 0
    or 1). ValueError naming every name the repo does not declare."""
    from feast import RequestSource

    contents = parse_repo(repo_path)
    declared = {
        f"{view.name}:{f.name}": f.dtype
        for view in [*contents.feature_views, *contents.stream_feature_views]
        for f in feature_fields(view)
    }
    for source in contents.data_sources:
        if isinstance(source, RequestSource):
            declared |= {f"{REQUEST_PREFIX}{f.name}": f.dtype for f in source.schema}
    unknown = [name for name in names if name not in declared]
    if unknown:
        raise ValueError(
            f"the Feast repo {repo_path} declares no {', '.join(unknown)}: a model input is a view's feature or a "
            "field of a RequestSource"
        )
    return [ModelInput(name, "text" if declared[name].to_value_type().name == "STRING" else "number") for name in names]
