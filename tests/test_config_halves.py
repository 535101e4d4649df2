"""The two halves of ``idlegpu.yaml``: the forecast reads its part of a whole file, leaving the
scheduler's sections alone but not mistakes, and the scheduler's model is the whole file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from idlegpu.forecast import config as forecast_config
from idlegpu.forecast.errors import ConfigError
from idlegpu.forecast.planning import what_if
from idlegpu.scheduler import config as scheduler_config

CONFIG = Path(__file__).resolve().parents[1] / "idlegpu.yaml"


def test_the_sections_the_forecast_leaves_are_the_ones_the_scheduler_adds():
    forecast, whole = forecast_config.Settings, scheduler_config.Settings
    added = [name for name in whole.model_fields if name not in forecast.model_fields]
    assert list(forecast.other_sections) == added
    assert whole.other_sections == ()
    assert list(whole.model_fields)[:len(forecast.model_fields)] == list(forecast.model_fields)


def test_the_forecast_reads_its_part_of_a_whole_file():
    whole = scheduler_config.load_config(CONFIG)
    part = forecast_config.load_config(CONFIG)
    assert type(part) is forecast_config.Settings
    assert (part.pool, part.services, part.prometheus) == (
        whole.pool, whole.services, whole.prometheus)
    assert part.admission.pool_uncertainty == whole.admission.pool_uncertainty
    assert not hasattr(part, "store")


def test_the_forecast_reads_the_pool_uncertainty_it_is_given():
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    data["admission"]["pool_uncertainty"] = "sum"
    assert forecast_config.load_config(data=data).admission.pool_uncertainty == "sum"
    data["admission"]["pool_uncertainty"] = "lockstep"
    for load in (forecast_config.load_config, scheduler_config.load_config):
        with pytest.raises(ConfigError, match=r"admission\.pool_uncertainty: "):
            load(data=data)


@pytest.mark.parametrize("load", [forecast_config.load_config, scheduler_config.load_config])
def test_a_misspelt_section_is_refused_by_either_half_alike(load):
    data = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    data["servics"] = data["stores"] = {}
    with pytest.raises(ConfigError) as info:
        load(data=data)
    assert str(info.value) == (
        "config: servics: unknown field; did you mean 'services'?; stores: unknown field; "
        "did you mean 'store'?")


def test_a_what_if_keeps_the_model_it_is_given():
    whole = scheduler_config.load_config(CONFIG)
    assert type(what_if(whole, pool={"headroom_gpus": 4})) is scheduler_config.Settings
    part = forecast_config.load_config(CONFIG)
    assert type(what_if(part, pool={"headroom_gpus": 4})) is forecast_config.Settings
