"""``fedlora bench gauge``: intrinsic noise energy of factor-space DP vs PRISM along a gauge orbit.

For a fixed ``Z = A Bᵀ`` and factorisations ``(cA, B/c)``, one DP step's noise on ``Z`` is
``ξ_A (B/c)ᵀ + (cA) ξ_Bᵀ`` for factor-space DP-SGD (ξ i.i.d. N(0, τ²); PRISM Eq. 7, Corollary 2.3:
``E‖·‖² = τ²(m‖B‖²/c² + n c²‖A‖²)``, unbounded in c) and ``τ P_{A,B}(Ξ)`` for PRISM (Eq. 19; Thm 3.1:
``E‖·‖² = τ² r(m + n − r)`` whatever c). Energies are Monte-Carlo means over ``samples`` draws, computed
with Eq. 15 (no m × n matrix).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from client.dp.prism import geometry, tangent_noise, tangent_sq_norm


def gauge_sweep(
    m: int, n: int, rank: int, cs: np.ndarray, samples: int, tau: float = 1.0, seed: int = 0
) -> list[dict[str, float]]:
    """One record per c: ``c``, ``factor_space``, ``prism`` (MC mean energies), ``prism_theory``,
    ``factor_space_theory``; all in units of τ² · (Frobenius norm²)."""
    gen = torch.Generator().manual_seed(seed)
    A = torch.randn(m, rank, generator=gen, dtype=torch.float64) / m**0.5
    B = torch.randn(n, rank, generator=gen, dtype=torch.float64) / n**0.5
    records = []
    for c in cs:
        geo = geometry(A * c, B / c)
        xi_a = tau * torch.randn(samples, m, rank, generator=gen, dtype=torch.float64)
        xi_b = tau * torch.randn(samples, n, rank, generator=gen, dtype=torch.float64)
        factor = tangent_sq_norm(geo, xi_a, xi_b).mean()
        draws = [tangent_noise(geo, gen) for _ in range(samples)]
        prism = tangent_sq_norm(
            geo, tau * torch.stack([d[0] for d in draws]), tau * torch.stack([d[1] for d in draws])
        )
        records.append(
            {
                "c": float(c),
                "factor_space": float(factor),
                "factor_space_theory": tau**2
                * (m * float(B.square().sum()) / c**2 + n * c**2 * float(A.square().sum())),
                "prism": float(prism.mean()),
                "prism_theory": tau**2 * rank * (m + n - rank),
            }
        )
    return records


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--m", type=int, default=576, help="output dimension (SmolLM2-135M q_proj: 576)")
    parser.add_argument("--n", type=int, default=576, help="input dimension")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--samples", type=int, default=64, help="Monte-Carlo draws per c")
    parser.add_argument(
        "--log10-c", type=float, nargs=3, default=(-3.0, 3.0, 13), metavar=("LO", "HI", "NUM")
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON record per c")


def run(args: argparse.Namespace) -> int:
    from common.errors import FedloraError

    lo, hi, num = args.log10_c
    if min(args.m, args.n, args.samples) < 1 or not 1 <= args.rank <= min(args.m, args.n) or num < 1:
        raise FedloraError("need m, n, samples >= 1, 1 <= rank <= min(m, n) and at least one c")
    cs = np.logspace(lo, hi, int(num))
    records = gauge_sweep(args.m, args.n, args.rank, cs, args.samples, seed=args.seed)
    if args.json:
        for rec in records:
            print(json.dumps(rec))
        return 0
    print(
        f"noise energy E||N_Z||^2 / tau^2 on Z = A B^T (m={args.m}, n={args.n}, r={args.rank}), {args.samples} draws"
    )
    print(f"{'c':>10} {'factor-space':>14} {'(theory)':>12} {'PRISM':>10} {'(theory)':>10}")
    for r in records:
        print(
            f"{r['c']:>10.3g} {r['factor_space']:>14.4g} {r['factor_space_theory']:>12.4g} "
            f"{r['prism']:>10.4g} {r['prism_theory']:>10.4g}"
        )
    return 0
