"""Poisson amplification of RDP (common/privacy/accounting/amplification.py) against independent computations:
the exact sampled-Gaussian RDP (dp_accounting's and common/privacy/accounting/rdp.py's series), exact
divergences of random discrete pairs in both directions, the add-direction certificate's pointwise
inequality at random points, and Zhu & Wang's general bound where no certificate passes."""

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import special

from common.privacy.accounting import amplification
from common.privacy.accounting.amplification import add_certificate, subsampled_rdp
from common.privacy.accounting.rdp import rdp_subsampled_gaussian
from common.privacy.accounting.skellam import SKELLAM_ORDERS


def renyi(order: int, log_p: np.ndarray, log_q: np.ndarray) -> float:
    """D_α(P ‖ Q) of two pmfs given as logs on one support."""
    return float(special.logsumexp(order * log_p + (1 - order) * log_q)) / (order - 1)


def random_pair(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two random log-pmfs on 2-6 points, far from any Gaussian pair."""
    size = int(rng.integers(2, 7))
    concentration = np.full(size, rng.uniform(0.2, 3))
    return np.log(rng.dirichlet(concentration)), np.log(rng.dirichlet(concentration))


@pytest.mark.parametrize("q", [0.001, 0.01, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("sigma", [0.7, 1.0, 2.0])
def test_amplification_of_the_gaussian_curve_is_the_exact_sampled_gaussian(q, sigma):
    """Applied to the Gaussian curve α/(2σ²) the bound is the exact sampled-Gaussian RDP (Mironov,
    Talwar & Zhang): common/privacy/accounting/rdp.py's series and dp_accounting's, computed independently."""
    orders = (2, 3, 5, 10, 32, 64)
    ours = [subsampled_rdp(lambda a, s=sigma: a / (2 * s * s), q, alpha) for alpha in orders]
    theirs = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)
    series = [rdp_subsampled_gaussian(q, sigma, alpha) for alpha in orders]
    assert ours == pytest.approx(list(theirs), rel=1e-9, abs=1e-15)
    assert ours == pytest.approx(series, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("q", [0.001, 0.01, 0.1, 0.5])
def test_a_certificate_passes_at_every_accountant_order(q):
    assert all(add_certificate(q, alpha) is not None for alpha in SKELLAM_ORDERS)


@pytest.mark.parametrize(("q", "alpha"), [(0.1, 2), (0.1, 32), (0.1, 256), (0.5, 8), (0.999, 64)])
def test_the_certificate_holds_pointwise_at_random_points(q, alpha):
    """f ≤ λ·g1 + (1 − λ)·g2 + c(L − 1) at 20,000 random L in [e^-30, e^30] off the checking grid,
    evaluated directly; neither direction alone (λ = 1 or 0) would pass."""
    lam = add_certificate(q, alpha)
    assert lam is not None and 0 < lam < 1
    log_l = np.random.default_rng(alpha).uniform(-30, 30, 20_000)
    with np.errstate(over="ignore"):
        big_l = np.exp(log_l)
        f = (1 - q + q * big_l) ** (1 - alpha)
        g1 = (1 - q + q * big_l) ** alpha
        g2 = big_l * (1 - q + q / big_l) ** alpha
        c = (1 - alpha) * q - lam * alpha * q - (1 - lam) * (1 - alpha * q)
        right = lam * g1 + (1 - lam) * g2 + c * (big_l - 1)
    assert np.all(f <= right * (1 + 1e-9) + 1e-12)
    assert amplification._certificate_margin(q, alpha, 1.0) < 0
    assert amplification._certificate_margin(q, alpha, 0.0) < 0


#: sampling rates of the random-pair property test (a few, so each certificate is computed once)
RATES = (0.01, 0.05, 0.1, 0.3, 0.5, 0.9, 0.99)


@pytest.mark.parametrize(("q", "alpha"), [(0.1, 3), (0.1, 40), (0.5, 8), (0.01, 256)])
def test_the_certificate_touches_at_l_1_to_fourth_order(q, alpha):
    """In 50-digit arithmetic (mpmath), h(1 + e) = h⁗(1)e⁴/24 to leading order, with the closed form
    h⁗(1) = 4α(α − 1)(2α − 1)q³(1 − q) > 0, on both sides of L = 1: the Taylor argument that
    add_certificate's λ rests on, checked independently of its float grid."""
    import mpmath

    mpmath.mp.dps = 50
    lam = add_certificate(q, alpha)
    assert lam == pytest.approx(3 * (1 - q) / (3 + 2 * q * (alpha - 2)))
    qm, lm = mpmath.mpf(q), mpmath.mpf(lam)
    c = (1 - alpha) * qm - (lm * alpha * qm + (1 - lm) * (1 - alpha * qm))

    def h(big_l):
        u = 1 - qm + qm * big_l
        g2 = big_l * (1 - qm + qm / big_l) ** alpha
        return lm * u**alpha + (1 - lm) * g2 + c * (big_l - 1) - u ** (1 - alpha)

    fourth = 4 * alpha * (alpha - 1) * (2 * alpha - 1) * qm**3 * (1 - qm)
    for e in (mpmath.mpf("1e-4"), mpmath.mpf("-1e-4")):
        assert float(h(1 + e) / (fourth * e**4 / 24)) == pytest.approx(1.0, rel=0.05)


def test_amplification_bounds_both_directions_for_any_pair():
    """For random pmfs P, Q with ε(ℓ) = max(D_ℓ(P‖Q), D_ℓ(Q‖P)), both D_α(R‖Q) and D_α(Q‖R) of the
    mixture R = (1 − q)Q + qP stay under the bound, some pair comes within 1 % of it, and the add
    direction stays under its certificate's combination of the two remove directions."""
    rng = np.random.default_rng(20261127)
    closest = math.inf
    for _ in range(3000):
        log_p, log_q = random_pair(rng)
        q, alpha = float(rng.choice(RATES)), int(rng.integers(2, 9))

        def curve(orders: np.ndarray, lp=log_p, lq=log_q) -> np.ndarray:
            return np.array([max(renyi(int(a), lp, lq), renyi(int(a), lq, lp)) for a in orders])

        bound = subsampled_rdp(curve, q, alpha)
        log_r = np.logaddexp(math.log1p(-q) + log_q, math.log(q) + log_p)
        add, remove = renyi(alpha, log_q, log_r), renyi(alpha, log_r, log_q)
        assert max(add, remove) <= bound * (1 + 1e-9) + 1e-12
        swapped = renyi(alpha, np.logaddexp(math.log1p(-q) + log_p, math.log(q) + log_q), log_p)
        lam = add_certificate(q, alpha)
        combined = lam * math.exp((alpha - 1) * remove) + (1 - lam) * math.exp((alpha - 1) * swapped)
        assert math.exp((alpha - 1) * add) <= combined * (1 + 1e-9)
        closest = min(closest, bound / max(add, remove, 1e-300))
    assert closest < 1.01


def test_without_a_certificate_zhu_and_wangs_factor_3_comes_back(monkeypatch):
    """Where no λ passes, α = 3 gives Zhu & Wang's Theorem 6 written out by hand."""
    q, e2, e3 = 0.2, 0.3, 0.5

    def curve(orders: np.ndarray) -> np.ndarray:
        return np.array([{2: e2, 3: e3}[int(a)] for a in orders])

    tight = subsampled_rdp(curve, q, 3)
    monkeypatch.setattr(amplification, "add_certificate", lambda q, alpha: None)
    general = subsampled_rdp(curve, q, 3)
    by_hand = (1 - q) ** 2 * (1 + 2 * q) + 3 * q * q * (1 - q) * math.exp(e2) + 3 * q**3 * math.exp(2 * e3)
    assert general == pytest.approx(math.log(by_hand) / 2, rel=1e-12)
    assert tight == pytest.approx(math.log(by_hand - 2 * q**3 * math.exp(2 * e3)) / 2, rel=1e-12)
