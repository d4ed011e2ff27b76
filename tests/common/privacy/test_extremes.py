"""Accountants at the edges of the noise range (issue 14 item 7): every σ > 0 gets an answer, finite
or ∞, never an exception or NaN; ε never grows with σ; a finite ε is the real one (closed forms)."""

import json
import math
import time
from unittest import mock

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from common.privacy.accounting import gdp, pld
from common.privacy.accounting.accountants import Accountant, Event, make_accountant
from common.privacy.accounting.calibration import epsilon_for
from tests.conftest import run_cli

ISSUE = ["--noise-multiplier", "0.12", "--sample-rate", "0.1", "--rounds", "2", "--delta", "1e-6"]


def _accountant(name: str, sigma: float, p: float, count: int) -> Accountant:
    acc = make_accountant(name)
    acc.compose(Event(sigma, p, count))
    return acc


def _answer(acc: Accountant, delta: float) -> float:
    """ε at ``delta``, checked to be an answer: ≥ 0 (not NaN), with δ(ε) a probability."""
    eps = acc.epsilon(delta)
    assert eps >= 0, eps
    assert 0 <= acc.delta(eps) <= 1
    return eps


# --- (a) the issue: CLI and API at σ = 0.12 and a federation at σ = 0.1 -------------------------------


def test_issue_cli_gdp_small_sigma_exits_0_with_the_clt_value(capsys):
    """`fedlora privacy epsilon --accountant gdp` at σ = 0.12 raised OverflowError in delta_for_eps."""
    assert run_cli(["privacy", "epsilon", "--accountant", "gdp", *ISSUE, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    mu = 0.1 * math.sqrt(2 * math.expm1(1 / 0.12**2))
    assert out["mu"] == pytest.approx(mu, rel=1e-12)
    # μ = 1.7e14: δ(ε) = Φ(−y) − φ(y)·R(y + μ) with y = ε/μ − μ/2 and R the Mills ratio; the second
    # term is a fraction ~y/μ of the first, so Φ(−y) = δ and ε = μ·(μ/2 + y)
    assert out["epsilon"] == pytest.approx(mu * mu / 2 + mu * norm.isf(1e-6), rel=1e-12)


@pytest.mark.parametrize("name", ["gdp", "rdp", "pld"])
def test_issue_cli_every_accountant_prints_a_number(name, capsys):
    assert run_cli(["privacy", "epsilon", "--accountant", name, *ISSUE]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("epsilon"))
    shown = float(line.split()[1])  # a number or "inf"
    assert shown == pytest.approx(epsilon_for(name, 0.12, 0.1, 2, 1e-6), rel=1e-5)


@pytest.mark.parametrize("name", ["gdp", "rdp"])
def test_issue_federation_at_sigma_0_1_accounts_every_round(name):
    """The ledger's replay: one event per round at σ = 0.1 (it died at round 2)."""
    acc, spent = make_accountant(name), 0.0
    for _ in range(3):
        acc.compose(Event(0.1, 0.1, 1))
        eps = _answer(acc, 1e-5)
        assert math.isfinite(eps) and eps >= spent
        spent = eps


@pytest.mark.parametrize(
    ("name", "sigma", "p", "count", "delta"),
    [
        ("gdp", 0.12, 0.1, 2, 1e-6),  # OverflowError in delta_for_eps
        ("gdp", 1e300, 0.5, 10, 1e-6),  # OverflowError in sigma**2
        ("rdp", 0.12, 0.5, 1000, 0.5),  # OverflowError in _log_sub (expm1 of a − b > 709)
        ("rdp", 3.0, 1.0, 1, 0.5),  # ε = −0.58: Balle et al.'s conversion, unclamped
        ("rdp", 1e-200, 1.0, 1, 1e-6),  # ZeroDivisionError (σ² = 0)
        ("pld", 1e-200, 0.5, 1, 1e-6),  # ZeroDivisionError (σ² = 0)
        ("pld", 1e300, 0.5, 1, 1e-6),  # OverflowError in s**2
    ],
)
def test_former_failures_answer(name, sigma, p, count, delta):
    _answer(_accountant(name, sigma, p, count), delta)


def test_pld_does_not_return_infinity_where_a_smaller_delta_is_finite():
    """e^{-l} underflowed past 700 nats: ε(1e-6) was ∞ while ε(1e-12) was finite."""
    acc = _accountant("pld", 0.03, 1.0, 1)
    assert acc.epsilon(1e-6) <= acc.epsilon(1e-12) < math.inf


@pytest.mark.parametrize("p", [1 - 2**-52, 1 - 6e-16, 1 - 1e-12, 1 - 1e-7])
def test_pld_rate_within_ulps_of_one_is_the_full_rate(p):
    """dp_accounting's 1 − 1/q cancels to NaN near q = 1: the PLD came out NaN, then IndexError."""
    full = pld.epsilon([(0.1, 1.0, 1)], 0.1, 1e-3)
    assert pld.epsilon([(0.1, p, 1)], 0.1, 1e-3) == pytest.approx(full, rel=1e-6)


def test_rdp_near_half_rate_with_large_noise_is_fast():
    """q = 1/2 makes the fractional-order series decay like i^(-α-1): 14 s per query before."""
    start = time.perf_counter()
    eps = _answer(_accountant("rdp", 1e4, 0.5, 1000), 1e-6)
    assert time.perf_counter() - start < 3.0
    # between its neighbours in q, where the series is short (ε grows with the sampling rate)
    assert _answer(_accountant("rdp", 1e4, 0.45, 1000), 1e-6) <= eps
    assert eps <= _answer(_accountant("rdp", 1e4, 0.55, 1000), 1e-6)


# --- (c) closed forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.3, 0.7, 1.0, 2.0, 5.0])
def test_gdp_one_full_round_matches_the_closed_form(sigma):
    """p = 1, T = 1: μ = sqrt(e^{1/σ²} − 1) and δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)."""
    acc = _accountant("gdp", sigma, 1.0, 1)
    mu = math.sqrt(math.expm1(1 / sigma**2))
    assert acc.mu == pytest.approx(mu, rel=1e-12)
    for eps in (0.0, 0.3, 1.0, 3.0):
        expected = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert acc.delta(eps) == pytest.approx(expected, rel=1e-9)
    for delta in (1e-10, 1e-5, 0.1):
        eps = acc.epsilon(delta)
        assert acc.delta(eps) == pytest.approx(delta, rel=1e-8) if eps > 0 else acc.delta(0.0) <= delta


def _mp_delta(eps: float, mu: float) -> mpmath.mpf:
    """δ(ε) of μ-GDP in 80-digit arithmetic, straight from the definition."""
    with mpmath.workdps(80):
        e, m = mpmath.mpf(eps), mpmath.mpf(mu)
        return mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)


@pytest.mark.parametrize("mu", [1e-3, 0.5, 40.0, 1e4, 1e8])
def test_gdp_delta_matches_high_precision_far_from_the_origin(mu):
    """ε up to μ²/2 = 5e15 nats, where e^ε alone overflows by far."""
    for y in (-3.0, -0.5, 0.0, 0.5, 3.0, 10.0, 30.0):
        eps = mu * (y + mu / 2)
        if eps < 0:
            continue
        expected = float(_mp_delta(eps, mu))
        # ε is a float: y = ε/μ − μ/2 is known to ~ulp(ε/μ), and δ moves by about y·Δy relative
        tol = 1e-10 + 4e-16 * (abs(y) + 1) * (eps / mu + 1)
        assert gdp.delta_for_eps(eps, mu) == pytest.approx(expected, rel=tol, abs=1e-300)


@pytest.mark.parametrize(("sigma", "count"), [(0.02, 1), (0.05, 1), (0.1, 1), (1.0, 100), (3.0, 1)])
def test_pld_full_participation_is_a_tight_upper_bound_on_the_gaussian(sigma, count):
    """p = 1: T rounds are one Gaussian with μ = sqrt(T)/σ, exactly μ-GDP (Dong et al.), so the PLD's
    pessimistic ε is at or above gdp's δ(ε) inverse (up to the PMF's round-off, ~1e-11 relative), and
    close (small σ needs coarser grids)."""
    acc = _accountant("pld", sigma, 1.0, count)
    for delta in (1e-12, 1e-6, 0.1):
        exact = gdp.eps_for_delta(math.sqrt(count) / sigma, delta)
        assert exact * (1 - 1e-9) <= acc.epsilon(delta) <= exact + 1e-3


# --- (b) properties over the whole range ----------------------------------------------------------------


def _log_uniform(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(math.log10(lo), math.log10(hi)).map(lambda x: min(hi, 10.0**x))


SIGMA, RATE, DELTA = _log_uniform(1e-3, 1e4), _log_uniform(1e-6, 1.0), _log_uniform(1e-12, 0.5)
COUNT, GROWTH = st.integers(1, 100_000), st.floats(1.0, 10.0)


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None)


def _assert_monotone(name: str, sigma: float, growth: float, p: float, count: int, delta: float) -> None:
    """ε at σ·growth is not above ε at σ (1e-9 relative slack for grids and round-off)."""
    eps = _answer(_accountant(name, sigma, p, count), delta)
    more_noise = _answer(_accountant(name, sigma * growth, p, count), delta)
    assert more_noise <= eps * (1 + 1e-9) + 1e-12, (eps, more_noise)


@_settings(300)
@given(sigma=SIGMA, growth=GROWTH, p=RATE, count=COUNT, delta=DELTA)
def test_gdp_answers_every_sigma(sigma, growth, p, count, delta):
    acc = _accountant("gdp", sigma, p, count)
    eps = _answer(acc, delta)
    if eps == math.inf:  # only when ε ≈ μ²/2 is past the float range
        assert acc.mu * acc.mu / 2 == math.inf
    else:  # the finite ε is the root: δ crosses the target within a relative 1e-6 of it
        assert acc.delta(eps * (1 + 1e-6) + 1e-9) <= delta
        assert eps == 0 or acc.delta(max(0.0, eps * (1 - 1e-6) - 1e-9)) >= delta
    _assert_monotone("gdp", sigma, growth, p, count, delta)


@_settings(60)
@given(sigma=SIGMA, growth=GROWTH, p=RATE, count=COUNT, delta=DELTA)
def test_rdp_answers_every_sigma(sigma, growth, p, count, delta):
    acc = _accountant("rdp", sigma, p, count)
    eps = _answer(acc, delta)
    assert math.isfinite(eps)  # RDP ≤ α/(2σ²) per round: finite for σ ≥ 1e-3
    assert acc.delta(eps * (1 + 1e-9) + 1e-12) <= delta  # the same bound, inverted
    _assert_monotone("rdp", sigma, growth, p, count, delta)


@_settings(16)
@given(sigma=SIGMA, growth=GROWTH, p=RATE, count=COUNT, delta=DELTA)
def test_pld_answers_every_sigma(sigma, growth, p, count, delta):
    """On a 2^16-point budget (the properties do not depend on it): each example stays well under a
    second, and small σ exercises the coarser-grid fallback and the ∞ beyond it."""
    with mock.patch.object(pld, "MAX_GRID_POINTS", 1 << 16):
        acc = _accountant("pld", sigma, p, count)
        eps = _answer(acc, delta)
        if eps < math.inf:
            assert acc.delta(eps) <= delta * (1 + 1e-6)
            if p == 1.0:  # an upper bound on the exact Gaussian
                assert eps >= gdp.eps_for_delta(math.sqrt(count) / sigma, delta) * (1 - 1e-9)
        _assert_monotone("pld", sigma, growth, p, count, delta)


def test_a_refusal_prints_its_two_numbers_apart():
    """A budget refusal never reads "0.001 > 0.001": the digits grow until the two differ."""
    from client.node.policy import NodePolicy, planned_client_epsilon
    from common.errors import FedloraError
    from common.presets import preset
    from common.privacy.accounting.report import apart

    assert apart(0.0010004, 0.001) == ("0.0010004", "0.001")
    assert apart(12.3, 8.0) == ("12.3", "8")
    cfg = preset("minilm-rt", mechanism="dp-fedavg", threat_model="central", noise_multiplier=40.0, rounds=1)
    planned = planned_client_epsilon(cfg.check())
    budget = planned * (1 - 3e-6)  # refused (tolerance 1e-6), equal to 4 significant digits
    assert f"{planned:.4g}" == f"{budget:.4g}"
    with pytest.raises(FedloraError) as err:
        NodePolicy(client_epsilon=budget, trust="server").check_run(cfg.check())
    shown, limit = err.value.args[0].split("epsilon ", 1)[1].split(" > this node's budget ")
    assert float(shown) > float(limit.split()[0])  # as printed, the refusal reads true
