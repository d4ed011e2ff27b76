"""``fedlora bench secagg`` (server/bench/secagg.py): the protocol timing checks its own sum and times
every stage; bad options are one line."""

from __future__ import annotations

import pytest

from server.bench.secagg import protocol_cost
from tests.conftest import run_cli


def test_the_protocol_cost_times_every_stage_of_a_correct_sum():
    """protocol_cost raises if the unmasked sum is not the inputs' sum; each stage is timed."""
    cost = protocol_cost(4, 256, 16)
    assert set(cost) == {"setup", "share", "mask", "unmask", "server"}
    assert all(v > 0 for v in cost.values())


@pytest.mark.parametrize(
    ("argv", "message"), [(["--neighbours", "0"], "--neighbours"), (["--rounds", "1"], "--rounds")]
)
def test_bad_options_are_one_line(argv, message, capsys):
    assert run_cli(["bench", "secagg", *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
