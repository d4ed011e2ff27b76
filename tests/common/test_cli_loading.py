"""The ``fedlora`` command loads only the (sub)command it runs: common/cli.py ``add_commands``."""

import json
import subprocess
import sys

import pytest

from common import cli
from server.bench.cli import SUBCOMMANDS as BENCHES

PROBE = """
import json, sys
from common.cli import build_parser
build_parser({argv!r})
print(json.dumps(sorted(m for m in {watch!r} if m in sys.modules)))
"""


def loaded_after(argv: list[str], watch: list[str]) -> list[str]:
    """Which of ``watch`` a fresh interpreter has imported after building the parser for ``argv``."""
    code = PROBE.format(argv=argv, watch=watch)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_a_bench_imports_its_own_module_alone():
    benches = [module for module, _ in BENCHES.values()]
    assert loaded_after(["bench", "secagg", "--help"], [*benches, "peft"]) == ["server.bench.secagg"]
    assert loaded_after(["bench", "--help"], benches) == []


def test_the_suite_s_help_loads_no_model_framework():
    """``fedlora bench suite --help`` answers at once: torch, PEFT, Flower and matplotlib are loaded only
    once the suite computes a plan's configurations, starts a run or draws a figure."""
    heavy = ["torch", "peft", "flwr", "matplotlib", "transformers"]
    assert loaded_after(["bench", "suite", "--help"], heavy) == []


HEAVY = ["torch", "peft", "flwr", "transformers", "numpy", "server.simulate"]


@pytest.mark.parametrize("command", ["simulate", "train-local", "node", "deploy", "generate"])
def test_a_data_owner_s_first_commands_answer_help_without_a_model_framework(command):
    """``fedlora simulate --help``, ``train-local --help``, ``node --help``, ``deploy --help`` and
    ``generate --help`` answer at once (each took 4-10 s beside two runs)."""
    assert loaded_after([command, "--help"], HEAVY) == []


def test_the_audit_s_help_loads_no_model_framework():
    """The audit's options read the statistics module's minimums; scipy's stats load when it computes."""
    assert loaded_after(["audit", "client", "--help"], [*HEAVY[:4], "scipy.stats", "server.simulate"]) == []


def test_simulate_refuses_bad_options_before_the_federation_stack_loads():
    """The options are checked into a configuration first: server/simulate.py loads only once a run
    starts."""
    heavy = [m for m in HEAVY if m != "numpy"]
    refused = (
        "import json, sys\nfrom common.cli import main\n"
        "code = main(['simulate', '--rounds', '0', '--out', 'never'])\n"
        f"print(json.dumps([code, sorted(m for m in {heavy!r} if m in sys.modules)]))"
    )
    done = subprocess.run([sys.executable, "-c", refused], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == [2, []] and "rounds" in done.stderr


@pytest.mark.parametrize("bench", sorted(BENCHES))
def test_every_bench_parses_its_help(bench):
    with pytest.raises(SystemExit) as stop:
        cli.build_parser(["bench", bench]).parse_args(["bench", bench, "--help"])
    assert stop.value.code == 0


def test_the_whole_cli_loads_every_bench():
    parser = cli.build_parser(None)
    bench = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices["bench"]
    nested = next(a for a in bench._subparsers._group_actions if a.dest == "bench")
    assert set(nested.choices) == set(BENCHES)
    assert all(p._actions[1:] for p in nested.choices.values())  # each has its own options beyond -h
