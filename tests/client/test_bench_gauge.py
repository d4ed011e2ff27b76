"""``fedlora bench gauge``: factor-space noise grows without bound along (cA, B/c); PRISM's does not."""

import json

from tests.conftest import run_cli


def test_factor_space_noise_unbounded_prism_at_closed_form(capsys):
    argv = [
        "bench",
        "gauge",
        "--m",
        "64",
        "--n",
        "48",
        "--rank",
        "4",
        "--samples",
        "64",
        "--log10-c",
        "-3",
        "3",
        "7",
    ]
    assert run_cli([*argv, "--json"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["c"] for r in recs] == [10.0**k for k in range(-3, 4)]
    for r in recs:
        assert set(r) >= {"c", "factor_space", "prism", "prism_theory"}
        assert r["prism_theory"] == 4 * (64 + 48 - 4)
        assert abs(r["prism"] / r["prism_theory"] - 1) < 0.05
        assert abs(r["factor_space"] / r["factor_space_theory"] - 1) < 0.1
    energy = {r["c"]: r["factor_space"] for r in recs}
    assert energy[1e-3] > 1e5 * energy[1.0] and energy[1e3] > 1e5 * energy[1.0]  # V-shaped, unbounded
    assert energy[1e-3] > energy[1e-2] > energy[1e-1] and energy[1e3] > energy[1e2] > energy[1e1]


def test_bad_rank_exit_2(capsys):
    assert run_cli(["bench", "gauge", "--m", "4", "--n", "4", "--rank", "5"]) == 2
    assert "rank" in capsys.readouterr().err
