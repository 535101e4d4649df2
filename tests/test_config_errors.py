"""Configuration mistakes get one line naming the field (or the variable) and the fix, never a
traceback: typos, runaway nesting, environment overrides that are not JSON or not valid."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.settings_base import MAX_CONFIG_DEPTH
from idlegpu.scheduler.config import load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "idlegpu.yaml"


def _config(tmp_path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_misspelt_field_gets_did_you_mean(tmp_path):
    text = CONFIG.read_text(encoding="utf-8").replace("  timezone:", "  timezne:", 1)
    with pytest.raises(ConfigError, match=r"pool\.timezne: unknown field; did you mean "
                                           r"'timezone'\?"):
        load_config(_config(tmp_path, text))


def test_an_unknown_field_lists_what_the_section_knows(tmp_path):
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    data["admission"]["zzzz"] = 1
    with pytest.raises(ConfigError, match=r"admission\.zzzz: unknown field; remove it or use "
                                           r"one of: confidence, runtime_quantile"):
        load_config(data=data)


def test_a_config_nested_3000_deep_is_refused_before_parsing(tmp_path):
    path = _config(tmp_path, "pool:\n  name: x\nextra: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(ConfigError, match=rf"nested deeper than {MAX_CONFIG_DEPTH} levels at "
                                           r"line 3"):
        load_config(path)


def test_deep_data_is_refused_too():
    data: dict = {"pool": {}}
    inner = data
    for _ in range(3000):
        inner["x"] = {}
        inner = inner["x"]
    with pytest.raises(ConfigError, match="nested 33 levels deep"):
        load_config(data=data)


def test_an_environment_list_override_that_is_not_json_names_the_variable(monkeypatch):
    monkeypatch.setenv("IDLEGPU_SERVICES", "chat,code")
    with pytest.raises(ConfigError) as info:
        load_config(CONFIG)
    assert str(info.value).startswith("IDLEGPU_SERVICES (environment): its value is not JSON")


def test_an_invalid_environment_value_names_the_variable_not_the_file(monkeypatch):
    monkeypatch.setenv("IDLEGPU_POOL__TOTAL_GPUS", "many")
    with pytest.raises(ConfigError, match=r"IDLEGPU_POOL__TOTAL_GPUS \(environment\): Input "
                                           r"should be a valid integer"):
        load_config(CONFIG)
