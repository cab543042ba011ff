"""accy.config: typed settings read once from their ACCY_* variables."""

import re
from pathlib import Path

import pytest

import accy
from accy.config import SETTINGS, Config, ConfigError, Setting, _boolean


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


def test_the_settings_page_lists_exactly_the_settings():
    page = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    assert page == accy.config.page(), (
        'docs/config.md is not accy.config.page(): regenerate it with `python -c "from '
        "accy.config import config; open('docs/config.md', 'w').write(config.page())\"`"
    )
    listed = re.findall(r"^\| `(\w+)` \| `(ACCY_\w+)` \|", page, re.MULTILINE)
    assert listed == [(s.name, s.variable) for s in SETTINGS]


def test_every_setting_is_read_from_its_variable_with_its_type(monkeypatch):
    texts = {bool: ("0", False), int: ("7", 7), float: ("0.5", 0.5), str: ("/x", "/x")}
    for setting in SETTINGS:
        text, value = texts[setting.kind]
        monkeypatch.setenv(setting.variable, text)
        assert getattr(Config(), setting.name) == value, setting.name
        assert setting.variable == "ACCY_" + setting.name.upper()
        assert setting.meaning.endswith(".")
    for setting in SETTINGS:
        if setting.kind in (int, float):
            monkeypatch.setenv(setting.variable, "-1")
            with pytest.raises(ConfigError, match=f"{setting.variable}='-1'.*at least 0"):
                getattr(Config(), setting.name)
