"""Adaptive clipping math (common/privacy/mechanisms/adaptive_clip.py) against Flower 1.41 and closed forms.

Paper: Andrew, Thakkar, McMahan, Ramaswamy 2021, "Differentially private learning with adaptive clipping".
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.server.strategy import DifferentialPrivacyServerSideAdaptiveClipping as LegacyServerSideAdaptive
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping, FedAvg
from flwr.supercore.differential_privacy import adaptive_clip_inputs_inplace, compute_adaptive_noise_params

from common.errors import FedloraError
from common.privacy.mechanisms.adaptive_clip import (
    combined_noise_multiplier,
    default_count_std,
    next_clip,
    update_noise_multiplier,
)

# (z, expected clients K, σ_b or None for Flower's default K/20), all with 2σ_b > z.
NOISE_CASES = [
    (0.5, 20, None),
    (1.0, 40, None),
    (1.1, 100, None),
    (0.7, 1000, None),
    (0.8, 10, 3.0),
    (2.0, 50, 1.5),
    (1.0, 5, 0.6),
]


# --- 1. update noise multiplier vs Flower's compute_adaptive_noise_params --------------------------------


@pytest.mark.parametrize(("z", "clients", "count_std"), NOISE_CASES)
def test_update_noise_multiplier_matches_flower(z, clients, count_std):
    flower_std, flower_z_delta = compute_adaptive_noise_params(z, clients, count_std)
    ours_std = default_count_std(clients) if count_std is None else count_std
    assert ours_std == pytest.approx(flower_std, rel=1e-15)
    assert update_noise_multiplier(z, ours_std) == pytest.approx(flower_z_delta, rel=1e-12)


@pytest.mark.parametrize(("z", "clients", "count_std"), NOISE_CASES)
def test_split_composes_back(z, clients, count_std):
    std = default_count_std(clients) if count_std is None else count_std
    z_delta = update_noise_multiplier(z, std)
    assert z_delta > z  # the count takes part of the budget, so the update sum needs more noise
    assert combined_noise_multiplier(z_delta, std) == pytest.approx(z, rel=1e-12)
    assert update_noise_multiplier(combined_noise_multiplier(3.0, std), std) == pytest.approx(3.0, rel=1e-9)


def test_default_count_std_is_flowers_default():
    for clients in (1, 7, 20, 100, 2500):
        assert default_count_std(clients) == clients / 20
        assert compute_adaptive_noise_params(0.01, clients, None)[0] == default_count_std(clients)


# --- 2. the composition claim (Theorem 1), checked without its formula ------------------------------------


def _scaled_shift(
    update: np.ndarray, clip: float, z_delta: float, count_std: float, bit: float
) -> np.ndarray:
    """The neighbour shift of (update sum, centred count) divided coordinate-wise by the noise std."""
    clipped = update * min(1.0, clip / float(np.linalg.norm(update)))
    return np.concatenate([clipped / (z_delta * clip), [(bit - 0.5) / count_std]])


@pytest.mark.parametrize(("z", "count_std"), [(1.0, 0.6), (0.5, 1.0), (1.1, 5.0), (2.0, 1.5)])
def test_pair_sensitivity_over_noise_is_one_over_z(z, count_std):
    # Adding/removing one client moves the update sum by its clipped Δ (‖Δ‖ ≤ C, noise std z_Δ·C per
    # coordinate) and the centred count by b − ½ = ±½ (noise std σ_b). After dividing each block by its
    # std the noise is isotropic N(0, I), so the pair is a Gaussian mechanism with ℓ2 sensitivity
    # max‖shift‖ = 1/z: noise multiplier z.
    rng = np.random.default_rng(1)
    clip = 0.37
    z_delta = update_noise_multiplier(z, count_std)
    sens = []
    for _ in range(2000):
        update = rng.normal(size=6) * rng.uniform(0.01, 3.0) * clip / math.sqrt(6)
        bit = float(np.linalg.norm(update) <= clip)
        sens.append(float(np.linalg.norm(_scaled_shift(update, clip, z_delta, count_std, bit))))
    assert max(sens) <= 1 / z * (1 + 1e-12)
    assert max(sens) == pytest.approx(1 / z, rel=1e-9)  # attained by every clipped update (‖Δ‖ = C)
    # Neither part alone accounts for the whole: the update sum alone would claim multiplier z_Δ > z.
    assert 1 / z_delta < 1 / z * (1 - 1e-3)


def test_pair_privacy_loss_is_that_of_one_gaussian_with_multiplier_z():
    # Monte Carlo of the privacy-loss variable L = log p(y | D) / p(y | D'), y ~ mechanism(D), for a
    # clipped client (the worst case): a Gaussian mechanism with multiplier z has L ~ N(1/(2z²), 1/z²).
    z, count_std, clip, n = 1.0, 0.6, 2.0, 400_000  # z_Δ ≈ 1.81: the count carries much of the loss
    z_delta = update_noise_multiplier(z, count_std)
    rng = np.random.default_rng(2)
    update = np.array([3.0, -1.0, 2.0, 0.5])  # norm > C: clipped, bit = 0
    std = np.concatenate([np.full(4, z_delta * clip), [count_std]])
    shift = np.concatenate([update * clip / np.linalg.norm(update), [0.0 - 0.5]])  # D minus D'
    y = shift + std * rng.standard_normal((n, 5))
    loss = (((y**2) - (y - shift) ** 2) / (2 * std**2)).sum(axis=1)
    assert loss.std() == pytest.approx(1 / z, rel=0.01)
    assert loss.mean() == pytest.approx(1 / (2 * z**2), abs=0.01)


@pytest.mark.parametrize(("z", "count_std"), [(1.0, 0.5), (2.0, 1.0), (3.0, 1.0), (1.0, 0.1)])
def test_count_noise_too_small_raises_one_line(z, count_std):
    with pytest.raises(FedloraError) as err:
        update_noise_multiplier(z, count_std)
    assert "\n" not in str(err.value) and "count noise std" in str(err.value)
    with pytest.raises(ValueError):  # Flower refuses the same inputs (z >= 2σ_b)
        compute_adaptive_noise_params(z, 20, count_std)


@pytest.mark.parametrize(
    ("z", "count_std"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (1.0, -2.0), (math.nan, 1.0)]
)
def test_non_positive_inputs_raise_one_line(z, count_std):
    with pytest.raises(FedloraError) as err:
        update_noise_multiplier(z, count_std)
    assert "\n" not in str(err.value)


# --- 3. next_clip vs Flower's server-side adaptive clipping update ---------------------------------------

CLIP_CASES = [
    # (C, noised unclipped count, K, γ, η)
    (0.1, 3.0, 10, 0.5, 0.2),
    (1.7, 7.3, 10, 0.5, 0.2),
    (0.05, -1.2, 20, 0.3, 0.5),
    (4.0, 23.9, 20, 0.9, 0.1),
    (0.9, 0.0, 8, 1.0, 1.0),
]


@pytest.mark.parametrize(("clip", "count", "clients", "gamma", "lr"), CLIP_CASES)
def test_next_clip_matches_flower_geometric_update(clip, count, clients, gamma, lr):
    # Flower's `aggregate_train` needs whole Messages; its clip update is the method
    # DifferentialPrivacyAdaptiveBase._geometric_update(fraction), called right after
    # _noisy_fraction(count, len(replies)). We give it our b̄ = noised_count / K (Flower's fraction when
    # all K sampled clients reply), i.e. both sides see the same noised count.
    flower = DifferentialPrivacyServerSideAdaptiveClipping(
        FedAvg(), 0.0, clients, initial_clipping_norm=clip, target_clipped_quantile=gamma, clip_norm_lr=lr
    )
    flower._geometric_update(count / clients)
    assert next_clip(clip, count, clients, gamma, lr) == pytest.approx(flower.clipping_norm, rel=1e-14)


def test_flower_noisy_fraction_divides_by_replies_and_does_not_round():
    # With σ_b = 0, Flower's noised fraction is exactly count / len(replies) (a float, never rounded);
    # with all K clients replying that is our b̄ = count / K.
    flower = DifferentialPrivacyServerSideAdaptiveClipping(FedAvg(), 0.0, 12, clipped_count_stddev=0.0)
    assert flower._noisy_fraction(5, 12) == 5 / 12
    flower._geometric_update(flower._noisy_fraction(5, 12))
    assert next_clip(0.1, 5, 12, 0.5, 0.2) == pytest.approx(flower.clipping_norm, rel=1e-14)


def _legacy_round(clip: float, norms: list[float], gamma: float, lr: float) -> float:
    """One noiseless round of Flower's legacy server-side adaptive clipping; returns its new clip."""
    strategy = LegacyServerSideAdaptive(
        LegacyFedAvg(),
        0.0,
        len(norms),
        initial_clipping_norm=clip,
        target_clipped_quantile=gamma,
        clip_norm_lr=lr,
    )
    strategy.current_round_params = [np.zeros(2)]
    results = [
        (None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([np.array([0.6, 0.8]) * n]), 1, {}))
        for n in norms
    ]
    strategy.aggregate_fit(1, results, [])
    return strategy.clipping_norm


def test_flower_counts_clipped_updates_where_the_paper_counts_unclipped():
    # Flower 1.41's bit is "was clipped" (‖Δ‖ > C, strict); the paper's is b = [‖Δ‖ ≤ C]: the
    # same boundary, ‖Δ‖ = C is unclipped in both (0.6² + 0.8² = 1, so norm 5.0 is exact).
    assert adaptive_clip_inputs_inplace([np.array([3.0, 4.0])], 5.0) is False
    assert adaptive_clip_inputs_inplace([np.array([3.0, 4.0])], 4.999) is True
    clip, gamma, lr = 5.0, 0.5, 0.2
    norms = [1.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]  # 2 unclipped (≤ C), 6 clipped
    unclipped = sum(n <= clip for n in norms)
    flower = _legacy_round(clip, norms, gamma, lr)
    # Flower's whole pipeline is our step fed the clipped count, which moves C the wrong way: most
    # updates are clipped, so C should grow; Flower shrinks it.
    assert flower == pytest.approx(next_clip(clip, len(norms) - unclipped, len(norms), gamma, lr), rel=1e-14)
    assert flower < clip < next_clip(clip, unclipped, len(norms), gamma, lr)


def test_geometric_step():
    clip, clients, gamma, lr = 0.8, 40, 0.3, 0.25
    at = lambda frac: next_clip(clip, frac * clients, clients, gamma, lr)  # noqa: E731
    assert at(gamma) == pytest.approx(clip, rel=1e-14)  # b̄ = γ: unchanged
    for d in (0.05, 0.2, -0.15, -0.3):
        factor = at(gamma + d) / clip
        assert at(gamma + 2 * d) / clip == pytest.approx(factor**2, rel=1e-12)  # doubling b̄ − γ squares it
        assert (factor < 1) == (d > 0)  # more unclipped than targeted: C shrinks
    assert at(1.0) / clip == pytest.approx(math.exp(-lr * (1 - gamma)), rel=1e-14)


@pytest.mark.parametrize(
    "args",
    [
        (0.0, 1.0, 10, 0.5, 0.2),
        (1.0, 1.0, 0, 0.5, 0.2),
        (1.0, math.inf, 10, 0.5, 0.2),
        (1.0, 1.0, 10, 1.5, 0.2),
        (1.0, 1.0, 10, 0.5, -0.1),
    ],
)
def test_next_clip_rejects_bad_inputs(args):
    with pytest.raises(FedloraError) as err:
        next_clip(*args)
    assert "\n" not in str(err.value)


# --- 4. the clip tracks the γ-quantile of the update norms -----------------------------------------------


@pytest.mark.parametrize("gamma", [0.2, 0.5, 0.9])
def test_clip_converges_to_target_quantile(gamma):
    # Norms ~ LogNormal(0, 0.5): the γ-quantile is exp(0.5 Φ⁻¹(γ)). Start at the paper's C₀ = 0.1
    # (an order of magnitude off), η = 0.2, K = 500 fresh clients per round, noiseless counts.
    rng = np.random.default_rng(3)
    clients, lr, clip = 500, 0.2, 0.1
    for _ in range(300):
        norms = rng.lognormal(0.0, 0.5, clients)
        clip = next_clip(clip, float(np.sum(norms <= clip)), clients, gamma, lr)
    quantile = math.exp(0.5 * NormalDist().inv_cdf(gamma))
    assert clip == pytest.approx(quantile, rel=0.05)
