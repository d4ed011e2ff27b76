"""The Skellam accountant against independent computations: the exact Rényi divergence between
shifted Skellams (scipy's pmf), the Gaussian limit, the exact sampled-Gaussian RDP of
common/privacy/accounting/rdp.py, a Monte Carlo of the rounding bound, and its own inverse."""

import math

import numpy as np
import pytest
from scipy import stats

from common.privacy.accounting.amplification import subsampled_rdp
from common.privacy.accounting.rdp import eps_from_rdp
from common.privacy.accounting.skellam import (
    SKELLAM_ORDERS,
    integer_sensitivities,
    rounding_norm_bound,
    skellam_curve,
    skellam_epsilon,
    skellam_mu,
    skellam_rdp,
)
from tests.common.privacy.test_amplification import renyi


def exact_skellam_divergence(mu: float, shift: int, order: float) -> float:
    """D_α(Sk(shift, μ) ‖ Sk(0, μ)) summed over the integers from scipy's pmf (Pois(μ/2) − Pois(μ/2)),
    on a window wide enough that widening it changes nothing (asserted)."""

    def on(width: float) -> float:
        half = int(width * math.sqrt(mu)) + 40
        k = np.arange(-half, int(order * shift) + half)
        log_p = stats.skellam.logpmf(k - shift, mu / 2, mu / 2)
        log_q = stats.skellam.logpmf(k, mu / 2, mu / 2)
        assert np.isfinite(log_p).all() and np.isfinite(log_q).all()
        return renyi(order, log_p, log_q)

    value = on(12)
    assert on(15) == pytest.approx(value, rel=1e-9)
    return value


#: μ -> the factor within which the bound stays of the exact divergence at orders ≤ 8, shifts ≤ 5
#: (measured: 6.1 at μ = 3, 3.0 at μ = 10, 1.13 at μ = 50, 1.003 at μ = 500)
TIGHTNESS = {3.0: 6.5, 10.0: 3.0, 50.0: 1.15, 500.0: 1.01}


@pytest.mark.parametrize("mu", sorted(TIGHTNESS))
@pytest.mark.parametrize("shift", [1, 2, 5])
@pytest.mark.parametrize("order", [1.5, 2, 3, 8])
def test_bound_holds_against_the_exact_divergence_and_is_tight(mu, shift, order):
    exact = exact_skellam_divergence(mu, shift, order)
    bound = skellam_rdp(order, mu, shift, shift)  # one dimension: Δ1 = Δ2 = |shift|
    assert exact <= bound * (1 + 1e-9)
    assert bound <= TIGHTNESS[mu] * exact


def test_the_bound_parametrises_by_variance():
    """With the paper's Sk(μ, μ) (variance 2μ) mistaken for ours the bound would fall below the
    exact divergence: at variance 500, shift 5, order 8 the exact value is about 0.1997."""
    assert exact_skellam_divergence(500.0, 5, 8) > skellam_rdp(8, 1000.0, 5, 5)
    samples = stats.skellam.rvs(250, 250, size=200_000, random_state=np.random.default_rng(0))
    assert samples.var() == pytest.approx(500, rel=0.02)


def test_bound_approaches_the_gaussian_rdp():
    for alpha in (2, 8, 32):
        gaps = []
        for mu in (1e2, 1e4, 1e6):
            gauss = alpha * 3.0**2 / (2 * mu)
            bound = skellam_rdp(alpha, mu, 9.0, 3.0)
            assert bound >= gauss
            gaps.append(bound / gauss - 1)
        assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-4


def test_full_sampling_gives_the_base_rdp():
    mu, l1, l2 = 400.0, 60.0, 10.0
    for alpha in (2, 5, 17):
        base = skellam_rdp(alpha, mu, l1, l2)
        assert subsampled_rdp(lambda a: skellam_rdp(a, mu, l1, l2), 1.0, alpha) == pytest.approx(base)
    orders = (2, 3, 10)
    assert np.allclose(skellam_curve(mu, l1, l2, 1.0, orders), skellam_rdp(np.array(orders), mu, l1, l2))


#: μ -> how far above both exact subsampled divergences the per-round curve may sit at orders 2-32
#: (measured: 1.24-1.44 at μ = 10, 1.03-2.29 at μ = 50 (the Skellam bound at α = 32), 1.003 at μ = 500)
RATIO = {10.0: 1.5, 50.0: 2.4, 500.0: 1.01}


@pytest.mark.parametrize(("mu", "shift", "q"), [(10.0, 1, 0.1), (50.0, 3, 0.2), (500.0, 5, 0.05)])
def test_subsampled_skellam_bounds_the_exact_subsampled_divergence(mu, shift, q):
    """In one dimension, both directions of the exact divergence between the Poisson-subsampled
    mixture (1 − q)·Sk(0, μ) + q·Sk(shift, μ) and Sk(0, μ), summed from scipy's pmf, stay below the
    accountant's per-round curve, and within RATIO of it (the Skellam bound's own slack)."""
    half = int(15 * math.sqrt(mu)) + 40
    k = np.arange(-half, 70 * shift + half)
    log_q0 = stats.skellam.logpmf(k, mu / 2, mu / 2)
    log_mix = np.logaddexp(
        math.log1p(-q) + log_q0, math.log(q) + stats.skellam.logpmf(k - shift, mu / 2, mu / 2)
    )
    orders = (2, 3, 5, 8, 16, 32)
    curve = skellam_curve(mu, shift, shift, q, orders)
    for alpha, bound in zip(orders, curve, strict=True):
        exact = max(renyi(alpha, log_mix, log_q0), renyi(alpha, log_q0, log_mix))
        assert exact <= bound * (1 + 1e-9)
        assert bound <= RATIO[mu] * exact


def test_epsilon_composes_and_falls_with_noise():
    l1, l2 = integer_sensitivities(100.0, 1024)
    eps = [skellam_epsilon(mu, l1, l2, 0.1, 50, 1e-5) for mu in (5e3, 1e4, 4e4)]
    assert eps[0] > eps[1] > eps[2] > 0
    assert skellam_epsilon(1e4, l1, l2, 0.1, 0, 1e-5) == 0
    one, many = skellam_curve(1e4, l1, l2, 0.1), skellam_curve(1e4, l1, l2, 0.1) * 50
    assert eps_from_rdp(many, SKELLAM_ORDERS, 1e-5) == pytest.approx(eps[1])
    assert (one > 0).all()


@pytest.mark.parametrize(("target", "q", "rounds"), [(8.0, 0.1, 30), (1.0, 0.01, 200), (3.0, 1.0, 5)])
def test_mu_inverts_epsilon(target, q, rounds):
    l1, l2 = integer_sensitivities(1821.25, 131072)
    mu = skellam_mu(target, l1, l2, q, rounds, 1e-6)
    assert skellam_epsilon(mu, l1, l2, q, rounds, 1e-6) <= target
    assert skellam_epsilon(mu * (1 - 1e-5), l1, l2, q, rounds, 1e-6) > target


def test_integer_sensitivities():
    assert integer_sensitivities(3.0, 1000) == (9.0, 3.0)  # Δ2² < √D·Δ2
    assert integer_sensitivities(100.0, 64) == (800.0, 100.0)  # √D·Δ2 < Δ2²
    rng = np.random.default_rng(1)
    for _ in range(200):  # random integer vectors meet both bounds
        z = rng.integers(-3, 4, size=int(rng.integers(1, 50)))
        norm = float(np.linalg.norm(z))
        if norm:
            assert np.abs(z).sum() <= integer_sensitivities(norm, z.size)[0] + 1e-9


def test_rounding_norm_bound_by_monte_carlo():
    """Rounding a vector of norm c whose coordinates all sit at fractional part 1/2 (the largest
    rounding variance) exceeds the β-bound in at most a β share of draws."""
    rng = np.random.default_rng(2)
    dim, beta, draws = 256, 0.05, 4000
    x = np.floor(rng.normal(0, 2, dim)) + 0.5
    bound = rounding_norm_bound(float(np.linalg.norm(x)), dim, beta)
    rounded = np.floor(x) + (rng.random((draws, dim)) < 0.5)
    failures = float(np.mean(np.linalg.norm(rounded, axis=1) > bound))
    assert failures <= beta
    assert bound < float(np.linalg.norm(x)) + math.sqrt(dim)  # the β term beats the triangle bound here


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: skellam_rdp(2, 0.0, 1, 1), "mu"),
        (lambda: skellam_rdp(2, -1.0, 1, 1), "mu"),
        (lambda: skellam_rdp(1.0, 10.0, 1, 1), "order"),
        (lambda: skellam_rdp(2, 10.0, 1, 2), "l1 sensitivity"),
        (lambda: skellam_epsilon(10.0, 1, 1, 0.1, 3, 0.0), "delta"),
        (lambda: skellam_epsilon(10.0, 1, 1, 0.1, 3, 1.0), "delta"),
        (lambda: skellam_epsilon(10.0, 1, 1, 0.0, 3, 1e-5), "sample rate"),
        (lambda: skellam_epsilon(10.0, 1, 1, 1.5, 3, 1e-5), "sample rate"),
        (lambda: skellam_epsilon(0.0, 1, 1, 0.5, 3, 1e-5), "mu"),
        (lambda: skellam_mu(0.0, 1, 1, 0.1, 3, 1e-5), "epsilon"),
        (lambda: skellam_mu(1.0, 1, 1, 1.1, 3, 1e-5), "sample rate"),
        (lambda: skellam_mu(1.0, 1, 1, 0.1, 3, 2.0), "delta"),
        (lambda: subsampled_rdp(lambda a: a, 0.1, 2.5), "integer order"),
        (lambda: rounding_norm_bound(1.0, 10, 0.0), "beta"),
    ],
)
def test_bad_inputs_raise_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
