"""``fedlora node`` at join time (issue 75 items 6 and 7): what share of its budget one run may
spend, said before the node starts, and a node that gives up on a SuperLink that never answers."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import time

import pytest

from client.node import sdk
from tests.conftest import run_cli

PAIRS = [("A warm, funny film.", 1), ("Tedious and far too long.", 0)] * 3


@pytest.fixture()
def base(tmp_path) -> list[str]:
    data = sdk.prepare_data(PAIRS, tmp_path / "mine.jsonl")
    return ["node", "--superlink", "127.0.0.1:8000", "--data", str(data), "--state-dir", str(tmp_path / "st")]


def test_a_node_says_what_one_run_may_spend_and_warns_when_it_is_everything(base, capsys):
    assert run_cli([*base, "--mechanism", "dp-adamw", "--epsilon", "8", "--print-command"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("privacy budget: sample-level epsilon 8 (delta 1e-05) for every dp-adamw run")
    assert err[1] == "one run may spend up to epsilon 8 (100% of it)"
    assert err[2].startswith("warning: one run may spend your whole budget")

    argv = [*base, "--mechanism", "dp-fedavg", "--epsilon", "8", "--run-epsilon", "2", "--print-command"]
    assert run_cli(argv) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[1:] == ["one run may spend up to epsilon 2 (25% of it)"]  # no warning
    assert err.startswith("privacy budget: client-level epsilon 8")
    assert "run-epsilon=2.0" in shlex.split(out)[-1]  # the policy the ClientApp enforces

    assert run_cli([*base, "--mechanism", "fedavg", "--print-command"]) == 0
    assert capsys.readouterr().err == ""  # no budget: nothing to say


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["--mechanism", "dp-adamw", "--epsilon", "8", "--run-epsilon", "9"],
            "run epsilon must be in (0, epsilon 8]",
        ),
        (["--mechanism", "fedavg", "--run-epsilon", "1"], "run epsilon caps a share of your budget"),
        (["--mechanism", "fedavg", "--give-up-after", "-1"], "give-up-after must be seconds >= 0"),
    ],
)
def test_bad_run_share_or_give_up_time_is_one_line(base, capsys, options, message):
    assert run_cli([*base, *options, "--print-command"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err, err


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the socket is: nothing listens there


def test_a_node_gives_up_on_a_superlink_that_never_answers(tmp_path):
    """The real entry point, a real flower-supernode: a SuperLink address where nothing listens.
    The node stops after --give-up-after seconds with exit code 1 and one line saying so; its
    output, not on a terminal, holds no colour codes (it was: ESC[92mINFO ...)."""
    data = sdk.prepare_data(PAIRS, tmp_path / "mine.jsonl")
    argv = [sys.executable, "-m", "common.cli", "node", "--superlink", f"127.0.0.1:{_closed_port()}"]
    argv += ["--data", str(data), "--state-dir", str(tmp_path / "st"), "--mechanism", "fedavg", "--insecure"]
    start = time.monotonic()
    done = subprocess.run([*argv, "--give-up-after", "2"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fedlora: error: gave up on the SuperLink after 2 s without an answer"), last
    assert "\x1b[" not in done.stdout + done.stderr
    assert took < 60, took
