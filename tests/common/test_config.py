"""Run configuration: the Flower flat form round-trips, bad values are refused (presets: test_presets.py)."""

from dataclasses import fields

import pytest

from common.config import HELP, RunConfig, to_flat
from common.errors import FedloraError
from common.presets import from_flat, preset


def test_flat_roundtrip():
    cfg = preset("minilm-rt", rounds=7, sample_rate=0.5, targets="query,key")
    assert from_flat({"preset": "minilm-rt", **to_flat(cfg)}) == cfg
    assert cfg.target_modules == ["query", "key"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sample_rate": 0.0}, "sample-rate"),
        ({"sample_rate": 1.01}, "sample-rate"),
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
    with pytest.raises(FedloraError, match="unknown config key 'num-clientz'; did you mean 'num-clients'\\?"):
        from_flat({"num-clientz": 3})
    with pytest.raises(FedloraError, match=r"unknown config key 'bogus'$"):  # nothing close: no guess
        from_flat({"bogus": 3})


def test_pyproject_lists_every_config_key():
    """Flower refuses --run-config keys missing from [tool.flwr.app.config]; keep them in step."""
    import tomllib
    from pathlib import Path

    app_config = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["flwr"][
        "app"
    ]["config"]
    assert set(app_config) == {"preset", *to_flat(RunConfig())}
    assert from_flat(app_config) == preset("small")  # a deployment's nodes are its clients


def test_flat_value_of_wrong_type_is_a_clear_error():
    with pytest.raises(FedloraError, match="expects int"):
        from_flat({"rounds": "many"})


def test_every_option_is_declared_once_with_help_and_group():
    """Each option carries its help, group and check in its declaration (common/config.py)."""
    declared = fields(RunConfig)
    assert {f.name for f in declared} == set(HELP) and all(HELP.values())
    assert all(f.metadata["group"] for f in declared)
    for f in declared:  # a choice option's default is one of its choices (or "": derived)
        assert not f.metadata["choices"] or f.default in (*f.metadata["choices"], "")


def test_simulate_and_train_local_share_option_names():
    """train-local takes its options from the same declarations: same names, same meaning."""
    import argparse

    from common.local_options import add_arguments as local_arguments
    from server.simulate_cli import add_config_arguments

    def dests(add):
        parser = argparse.ArgumentParser()
        add(parser)
        return {a.dest: a.option_strings for a in parser._actions}

    sim, local = dests(add_config_arguments), dests(local_arguments)
    shared = {name for name in local if name in sim}
    assert {"sample_epsilon", "sample_clip", "local_steps", "lora_init", "mechanism"} <= shared
    assert all(local[name] == sim[name] for name in shared)
    assert "clip" not in local and "epsilon" not in local  # no second meaning of --clip


def test_a_causal_lm_in_place_of_the_presets_encoder_brings_its_own_defaults():
    """Issue 75 item 5: ``--model smollm2-135m`` on the default preset (an encoder's: --pooling mean,
    --head-init zero-shot) failed with "--pooling mean is for encoder classifiers"."""
    from common.presets import preset

    cfg = preset("default", model="smollm2-135m")
    assert (cfg.pooling, cfg.head_init) == ("cls", "random") and cfg.model == "smollm2-135m"
    assert preset("default").pooling == "mean"  # the preset's own model keeps the preset's options
    assert preset("default", model="smollm2-135m", pooling="mean").pooling == "mean"  # asked for: kept
    assert preset("default", model="./my-encoder").pooling == "mean"  # not a registered causal LM
