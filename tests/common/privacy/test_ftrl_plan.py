"""The correlated-noise plan (common/privacy/planning/ftrl_plan.py): its charges against dp_accounting composed
directly, the analytic Gaussian (Balle & Wang 2018) and today's DP-FedAvg plan."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy.optimize import brentq
from scipy.stats import norm

from common.privacy.accounting.accountants import Event
from common.privacy.accounting.calibration import BUDGET_ACCOUNTANTS, calibrate_sigma, events_epsilon
from common.privacy.planning.factorization import prefix_sensitivities
from common.privacy.planning.ftrl_plan import FtrlPlan, Target, plan_ftrl, workload_name


def _dp_accounting_epsilon(sigma: float, q: float, count: int, delta: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    event = dp_accounting.GaussianDpEvent(sigma)
    acc.compose(event if q >= 1 else dp_accounting.PoissonSampledDpEvent(q, event), count)
    return acc.get_epsilon(delta)


def _analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε of one Gaussian of multiplier σ at δ: δ(ε) = Φ(1/2σ − εσ) − e^ε Φ(−1/2σ − εσ) (Balle & Wang
    2018, Thm 8), solved for ε."""

    def excess(eps: float) -> float:
        return (
            norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma) - delta
        )

    return brentq(excess, 1e-9, 200.0)


def test_one_band_cyclic_poisson_is_dp_fedavg():
    """b = 1: the same σ as DP-FedAvg's calibration and one Poisson-sampled Gaussian every round."""
    plan = plan_ftrl("cyclic-poisson", 30, 0.1, Target(8.0, 1e-6), bands=1)
    fedavg = max(calibrate_sigma(a, 8.0, 1e-6, 0.1, 30) for a in BUDGET_ACCOUNTANTS)
    assert plan.coefs == (1.0,) and plan.sigma == fedavg
    assert all(plan.events(t) == (Event(fedavg, 0.1, 1),) for t in range(30))


@pytest.mark.parametrize("bands", [2, 5, 10])
def test_cyclic_poisson_charges_one_sampled_gaussian_per_cycle(bands):
    """⌈(t+1)/b⌉ events at q = b·p after every round t, and ε as dp_accounting composes them."""
    plan = plan_ftrl("cyclic-poisson", 60, 0.1, Target(4.0, 1e-6), bands=bands)
    assert plan.q == pytest.approx(bands * 0.1)
    for t in range(60):
        assert sum(e.count for s in range(t + 1) for e in plan.events(s)) == math.ceil((t + 1) / bands)
    direct = _dp_accounting_epsilon(plan.sigma, plan.q, math.ceil(60 / bands), 1e-6)
    assert plan.epsilon(60) == pytest.approx(direct, rel=2e-3)
    assert plan.epsilon(60) <= 4.0


def test_cyclic_poisson_refuses_more_bands_than_the_rate_allows():
    with pytest.raises(ValueError, match="bands x rate"):
        plan_ftrl("cyclic-poisson", 30, 0.2, Target(4.0, 1e-6), bands=6)


def test_min_sep_charges_each_participation_and_the_worst_client_is_one_gaussian():
    """Each participation charges its client one Gaussian of σ at p = 1; the worst client's k of them
    are one Gaussian of σ/sens, sens² the min-sep sensitivity of C (k unit columns)."""
    plan = plan_ftrl("min-sep", 40, 0.25, Target(3.0, 1e-6))
    assert plan.bands == 4 and plan.per_client and plan.participations == 10
    assert all(plan.events(t) == (Event(plan.sigma, 1.0, 1),) for t in range(40))
    sens2 = prefix_sensitivities(np.asarray(plan.coefs), 40, plan.min_sep, plan.participations)[-1]
    assert sens2 == pytest.approx(10.0)
    one = plan.sigma / math.sqrt(sens2)
    assert plan.epsilon(40) == pytest.approx(_analytic_gaussian_epsilon(one, 1e-6), rel=2e-3)
    assert plan.accountants == ("pld",) and plan.epsilon(40) <= 3.0
    assert plan.epsilon(40) > 2.99  # and σ is not larger than it needs


@pytest.mark.parametrize(("rho", "eps"), [(0.1507, 3.42), (0.01434, 0.994)])
def test_gboard_production_points(rho, eps):
    """Gboard's BandMF accounting notebook (google-research/federated mf_dpftrl_matrices): ρ-zCDP of
    one Gaussian, σ_eff = 1/√(2ρ), at δ 1e-10: es-ES ε 3.42, pt-BR ε 0.994."""
    sigma = 1 / math.sqrt(2 * rho)
    assert _analytic_gaussian_epsilon(sigma, 1e-10) == pytest.approx(eps, abs=6e-3)
    assert events_epsilon("pld", [Event(sigma, 1.0, 1)], 1e-10) == pytest.approx(eps, abs=6e-3)


def test_the_workload_follows_the_server_optimizer():
    assert workload_name("sgd", 0.9) == "sgd"
    assert workload_name("momentum", 0.9) == "momentum 0.9"
    assert workload_name("adam", 0.9) == "sgd"  # post-processing: the prefix sum's strategy
    plan = plan_ftrl("min-sep", 30, 0.1, Target(8.0, 1e-6), work="momentum 0.9")
    sgd = plan_ftrl("min-sep", 30, 0.1, Target(8.0, 1e-6))
    assert plan.coefs != sgd.coefs
    assert plan.guarantee.startswith("min-separation 10")


def test_a_plan_refuses_an_unknown_rule():
    with pytest.raises(ValueError, match="unknown participation rule"):
        plan_ftrl("balls-in-bins", 30, 0.1, Target(8.0, 1e-6))
    assert isinstance(plan_ftrl("min-sep", 10, 0.5, Target(8.0, 1e-6)), FtrlPlan)
    assert np.isfinite(plan_ftrl("min-sep", 10, 0.5, Target(8.0, 1e-6)).error)


@pytest.mark.parametrize(
    ("bands", "sigma", "jax"), [(1, 1.383, 7.992), (5, 2.684, 8.011), (10, 3.578, 7.990)]
)
def test_cyclic_poisson_epsilon_agrees_with_jax_privacys_accountant(bands, sigma, jax):
    """jax_privacy 2.0.0 ``DpsgdTrainingAccountant`` with ``cycle_length = b`` (issue 51: ε 7.992 /
    8.011 / 7.990 at 300 rounds, p 0.1, δ 1e-6), at the σ a PLD search calibrated for ε 8 (given to 3
    decimals, hence the tolerance)."""
    plan = FtrlPlan(
        "cyclic-poisson", (1.0,) + (0.0,) * (bands - 1), sigma, 0.1, 300, 1e-6, 8.0
    )  # events only
    assert plan.epsilon(300) == pytest.approx(jax, abs=0.02)
