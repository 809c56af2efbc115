"""A project's Feast repository and its configuration, with the stack's addresses applied."""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path


def declared_feast_registry(repo_path: Path) -> Path:
    """The registry file the repo's ``feature_store.yaml`` names, resolved as Feast resolves it (against the repo)."""
    import yaml

    declared = yaml.safe_load((repo_path / "feature_store.yaml").read_text())["registry"]
    path = Path(declared if isinstance(declared, str) else declared["path"])
    return path if path.is_absolute() else repo_path / path


def feast_config(
    feast_registry_path: Path | None,
    redis_connection: str | None,
    repo_path: Path,
    *,
    redis_cluster: bool = False,
):
    """The repo's ``feature_store.yaml`` with the registry file and Redis address overridden when given (then also
    Feast's ``redis_type``: ``redis_cluster`` with ``redis_cluster``, else ``redis``), and Feast's Redis store read in
    each view's serving generation (``feature_store/feast_online_store.py``)."""
    import yaml
    from feast.repo_config import RepoConfig

    raw = yaml.safe_load((repo_path / "feature_store.yaml").read_text())
    store = raw.get("online_store") or {}  # absent or null: Loopline's Redis
    store = {"type": store} if isinstance(store, str) else dict(store)  # Feast's shorthand, ``online_store: redis``
    if store.get("type", "redis") == "redis":  # Feast's, reading the views' serving generations
        from feature_store.feast_online_store import STORE_TYPE

        store["type"] = STORE_TYPE
    raw["online_store"] = store
    if feast_registry_path is not None:
        feast_registry_path.parent.mkdir(parents=True, exist_ok=True)
        raw["registry"] = str(feast_registry_path)
    if redis_connection is not None:
        redis_type = "redis_cluster" if redis_cluster else "redis"
        raw["online_store"] = {**raw["online_store"], "connection_string": redis_connection, "redis_type": redis_type}
    config = RepoConfig(**raw)
    config.repo_path = repo_path
    return config


def feature_store(
    feast_registry_path: Path | None,
    redis_connection: str | None,
    repo_path: Path,
    *,
    redis_cluster: bool = False,
):
    """A Feast FeatureStore on this repo (``feast_config``; importing Feast takes seconds: keep it off hot paths)."""
    from feast import FeatureStore

    # Feast warns that stream feature views are alpha on every load; Loopline depends on them knowingly.
    warnings.filterwarnings("ignore", message="Stream feature views are experimental", category=RuntimeWarning)
    config = feast_config(feast_registry_path, redis_connection, repo_path, redis_cluster=redis_cluster)
    return FeatureStore(repo_path=str(repo_path), config=config)


def apply_definitions(
    feast_registry_path: Path | None,
    redis_connection: str | None,
    repo_path: Path,
    *,
    redis_cluster: bool = False,
) -> list[str]:
    """What ``feast apply`` does: register the repo's definitions and prepare the online store.

    Returns the names of the feature views applied.
    """
    store = feature_store(feast_registry_path, redis_connection, repo_path, redis_cluster=redis_cluster)
    contents = parse_repo(repo_path)
    views = [*contents.feature_views, *contents.stream_feature_views]
    store.apply([*contents.entities, *contents.data_sources, *views])
    return sorted(view.name for view in views)


def parse_repo(repo_path: Path):
    """Feast's parse of the repo's definition files (``feast.repo_operations.parse_repo``) as ``feast apply`` runs it:
    from the repo's folder, which is on the import path, each file imported afresh (two projects' repos may both have
    a ``features.py``; each parse reads its own)."""
    from feast.repo_operations import get_repo_files
    from feast.repo_operations import parse_repo as feast_parse_repo

    repo_path = repo_path.resolve()
    with contextlib.chdir(repo_path):
        for file in get_repo_files(repo_path):
            sys.modules.pop(".".join(file.relative_to(repo_path).with_suffix("").parts), None)
        sys.path.insert(0, str(repo_path))
        try:
            return feast_parse_repo(repo_path)
        finally:
            sys.path.remove(str(repo_path))


def repo_stream_views(repo_path: Path) -> list:
    """The repo's stream feature views as `feast apply` registers them (join keys inferred from their entities),
    without a registry or an online store: for compiling the streaming plan offline (benchmarks)."""
    from feast.field import Field
    from feast.types import String

    contents = parse_repo(repo_path)
    join_keys = {entity.name: entity.join_key for entity in contents.entities}
    views = list(contents.stream_feature_views)
    for view in views:
        view.entity_columns = [Field(name=join_keys[name], dtype=String) for name in view.entities]
    return views


def feature_fields(view) -> list:
    """A feature view's features without its entity columns (which Feast's inference adds to the schema)."""
    join_keys = {column.name for column in view.entity_columns}
    return [field for field in view.features if field.name not in join_keys]
