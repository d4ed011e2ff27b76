"""``fedlora train-local``'s defaults are written once: :data:`LOCAL_DEFAULTS` holds only where they
differ from :class:`RunConfig`'s, every other option takes the declared default."""

import argparse
from dataclasses import fields

from common.config import RunConfig
from common.local_options import LOCAL_DEFAULTS, LOCAL_OPTIONS, SHARD_OPTIONS, add_arguments, local_defaults

DECLARED = {f.name: f.default for f in fields(RunConfig)}


def test_local_defaults_repeat_no_declared_default():
    repeated = {k: v for k, v in LOCAL_DEFAULTS.items() if v == DECLARED[k]}
    assert not repeated, (
        f"RunConfig already declares these defaults; drop them from LOCAL_DEFAULTS: {repeated}"
    )
    assert set(LOCAL_DEFAULTS) <= set(LOCAL_OPTIONS) and set(SHARD_OPTIONS) <= set(LOCAL_OPTIONS)


def test_every_other_option_takes_the_declared_default():
    effective = local_defaults()
    assert list(effective) == list(LOCAL_OPTIONS)
    assert all(effective[k] == DECLARED[k] for k in LOCAL_OPTIONS if k not in LOCAL_DEFAULTS)
    assert {"num_clients": 1, "partition": "iid"}.items() <= effective.items()  # one node, the whole split


def test_the_parser_defaults_are_the_effective_ones():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--mechanism", "dp-adamw"])
    assert {k: getattr(args, k) for k in LOCAL_OPTIONS} == local_defaults()
