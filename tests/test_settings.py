"""Settings: defaults, LOOPLINE_* environment variables and the YAML file."""

from __future__ import annotations

import pytest

from loopline.settings import Settings


def test_environment_overrides_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPLINE_KAFKA__PORT", "19999")
    monkeypatch.setenv("LOOPLINE_HOME", "/tmp/elsewhere")
    settings = Settings()
    assert settings.kafka.bootstrap_servers == "127.0.0.1:19999"
    assert str(settings.resolved_data_dir) == "/tmp/elsewhere/data"


def test_yaml_file_is_read_and_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    config = tmp_path / "loopline.yaml"
    config.write_text("redis:\n  port: 16400\nkafka:\n  port: 19100\n")
    monkeypatch.setenv("LOOPLINE_CONFIG", str(config))
    monkeypatch.setenv("LOOPLINE_KAFKA__PORT", "19200")
    settings = Settings()
    assert settings.redis.port == 16400
    assert settings.kafka.port == 19200


def test_missing_config_file_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("LOOPLINE_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(FileNotFoundError, match="absent.yaml"):
        Settings()


def test_invalid_value_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPLINE_REDIS__PORT", "70000")
    with pytest.raises(ValueError, match="redis.port"):
        Settings()
