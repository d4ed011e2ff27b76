"""Presets (common/presets.py): every one builds a RunConfig that passes the federation's checks, and
``--preset`` is the base that every other option overrides."""

import argparse

import pytest

from common.config import RunConfig
from common.errors import FedloraError
from common.presets import PRESETS, from_flat, preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds_and_runs_as_a_federation(name):
    cfg = preset(name)
    assert isinstance(cfg, RunConfig) and cfg.check_federated() is cfg
    assert all(getattr(cfg, key) == value for key, value in PRESETS[name].items())  # nothing dropped


def test_overrides_win_and_none_keeps_the_presets_value():
    cfg = preset("minilm-rt", rounds=2, lr=None)
    assert cfg.rounds == 2 and cfg.lr == PRESETS["minilm-rt"]["lr"]
    assert preset("default", **{k: None for k in PRESETS["default"]}) == preset("default")


def test_unknown_preset_names_the_available_ones():
    with pytest.raises(FedloraError, match=r"unknown preset 'nope'; available: .*minilm-rt-xdev"):
        preset("nope")


def test_flat_form_and_simulate_start_from_the_preset():
    """A Flower run config's ``preset`` key and ``simulate --preset`` apply the preset before the other
    options (without one: ``default``)."""
    from server.simulate_cli import add_config_arguments, config_from_args

    assert from_flat({"preset": "small", "rounds": "2"}) == preset("small", rounds=2)
    assert from_flat({}) == preset("default")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert config_from_args(parser.parse_args([])) == preset("default")
    given = config_from_args(parser.parse_args(["--preset", "small", "--rounds", "3"]))
    assert given == preset("small", rounds=3)
