"""One Feast registry: `feast` in the repo folder and Loopline act on the same registry and Redis.

A copy of the feature repo, its feature_store.yaml pointing at this session's Redis: `loopline apply`
registers the views and the `feast` CLI in the folder lists them; a feature added with `feast apply`
there is computed by the next `loopline stream submit`. Real Feast CLI, Kafka, Redis and Flink.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from feature_store.online_read import OnlineReader
from feature_store.settings import FeatureStoreSettings
from infra.service import wait_until
from loopline.job_processes import start_feature_job, stop_process_group
from loopline.settings import Settings, settings_environment
from schemas.topics import DAY_MS, TopicSpec
from schemas.validation import encode
from streams.producer import EventProducer
from streams.topics import apply_topics
from streams.world import Emitted
from tests.support.templates import TRANSACTIONS, TransactionEvent

VIEW = "user_transaction_features"
NEW_FEATURE = "amount_min_1h"
SOURCE = TopicSpec("test.registry", TransactionEvent, key="user_id", partitions=1, retention_ms=DAY_MS)


def _project_copy(settings: Settings, folder: Path) -> Path:
    """The session's project copied to ``folder``, its feature_store.yaml naming a registry there and this stack's
    Redis, under a Feast project name of its own: its rows and its views' generations stay out of the session
    project's keys (its changed plan would otherwise rebuild the views the next tests read)."""
    project = folder / "project"
    shutil.copytree(settings.project_path, project, ignore=shutil.ignore_patterns("data", "__pycache__"))
    repo = project / "feature_repo"
    config = yaml.safe_load((repo / "feature_store.yaml").read_text())
    config["registry"] = str(folder / "registry.db")
    config["online_store"]["connection_string"] = settings.redis_connection
    config["project"] = f"{config['project']}_registry_{uuid.uuid4().hex[:6]}"
    (repo / "feature_store.yaml").write_text(yaml.safe_dump(config))
    return project


def _cli(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_feast_in_the_repo_and_loopline_share_one_registry(applied: Settings, tmp_path: Path) -> None:
    project = _project_copy(applied, tmp_path)
    repo = project / "feature_repo"
    # No registry path of Loopline's own: the repo's feature_store.yaml names it, as for `feast`.
    settings = applied.model_copy(update={"project": project, "feature_store": FeatureStoreSettings()})
    assert settings.feast_registry_path == tmp_path / "registry.db"
    env = settings_environment(settings)
    feast = str(Path(sys.executable).with_name("feast"))

    _cli([sys.executable, "-c", "from loopline.cli import main; main()", "apply"], tmp_path, env)
    listed = _cli([feast, "stream-feature-views", "list"], repo, env)
    assert VIEW in listed and "merchant_transaction_features" in listed, listed

    # A Feast user adds a feature the Feast way: edit the definitions, `feast apply` in the folder.
    definitions = repo / "features.py"
    text = definitions.read_text()
    text = text.replace(
        '        _agg("amount_max_24h", "max", "amount", DAY, QUARTER),\n',
        '        _agg("amount_max_24h", "max", "amount", DAY, QUARTER),\n'
        f'        _agg("{NEW_FEATURE}", "min", "amount", HOUR, MINUTE),\n',
    )
    text = text.replace(
        '        Field(name="amount_max_24h", dtype=Float64, tags={"default": "0.0"}),\n',
        f'        Field(name="amount_max_24h", dtype=Float64, tags={{"default": "0.0"}}),\n'
        f'        Field(name="{NEW_FEATURE}", dtype=Float64, tags={{"default": "0.0"}}),\n',
    )
    assert NEW_FEATURE in text
    definitions.write_text(text)
    _cli([feast, "apply"], repo, env)
    assert NEW_FEATURE in _cli([feast, "stream-feature-views", "describe", VIEW], repo, env)

    # The next `loopline stream submit` compiles the registry's views: the new feature is computed.
    apply_topics(settings.kafka.bootstrap, [SOURCE])
    user, now = f"registry-{uuid.uuid4().hex[:8]}", int(time.time() * 1000)
    events = [
        TransactionEvent(
            schema_version=1,
            event_id=str(uuid.uuid4()),
            event_time_ms=now + i,
            user_id=user,
            merchant_id="m1",
            amount=amount,
            currency="EUR",
            merchant_category="grocery",
            channel="pos",
            country="DE",
        )
        for i, amount in enumerate((30.0, 12.5, 99.0))
    ]
    EventProducer(settings.kafka.bootstrap).publish([Emitted(SOURCE.name, user, encode(e), now, e) for e in events])
    job = start_feature_job(
        settings,
        tmp_path / "job.log",
        LOOPLINE_STREAM__SOURCE_TOPICS=json.dumps({TRANSACTIONS.name: SOURCE.name}),
        LOOPLINE_STREAM__GROUP_ID=f"registry-{uuid.uuid4().hex[:8]}",
        LOOPLINE_STREAM__OFFLINE_DIR=str(tmp_path / "offline"),
    )
    try:
        reader = OnlineReader(settings.feast_registry_path, settings.redis_connection, repo)
        minimum = lambda: reader.get_online_features([f"{VIEW}:{NEW_FEATURE}"], [{"user_id": user}])[NEW_FEATURE][0]  # noqa: E731
        assert wait_until(lambda: minimum() == 12.5 or job.poll() is not None, 180, 0.5), f"see {tmp_path / 'job.log'}"
        assert minimum() == 12.5
    finally:
        stop_process_group(job)
