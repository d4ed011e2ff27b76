"""Adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021, NeurIPS), as pure functions.

Mechanism (paper, Algorithm 1). Each sampled client clips its update Δ to the current clip C
(ℓ2 norm, units of the model parameters) and reports the bit b = [‖Δ‖ ≤ C] ("unclipped").
The server releases the noised count Σb + N(0, σ_b²) (σ_b in units of clients), divides it
by the *expected* number of clients per round K to get the noised unclipped fraction b̄, and
takes one geometric step on the quantile loss (paper, Sec. 2): C ← C · exp(−η_C (b̄ − γ)),
with γ the target fraction of unclipped updates and η_C the clip learning rate. At the fixed
point E[b̄] = γ, so C tracks the γ-quantile of the update norms.

Privacy (paper, Sec. 3, Theorem 1). The count is released as the centred sum Σ(b − ½) + noise,
plus the public constant K/2; adding or removing one client then moves it by exactly ½, so
the count has sensitivity ½ and its noise multiplier is 2σ_b. The update sum (sensitivity C,
noise std z_Δ·C) and the count together form ONE Gaussian mechanism with noise multiplier
z = (z_Δ⁻² + (2σ_b)⁻²)^(−1/2). The accountant charges z; the update noise must therefore use
z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2) > z, which exists only when 2σ_b > z. Default σ_b = K/20.
For a cohort of exactly K clients the centred release equals Σb + N(0, σ_b²); under Poisson
sampling the caller must form ``noised_count`` as Σ(b − ½) + N(0, σ_b²) + K/2, so that the
realised cohort size is never used.

Flower 1.41 (``flwr.supercore.differential_privacy``, ``flwr.serverapp.strategy`` and the
legacy ``flwr.server.strategy`` ``DifferentialPrivacy{Server,Client}SideAdaptiveClipping``):

- ``compute_adaptive_noise_params`` matches ``update_noise_multiplier``: same default
  σ_b = K/20 (``num_sampled_clients / 20``), and it raises ``ValueError`` when z ≥ 2σ_b (where
  this module raises ``FedloraError``). For z = 0 Flower returns z_Δ = 0 and σ_b = 0 (no noise
  at all); here z ≤ 0 is an error, because a zero multiplier has no privacy to split.
- The fraction: Flower divides the noised count by ``len(replies)``, the number of clients
  that replied. Here it is divided by the expected count K (paper). The two coincide when all
  K sampled clients reply, which is what Flower's fixed-size sampling expects; otherwise it
  only logs a warning.
- No rounding: Flower keeps the noised count as a float, as here.
- The bit: Flower's ``norm_bit`` (``adaptive_clip_inputs_inplace``, ``adaptiveclipping_mod``)
  is True when the update *was clipped*, i.e. ‖Δ‖ > C strictly (scale factor C/‖Δ‖ < 1). It
  is the complement of the paper's b = [‖Δ‖ ≤ C], with the same boundary (‖Δ‖ = C counts as
  unclipped in both). Flower's server strategies nevertheless apply the paper's step
  C ← C · exp(−η (f − γ)) to the *clipped* fraction f = 1 − b̄, so C moves away from the
  target quantile instead of towards it (the fixed point is unstable). The deprecated
  ``DPFedAvgAdaptive`` with ``DPFedAvgNumPyClient`` reports ``not clipped`` and follows the
  paper. Here the bit is always the paper's unclipped bit, and ``next_clip`` equals Flower's
  ``_geometric_update`` when both are given the same fraction.
"""

from __future__ import annotations

import math

from common.errors import FedloraError


def _check_positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise FedloraError(f"adaptive clipping: {name} must be a finite number > 0, got {value!r}")


def default_count_std(expected_clients: float) -> float:
    """The paper's noise std σ_b of the unclipped count (units of clients): K/20, K = expected clients/round."""
    _check_positive("expected clients per round", expected_clients)
    return expected_clients / 20.0


def update_noise_multiplier(z: float, count_std: float) -> float:
    """Noise multiplier z_Δ of the update sum (noise std z_Δ·C) such that the update sum and the count
    (noise std ``count_std`` = σ_b, in clients) compose to one Gaussian mechanism with multiplier ``z``.

    Theorem 1: z⁻² = z_Δ⁻² + (2σ_b)⁻², so z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2). Requires 2σ_b > z.
    """
    _check_positive("noise multiplier z", z)
    _check_positive("count noise std", count_std)
    if 2.0 * count_std <= z:
        raise FedloraError(
            f"adaptive clipping: count noise std {count_std:g} is too small for noise multiplier {z:g} "
            f"(needs 2*std > z, i.e. std > {z / 2:g}); raise the count noise std or lower z"
        )
    # Theorem 1, solved for the update-sum multiplier.
    return (z**-2 - (2.0 * count_std) ** -2) ** -0.5


def combined_noise_multiplier(z_delta: float, count_std: float) -> float:
    """Noise multiplier of the single Gaussian mechanism formed by the update sum (multiplier ``z_delta``)
    and the unclipped count (noise std ``count_std`` in clients, sensitivity ½): (z_Δ⁻² + (2σ_b)⁻²)^(−1/2).
    """
    _check_positive("update noise multiplier", z_delta)
    _check_positive("count noise std", count_std)
    # Theorem 1: the count's multiplier is σ_b / (1/2) = 2σ_b; squared inverse multipliers add.
    return (z_delta**-2 + (2.0 * count_std) ** -2) ** -0.5


def next_clip(
    clip: float, noised_count: float, expected_clients: float, target_quantile: float, clip_lr: float
) -> float:
    """Next clip C (same units as ``clip``, the ℓ2 norm of an update) after one round.

    ``noised_count`` is the noised number of unclipped updates (‖Δ‖ ≤ C), a float (never rounded;
    it may be negative or exceed K); b̄ = noised_count / ``expected_clients``; ``target_quantile`` γ
    is the target unclipped fraction in [0, 1]; ``clip_lr`` η_C ≥ 0 (the paper uses 0.2).
    Geometric update (Sec. 2, Algorithm 1): C · exp(−η_C (b̄ − γ)).
    """
    _check_positive("clip", clip)
    _check_positive("expected clients per round", expected_clients)
    if not math.isfinite(noised_count):
        raise FedloraError(f"adaptive clipping: noised count must be finite, got {noised_count!r}")
    if not 0.0 <= target_quantile <= 1.0:
        raise FedloraError(f"adaptive clipping: target quantile must be in [0, 1], got {target_quantile!r}")
    if not (math.isfinite(clip_lr) and clip_lr >= 0):
        raise FedloraError(
            f"adaptive clipping: clip learning rate must be a finite number >= 0, got {clip_lr!r}"
        )
    fraction = noised_count / expected_clients  # b̄: divided by the expected, not the realised, cohort
    return clip * math.exp(-clip_lr * (fraction - target_quantile))
