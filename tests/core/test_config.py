"""accy.config: typed settings read once from their ACCY_* variables."""

import pytest

import accy
from accy.config import Config, ConfigError, Setting, _boolean


def fresh():
    return Config((Setting("flag", "ACCY_TEST_FLAG", _boolean, False, "a test flag", True),))


def test_a_setting_is_read_from_its_variable_once(monkeypatch):
    monkeypatch.setenv("ACCY_TEST_FLAG", "1")
    config = fresh()
    assert config.flag is True
    monkeypatch.setenv("ACCY_TEST_FLAG", "0")
    assert config.flag is True  # read once


def test_update_and_override_change_a_setting_and_override_restores_it():
    config = fresh()
    with config.override(flag=True):
        assert config.flag is True
        assert config.code_key() == (("flag", True),)
    assert config.flag is False
    config.update("flag", True)
    assert config.flag is True


def test_bad_names_and_values_are_config_errors(monkeypatch):
    config = fresh()
    with pytest.raises(ConfigError, match="no setting 'flg'.*flag"):
        config.update("flg", True)
    with pytest.raises(ConfigError, match="takes a bool"):
        config.update("flag", "yes")
    monkeypatch.setenv("ACCY_TEST_FLAG", "maybe")
    with pytest.raises(ConfigError, match="ACCY_TEST_FLAG='maybe'"):
        _ = fresh().flag


def test_the_process_config_is_accy_config():
    assert isinstance(accy.config, Config)
    assert not accy.config.debug_nans
