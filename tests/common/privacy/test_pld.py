"""common.privacy.accounting.pld against dp_accounting's PLDAccountant, which it ports; and its import cost."""

import subprocess
import sys
from pathlib import Path

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from common.privacy.accounting import pld

# (events, discretization): dense and sparse PMFs, p = 1 (plain Gaussian), both grids.
CASES = [
    ([(0.5, 0.01, 1000)], 1e-3),
    ([(0.5, 0.1, 10)], 1e-3),
    ([(0.8, 0.001, 1000)], 1e-4),
    ([(0.8, 0.5, 10)], 1e-3),
    ([(1.0, 0.01, 1000)], 1e-4),
    ([(1.0, 0.1, 1)], 1e-4),
    ([(1.0, 1.0, 10)], 1e-4),
    ([(2.0, 0.1, 1000)], 1e-4),
    ([(2.0, 0.5, 1)], 1e-3),
    ([(5.0, 1.0, 1000)], 1e-3),
    ([(5.0, 0.001, 1)], 1e-3),  # sparse single event
    ([(5.0, 0.001, 3)], 1e-3),  # sparse self-composition (9 points, 9**3 <= 1000)
    ([(5.0, 0.001, 10)], 1e-4),  # sparse event, dense self-composition
    ([(5.0, 0.01, 1000)], 1e-3),
    ([(1.0, 0.01, 10000)], 1e-4),
    ([(1.0, 0.01, 500), (2.0, 0.05, 300), (0.8, 0.001, 1000)], 1e-4),
    ([(0.7, 1.0, 20), (1.5, 0.02, 2000), (5.0, 0.001, 2), (3.0, 0.2, 5)], 1e-3),
]
DELTAS = (1e-5, 1e-8)
EPSILONS = (0.5, 1.0, 2.0)


def _dp_accounting(events, discretization):
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)
    for sigma, p, count in events:
        event = dp_event.GaussianDpEvent(sigma)
        acc.compose(event if p == 1 else dp_event.PoissonSampledDpEvent(p, event), count)
    return acc


@pytest.mark.parametrize(("events", "discretization"), CASES)
def test_matches_dp_accounting(events, discretization):
    ref = _dp_accounting(events, discretization)
    for delta in DELTAS:
        assert pld.epsilon(events, delta, discretization) == pytest.approx(ref.get_epsilon(delta), rel=1e-6)
    for eps in EPSILONS:
        expected = ref.get_delta(eps)
        if expected > 1e-12:
            assert pld.delta(events, eps, discretization) == pytest.approx(expected, rel=1e-6)


def test_edge_cases():
    assert pld.epsilon([(1.0, 0.01, 0), (1.0, 0.01, 10)], 1e-5) == pld.epsilon([(1.0, 0.01, 10)], 1e-5)
    for bad in ([], [(1.0, 0.01, 0)], [(0.0, 0.01, 10)], [(1.0, 0.0, 10)], [(1.0, 0.01, -1)]):
        with pytest.raises(ValueError):
            pld.epsilon(bad, 1e-5)


def test_import_is_light():
    heavy = ["dp_accounting", "scipy.stats", "scipy.signal", "scipy.optimize"]
    code = f"import sys, common.privacy.accounting.pld; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[3],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_tiny_noise_is_no_guarantee_not_out_of_memory():
    """σ → 0 would need ~1e15 grid points (dp_accounting runs out of memory): ε = ∞, δ = 1."""
    import time

    from common.privacy.accounting.accountants import Event, PldAccountant

    acc = PldAccountant()
    acc.compose(Event(1e-6, 0.016, 25))
    start = time.perf_counter()
    assert acc.epsilon(1e-5) == float("inf") and acc.delta(1.0) == 1.0
    assert time.perf_counter() - start < 1.0
