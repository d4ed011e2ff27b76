"""Wishart-amplified ε of the noisy projection mechanism M2 = M(V + Ξ) over T Poisson-sampled steps.

Paper: Hu, Düngler, Schölkopf, Sanyal, "LoRA and Privacy: When Random Projections Help (and When
They Don't)". M2 adds Gaussian noise Ξ (std σ·C per entry) to the clipped full weight gradient
V (d × n, ‖ΔV‖_F ≤ C) and then projects it with M = Z Zᵀ, Z (d × r) i.i.d. Gaussian, drawn afresh
at every step. In LoRA terms: A_t (r × d) Gaussian, redrawn every step, only B trained, noise on
the full gradient before the projection.

Accounting (the paper's App. F.2, made explicit):

1. Per step, Thm 5 / Lemma 16: given M, the privacy loss is that of a Gaussian mechanism with
   sensitivity ‖P_M ΔV‖_F, P_M the projector onto col(M). On the good event
   G_α = {‖P_M ΔV‖_F² ≤ α‖ΔV‖_F²} a step is therefore the Poisson-subsampled Gaussian with noise
   multiplier σ/√α.
2. Lemma 17: ‖P_M u‖² ~ Beta(r/2, (d−r)/2) for a fixed unit u, so with a union bound over a basis
   of col(ΔV) (dimension ≤ s), Pr(G_α fails) ≤ s·[1 − I_α(r/2, (d−r)/2)], the regularised
   incomplete Beta function's upper tail.
3. T steps, each with a fresh M_t: a union bound adds T per-step failures. With the failure budget
   δ_p = f·δ (f = ``fail_frac``, the paper's experiments use 0.1) the per-step failure is δ_p/T and
   α* is the smallest α with s·[1 − I_α] ≤ δ_p/T.
4. ε_amplified = PLD-ε(σ/√α*, p, T) at δ − δ_p; ε_baseline = PLD-ε(σ, p, T) at δ (plain DP-SGD
   accounting, which ignores M: M2 is post-processing of V + Ξ). Both are valid (ε, δ) bounds for
   M2; the smaller is claimed. ε_baseline is claimed (the fallback) when the amplified bound is not
   smaller, e.g. r close to d, where α* → 1 and δ_p is spent for nothing.

Ambiguities of the paper resolved here:

- App. F.2 does not say whether δ_p = 0.1δ is per step or in total: here δ_p = f·δ is the *total*
  projection-failure budget, per step δ_p/T (the conservative reading).
- App. F.2 says "the largest admissible α": the failure probability falls and the Gaussian ε grows
  with α, so the right α is the *smallest* meeting the failure budget, which is what α* is. The
  good event G(M_t) is printed with ">"; it is "≤" (as above).
- Thm 5 states s = min(n, d) while its proof only needs s ≥ rank(ΔV): ``grad_rank`` is any upper
  bound on rank(ΔV) (1 for a linear head on a pooled feature), defaulting to d ≥ min(n, d), the
  always-safe choice for one projected layer. Several projected layers of the same (r, d), each
  with its own fresh M, take the sum of their bounds (P_M is block-diagonal, so the union bound
  runs over a basis of every block; up to L·d for L layers).
- Lemma 16's proof prints the loss variance as ‖P_M ΔV‖²/(2σ²); the main text's /σ² is right, and
  is what the subsampled-Gaussian accountant at multiplier σ/√α uses.
- The paper uses replace-one adjacency (‖ΔV‖_F ≤ 2C); here ΔV is one participant's clipped
  contribution (‖ΔV‖_F ≤ C), the adjacency of the project's baseline accountant, so both ε share one
  unit. Under replace-one, double ``grad_rank``.
- The paper composes the Gaussian part with RDP and its two-sided tail T(ε; μ); here both parts
  use the project's PLD accountant (a tighter upper bound; valid since on G_α each step is
  dominated by the subsampled Gaussian at σ/√α).

The amplified ε holds only for a mechanism that meets M2's assumptions; ``wishart_claim`` is the
guard such a mechanism calls before reporting it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scipy import special

from common.errors import FedloraError
from common.privacy.accounting.calibration import calibrate_sigma, epsilon_for

#: the paper's experiments (App. F.2): δ_p = 0.1·δ for projection failure
DEFAULT_FAIL_FRAC = 0.1
#: the baseline accountant (and the accountant of the amplified Gaussian part)
BASELINE_ACCOUNTANT = "pld"


def _check_shape(rank: int, dim: int, grad_rank: int) -> None:
    if not (isinstance(rank, int) and rank >= 1):
        raise FedloraError(f"wishart rank must be an integer >= 1, got {rank}")
    if not (isinstance(dim, int) and dim > rank):
        raise FedloraError(f"wishart rank {rank} must be below the projected dimension, got dim {dim}")
    if not (isinstance(grad_rank, int) and grad_rank >= 1):
        raise FedloraError(f"wishart grad rank must be an integer >= 1, got {grad_rank}")


def projection_failure(alpha: float, rank: int, dim: int, grad_rank: int = 1) -> float:
    """s·[1 − I_α(r/2, (d−r)/2)]: the bound on Pr(‖P_M ΔV‖_F² > α‖ΔV‖_F²) for rank(ΔV) ≤ s
    (Wishart paper Thm 5, Lemma 17). The upper tail is computed directly (``betaincc``), so it
    keeps its relative accuracy far into the tail where 1 − I_α would cancel to 0."""
    _check_shape(rank, dim, grad_rank)
    if not 0 <= alpha <= 1:
        raise FedloraError(f"alpha must be in [0, 1], got {alpha}")
    return grad_rank * float(special.betaincc(rank / 2, (dim - rank) / 2, alpha))


def alpha_star(rank: int, dim: int, grad_rank: int, failure: float) -> float:
    """Smallest α in (0, 1] with ``projection_failure(α) ≤ failure`` (per-step failure, a probability).

    Inverts the upper tail directly (``betainccinv``), then steps up to the safe side of float
    round-off, so the returned α never undercounts the failure."""
    _check_shape(rank, dim, grad_rank)
    if not 0 < failure < 1:
        raise FedloraError(f"projection failure budget must be in (0, 1), got {failure}")
    a, b, target = rank / 2, (dim - rank) / 2, failure / grad_rank
    alpha, step = float(special.betainccinv(a, b, target)), 1e-15
    while alpha < 1 and grad_rank * float(special.betaincc(a, b, alpha)) > failure:
        alpha = min(1.0, max(alpha * (1 + step), math.nextafter(alpha, 2.0)))
        step *= 2
    return alpha


@dataclass(frozen=True)
class WishartEpsilon:
    """Both ε (nats) of M2 after ``rounds`` steps and which one is claimed.

    ``epsilon`` is the claimed one, at ``delta``; ``amplified`` is at δ − ``projection_delta`` plus
    the T·(δ_p/T) projection failures, ``baseline`` the plain accountant at δ."""

    epsilon: float
    claimed: str  # "amplified" | "baseline"
    reason: str
    amplified: float
    baseline: float
    baseline_accountant: str
    delta: float
    projection_delta: float  # δ_p, the total projection-failure budget
    alpha: float  # α*: squared share of the sensitivity the projection keeps, with prob. ≥ 1 − δ_p/T
    noise_multiplier: float
    effective_noise_multiplier: float  # σ/√α*
    sample_rate: float
    rounds: int
    rank: int
    dim: int
    grad_rank: int

    def as_dict(self) -> dict:
        return asdict(self)


def wishart_epsilon(
    sigma: float,
    p: float,
    rounds: int,
    delta: float,
    rank: int,
    dim: int,
    grad_rank: int | None = None,
    fail_frac: float = DEFAULT_FAIL_FRAC,
) -> WishartEpsilon:
    """ε of ``rounds`` M2 steps at noise multiplier σ and Poisson rate p, amplified (Wishart paper
    Thm 5 + App. F.2) beside the baseline, with the smaller claimed; ``grad_rank`` defaults to
    ``dim`` (see the module docstring)."""
    grad_rank = dim if grad_rank is None else grad_rank
    _check_shape(rank, dim, grad_rank)
    if not 0 < fail_frac < 1:
        raise FedloraError(
            f"fail frac (share of delta for projection failure) must be in (0, 1), got {fail_frac}"
        )
    if not 0 < delta < 1:
        raise FedloraError(f"delta must be in (0, 1), got {delta}")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise FedloraError(f"rounds must be an integer >= 1, got {rounds}")
    if not 0 < p <= 1:
        raise FedloraError(f"sample rate p must be in (0, 1], got {p}")
    if not (sigma >= 0 and math.isfinite(sigma)):
        raise FedloraError(f"noise multiplier must be finite and >= 0, got {sigma}")

    baseline = epsilon_for(BASELINE_ACCOUNTANT, sigma, p, rounds, delta)
    projection_delta = fail_frac * delta
    alpha = alpha_star(rank, dim, grad_rank, projection_delta / rounds)
    sigma_eff = sigma / math.sqrt(alpha)  # sensitivity √α·C, noise std σ·C (Wishart paper Lemma 16)
    amplified = epsilon_for(BASELINE_ACCOUNTANT, sigma_eff, p, rounds, delta - projection_delta)
    if sigma == 0:
        claimed, reason = "baseline", "noise multiplier 0: no guarantee, amplified or not"
    elif amplified < baseline:
        claimed = "amplified"
        reason = (
            f"Wishart paper Thm 5: with probability >= 1 - {projection_delta / rounds:.3g} per step the "
            f"rank-{rank} projection keeps at most alpha={alpha:.4g} of the squared sensitivity"
        )
    else:
        claimed = "baseline"
        reason = (
            f"no amplification: rank {rank} of dim {dim} keeps alpha={alpha:.4g} of the squared "
            f"sensitivity, too much to pay for the projection-failure delta {projection_delta:.3g}"
        )
    return WishartEpsilon(
        epsilon=amplified if claimed == "amplified" else baseline,
        claimed=claimed,
        reason=reason,
        amplified=amplified,
        baseline=baseline,
        baseline_accountant=BASELINE_ACCOUNTANT,
        delta=delta,
        projection_delta=projection_delta,
        alpha=alpha,
        noise_multiplier=sigma,
        effective_noise_multiplier=sigma_eff,
        sample_rate=p,
        rounds=rounds,
        rank=rank,
        dim=dim,
        grad_rank=grad_rank,
    )


def wishart_sigma(
    target: float,
    p: float,
    rounds: int,
    delta: float,
    rank: int,
    dim: int,
    grad_rank: int | None = None,
    fail_frac: float = DEFAULT_FAIL_FRAC,
) -> float:
    """The noise multiplier whose claimed :func:`wishart_epsilon` is ``target`` (never above it): α*
    does not depend on σ, so the amplified ε = PLD-ε(σ/√α*) at δ − δ_p gives σ = √α*·σ_PLD(target);
    the baseline's σ where that is smaller (no amplification)."""
    grad_rank = dim if grad_rank is None else grad_rank
    _check_shape(rank, dim, grad_rank)
    projection_delta = fail_frac * delta
    alpha = alpha_star(rank, dim, grad_rank, projection_delta / rounds)
    amplified = math.sqrt(alpha) * calibrate_sigma(
        BASELINE_ACCOUNTANT, target, delta - projection_delta, p, rounds
    )
    return min(amplified, calibrate_sigma(BASELINE_ACCOUNTANT, target, delta, p, rounds))


#: the M2 assumptions the amplified ε rests on (Wishart paper Thm 5, Lemma 17, App. E/F.2)
ASSUMPTIONS = {
    "a_gaussian": "A is i.i.d. Gaussian (Lemma 17 needs a rotation-invariant col(A^T); "
    "Kaiming-uniform is not)",
    "a_redrawn_each_step": "A is redrawn independently at every step (a fixed A makes later "
    "gradients depend on A through W = W0 + BA, App. F.2)",
    "a_independent_of_data": "A is drawn by the party holding the data, independently of the data "
    "and of the current gradient (B reset to 0 or merged before each draw)",
    "noise_before_projection": "noise is added to the full gradient before the projection "
    "(M2 = M(V + Xi), Thm 5), not after it (M1)",
    "clip_full_gradient": "clipping bounds each participant's full weight gradient (n x d, "
    "Frobenius) by C, not its B-gradient",
    "only_projected_params": "every trained parameter is projected (dense heads, biases or norms "
    "get alpha = 1: no amplification)",
}


def wishart_claim(
    *,
    a_gaussian: bool,
    a_redrawn_each_step: bool,
    a_independent_of_data: bool,
    noise_before_projection: bool,
    clip_full_gradient: bool,
    only_projected_params: bool,
) -> None:
    """Refuse (FedloraError, one line) to claim the amplified ε unless every M2 assumption holds.

    The mechanism calls this before reporting ``WishartEpsilon.amplified``; the baseline ε needs
    only noise before projection and full-gradient clipping, and is not guarded here."""
    given = {
        "a_gaussian": a_gaussian,
        "a_redrawn_each_step": a_redrawn_each_step,
        "a_independent_of_data": a_independent_of_data,
        "noise_before_projection": noise_before_projection,
        "clip_full_gradient": clip_full_gradient,
        "only_projected_params": only_projected_params,
    }
    failed = [ASSUMPTIONS[name] for name, holds in given.items() if holds is not True]
    if failed:
        raise FedloraError(
            "cannot claim the Wishart-amplified epsilon (report the baseline): not met: " + "; ".join(failed)
        )


__all__ = [
    "ASSUMPTIONS",
    "DEFAULT_FAIL_FRAC",
    "WishartEpsilon",
    "alpha_star",
    "projection_failure",
    "wishart_claim",
    "wishart_epsilon",
    "wishart_sigma",
]
