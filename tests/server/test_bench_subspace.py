"""``fedlora bench subspace``: real client increments against a basis fitted on the server's public
increments, a random projection of the same size and the identity."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

TINY = ["--preset", "minilm-rt", "--num-clients", "3", "--max-train-examples", "120", "--eval-examples", "8"]
TINY += ["--local-steps", "1", "--batch-size", "4", "--max-length", "16", "--public-fraction", "0.25"]


@pytest.mark.slow  # ≈ 30 s: real increments from a federation (make test-all)
def test_subspace_bench_reports_each_codecs_energy_on_real_increments(capsys):
    code = run_cli(
        [
            "bench",
            "subspace",
            *TINY,
            "--clients",
            "2",
            "--public-increments",
            "5",
            "--compression",
            "4",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    result = json.loads(out)
    rows = {(r["codec"], r["k"]): r for r in result["records"]}
    D = result["factor_coords"]
    assert rows[("identity", D)]["energy"] > 0.9999 and rows[("identity", D)]["mean_cosine"] > 0.9999
    pca = next(r for r in result["records"] if r["codec"] == "pca")
    assert pca["k"] == 5 and "capped at the 5 public increments" in pca["note"]
    assert ("random-projection", 5) in rows and ("random-projection", D // 4) in rows
    for r in result["records"]:
        assert 0.0 <= r["energy"] <= 1.0 + 1e-6
        assert abs(r["mean_cosine"] ** 2 - r["mean_energy"]) < 1e-6  # orthogonal projections
    assert result["clients"] == 2 and result["public_examples"] > 1000  # a quarter of the whole pool
    assert "none spent" in result["privacy"]


def test_subspace_bench_needs_public_data(capsys):
    code = run_cli(["bench", "subspace", *TINY[:-2], "--clients", "2"])
    assert code != 0 and "needs --public-fraction > 0" in capsys.readouterr().err
