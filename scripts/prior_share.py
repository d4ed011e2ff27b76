"""How much of a federation's total update lies in a public-prior run's basis? (docs/shakespeare.md)

For each RUN (a finished ``fedlora simulate`` directory with the same model, adapter and seed as
PRIOR_RUN), prints the share of the squared norm of its total update (last checkpoint minus the
initial adapter, LoRA factors only) inside the span of PRIOR_RUN's public basis
(``public-subspace.safetensors``, ``--public-subspace K``), beside K / D, a random K-dimensional
subspace's expected share. ``--public-subspace`` keeps only that share of a round's update.

Usage: ``python scripts/prior_share.py PRIOR_RUN RUN [RUN ...]`` (about a minute on one core:
it rebuilds PRIOR_RUN's initial adapter; offline, from the packaged assets).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from autoencoder.layout import Layout
from common.config import RunConfig
from server import checkpoint
from server.evaluation import Evaluator
from server.public_prior import BASIS_FILE, load_basis


def _config(run: Path) -> RunConfig:
    """The configuration ``run`` (a ``fedlora simulate`` directory) was made with."""
    return RunConfig(**json.loads((run / "config.json").read_text(encoding="utf-8")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prior_run", type=Path, help="a run directory with a public basis")
    ap.add_argument("runs", type=Path, nargs="+", help="run directories of the same model and seed")
    args = ap.parse_args()
    cfg = _config(args.prior_run)
    init = Evaluator(cfg).initial_state()
    shapes = {k: tuple(v.shape) for k, v in init.items()}
    layout = Layout.from_shapes(shapes, 1)
    basis = load_basis(args.prior_run / BASIS_FILE, layout)[0].basis  # (D, K), orthonormal columns
    k = basis.shape[1]
    print(
        f"D = {layout.num_coords:,}, K = {k}: a random K-dimensional subspace holds {k / layout.num_coords:.2e}"
    )
    same = ("model", "seed", "rank", "targets", "init_kind")
    for run in args.runs:
        other = _config(run)
        if diff := [f for f in same if getattr(other, f) != getattr(cfg, f)]:
            raise SystemExit(f"prior_share: {run} differs from {args.prior_run} in {', '.join(diff)}")
        last, _, _ = checkpoint.load(run / checkpoint.CHECKPOINT_FILE, shapes)  # refuses another adapter
        u = layout.to_vector({n: last[n].float() - init[n].float() for n in layout.names})
        inside = float((basis.T @ u).norm() ** 2 / u.norm() ** 2)
        print(f"{run}: |update| {float(u.norm()):.3f}, share of |update|^2 in the basis {inside:.2e}")


if __name__ == "__main__":
    main()
