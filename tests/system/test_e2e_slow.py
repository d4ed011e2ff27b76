"""Slow end-to-end runs (`make test-all`): Flower's own simulation via `flwr run .`, and the
real causal LM federation."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common.presets import preset
from server.simulate import simulate

ROOT = Path(__file__).parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.process]


def _kill_local_superlink(flwr_home: Path) -> None:
    """`flwr run` leaves a detached SuperLink behind; stop the one that uses our FLWR_HOME."""
    out = subprocess.run(["pgrep", "-f", str(flwr_home)], capture_output=True, text=True).stdout
    for pid in map(int, out.split()):
        os.kill(pid, signal.SIGTERM)


def test_flwr_run_against_flower_simulation(tmp_path):
    flwr = shutil.which("flwr") or str(Path(sys.executable).parent / "flwr")
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr"),
        # flwr starts `flower-superlink` from PATH: the one installed beside this interpreter
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }
    run_dir = tmp_path / "run"
    overrides = f"preset='small' num-clients=2 rounds=1 local-steps=3 eval-examples=40 max-train-examples=200 out-dir='{run_dir}'"
    try:
        proc = subprocess.run(
            [
                flwr,
                "run",
                ".",
                "--stream",
                "--run-config",
                overrides,
                "--federation-config",
                "num-supernodes=2 client-resources-num-cpus=1",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        _kill_local_superlink(tmp_path / "flwr")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] + summary["rounds_skipped"] == 1
    assert (run_dir / "adapter" / "adapter_model.safetensors").exists()


def test_smollm2_federation_improves_held_out_loss(tmp_path):
    cfg = preset("smollm2-rt", rounds=2, local_steps=10, eval_examples=100).check()
    simulate(cfg, tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert summary["after"]["loss"] < summary["before"]["loss"]


def test_bench_scale_through_flowers_ray_simulation(capsys):
    """`fedlora bench scale --backend ray`: the same federation through `flwr run .` (Ray workers)."""
    import argparse

    from server.bench import scale

    args = argparse.Namespace(
        preset="minilm-rt", populations="2", cohort=2, rounds=2, backend="inprocess,ray", json=True
    )
    assert scale.run(args) == 0
    inprocess, row = json.loads(capsys.readouterr().out)["rows"]
    assert row["backend"] == "ray" and row["replies"] >= 1 and row["client_s"] > 0
    assert row["peak_rss_mb"] is None  # spread over the Ray workers: not reported
    assert row["vs_ray"] == round(row["client_s"] / inprocess["client_s"], 2)
