"""Run configuration: presets validate, the Flower flat form round-trips, bad values are refused."""

import pytest

from common.config import HELP, PRESETS, RunConfig, from_flat, preset, to_flat
from common.errors import FedloraError


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name):
    preset(name).check()


def test_flat_roundtrip():
    cfg = preset("minilm-rt", rounds=7, sample_rate=0.5, targets="query,key")
    assert from_flat({"preset": "minilm-rt", **to_flat(cfg)}) == cfg
    assert cfg.target_modules == ["query", "key"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sample_rate": 0.0}, "sample rate"),
        ({"sample_rate": 1.01}, "sample rate"),
        ({"rank": 0}, "rank"),
        ({"num_clients": 0}, "num-clients"),
        ({"partition": "zipf"}, "partition"),
        ({"mechanism": "magic"}, "mechanism"),
    ],
)
def test_bad_values(change, message):
    with pytest.raises(FedloraError, match=message):
        RunConfig(**change).check()


def test_unknown_flat_key():
    with pytest.raises(FedloraError, match="unknown config key"):
        from_flat({"num-clientz": 3})


def test_pyproject_lists_every_config_key():
    """Flower refuses --run-config keys missing from [tool.flwr.app.config]; keep them in step."""
    import tomllib
    from pathlib import Path

    app_config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["tool"]["flwr"][
        "app"
    ]["config"]
    assert set(app_config) == {"preset", *to_flat(RunConfig())}
    assert from_flat(app_config) == preset("default")


def test_flat_value_of_wrong_type_is_a_clear_error():
    with pytest.raises(FedloraError, match="expects int"):
        from_flat({"rounds": "many"})


def test_every_option_has_help():
    assert {k.replace("-", "_") for k in to_flat(RunConfig())} - {"out_dir"} == set(HELP)
