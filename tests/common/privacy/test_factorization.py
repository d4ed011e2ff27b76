"""Banded Toeplitz factorization (common/privacy/planning/factorization.py) and its streaming noise
(common/privacy/mechanisms/banded_noise.py), each against an independent computation: dense matrices, brute
force over participation patterns, and jax_privacy's optimized coefficients."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.linalg import solve_triangular

from common.privacy.mechanisms.banded_noise import BandedNoise, standard_normal
from common.privacy.planning.factorization import (
    column_norms_squared,
    inverse_coefs,
    mean_error,
    minsep_sensitivity_squared,
    optimize_banded,
    per_query_error,
    prefix_sensitivities,
    toeplitz,
    workload,
)

#: jax_privacy 2.0.0 ``toeplitz.optimize_banded_toeplitz(n, bands)`` (mean error, prefix sums, unit
#: norm), run once in a throwaway environment (jax is not a dependency)
JAX_COEFS = {
    (30, 2): [0.8329, 0.5534],
    (30, 5): [0.7430, 0.4329, 0.3429, 0.2884, 0.2447],
    (30, 10): [0.7303, 0.3869, 0.2962, 0.2475, 0.2148, 0.1899, 0.1697, 0.1524, 0.1370, 0.1224],
    (300, 2): [0.7702, 0.6378],
    (300, 5): [0.6026, 0.4581, 0.4119, 0.3776, 0.3387],
    (300, 10): [0.5619, 0.3705, 0.3221, 0.2959, 0.2775, 0.2626, 0.2493, 0.2364, 0.2225, 0.2054],
}


def _dense_error(coefs, work) -> np.ndarray:
    n = len(work)
    ac = toeplitz(work, n) @ np.linalg.inv(toeplitz(np.asarray(coefs), n))
    return (ac**2).sum(1)


def test_the_inverse_and_the_error_are_the_dense_matrices():
    c = np.array([0.7, 0.5, 0.3, 0.2])
    c /= np.linalg.norm(c)
    np.testing.assert_allclose(toeplitz(inverse_coefs(c, 40), 40), np.linalg.inv(toeplitz(c, 40)), atol=1e-12)
    for work in (workload("sgd", 40), workload("momentum", 40, 0.9)):
        np.testing.assert_allclose(per_query_error(c, work), _dense_error(c, work), rtol=1e-10)


@pytest.mark.parametrize(("n", "bands"), sorted(JAX_COEFS))
def test_the_optimizer_matches_jax_privacys_strategy(n, bands):
    ours = optimize_banded(n, bands)
    jax = np.asarray(JAX_COEFS[(n, bands)])
    work = workload("sgd", n)
    assert np.linalg.norm(ours) == pytest.approx(1.0)
    assert mean_error(ours, work) <= 1.005 * mean_error(jax / np.linalg.norm(jax), work)
    np.testing.assert_allclose(ours, jax, atol=2e-3)


def test_the_noise_rmse_against_independent_noise_is_the_issues():
    """RMSE of the trajectory, banded(10) over C = I at the same sensitivity: 0.52 / 0.37 for server
    SGD over 30 / 300 rounds, 0.40 / 0.32 for momentum 0.9 (each strategy optimized for its own)."""
    for kind, beta, n, ratio in [
        ("sgd", 0, 30, 0.519),
        ("sgd", 0, 300, 0.366),
        ("momentum", 0.9, 30, 0.398),
        ("momentum", 0.9, 300, 0.324),
    ]:
        work = workload(kind, n, beta)
        c = optimize_banded(n, 10, work)
        assert (mean_error(c, work) / mean_error(np.ones(1), work)) ** 0.5 == pytest.approx(ratio, abs=2e-3)


def _brute_sensitivity(matrix: np.ndarray, min_sep: int, k: int) -> float:
    """max ‖C u‖² over u with ≤ k entries ±1 at rows min_sep apart (every pattern, every sign)."""
    n, best = matrix.shape[1], 0.0
    for size in range(1, k + 1):
        for pattern in itertools.combinations(range(n), size):
            if any(b - a < min_sep for a, b in itertools.pairwise(pattern)):
                continue
            for signs in itertools.product((1.0, -1.0), repeat=size):
                u = np.zeros(n)
                u[list(pattern)] = signs
                best = max(best, float(((matrix @ u) ** 2).sum()))
    return best


@pytest.mark.parametrize(
    ("n", "bands", "min_sep", "k"), [(10, 1, 1, 3), (11, 2, 2, 4), (12, 3, 3, 3), (12, 3, 4, 4), (9, 4, 4, 2)]
)
def test_minsep_sensitivity_is_the_brute_force_maximum(n, bands, min_sep, k):
    """A random banded lower-triangular C (any entries, ≤ ``bands`` bands, not Toeplitz)."""
    rng = np.random.default_rng(n * 100 + bands)
    band = np.tril(np.ones((n, n))) * (np.subtract.outer(np.arange(n), np.arange(n)) < bands)
    matrix = rng.standard_normal((n, n)) * band
    norms = (matrix**2).sum(0)
    assert minsep_sensitivity_squared(norms, min_sep, k) == pytest.approx(
        _brute_sensitivity(matrix, min_sep, k)
    )


def test_rounds_one_short_of_the_separation_are_not_both_counted():
    assert minsep_sensitivity_squared(np.ones(2), 2, 2) == 1.0
    assert minsep_sensitivity_squared(np.ones(3), 2, 2) == 2.0


def test_column_norms_and_prefix_sensitivities_of_a_toeplitz_strategy():
    c = optimize_banded(40, 4)
    np.testing.assert_allclose(column_norms_squared(c, 40), (toeplitz(c, 40) ** 2).sum(0), rtol=1e-12)
    sens = prefix_sensitivities(c, 40, 4, 10)
    assert sens[-1] == pytest.approx(10.0)  # k = 40/4 full unit columns
    assert np.all(np.diff(sens) >= -1e-15)
    with pytest.raises(ValueError, match="exceed the min-sep"):
        prefix_sensitivities(c, 40, 3, 14)


def test_the_stream_is_the_dense_solve_and_resumes_from_its_state():
    c = optimize_banded(64, 5)
    gen = np.random.default_rng(0)
    z = gen.standard_normal((64, 7))
    dense = solve_triangular(toeplitz(c, 64), z, lower=True)
    stream, out = BandedNoise(c), []
    for t in range(64):
        if t == 23:  # a checkpoint round-trip mid-stream
            stream = BandedNoise.from_tensors(c, dict(stream.tensors()))
        out.append(stream.next({"x": torch.from_numpy(z[t])})["x"].numpy())
    np.testing.assert_allclose(np.stack(out), dense, atol=1e-12)
    assert stream.index == 64 and len(stream.past) == 4


def test_the_streams_covariance_is_c_inverse_c_inverse_transposed():
    """20,000 streams of 8 rounds (one coordinate each) from the OS-entropy draws themselves."""
    c = np.array([0.8, 0.5, 0.33])
    c /= np.linalg.norm(c)
    stream = BandedNoise(c)
    rows = np.stack([stream.next(standard_normal({"x": (20000,)}))["x"].numpy() for _ in range(8)])
    inv = np.linalg.inv(toeplitz(c, 8))
    expected = inv @ inv.T
    # the std of a covariance estimate is about sqrt((s_ii s_jj + s_ij²) / N): 6 of them
    tol = 6 * np.sqrt((np.outer(np.diag(expected), np.diag(expected)) + expected**2) / 20000)
    assert np.all(np.abs(np.cov(rows) - expected) < tol)


def test_a_stream_refuses_a_state_it_cannot_have():
    with pytest.raises(ValueError, match="c_0 > 0"):
        BandedNoise([0.0, 1.0])
    with pytest.raises(ValueError, match="past outputs"):
        BandedNoise([0.8, 0.6], index=0, past=[{"x": torch.zeros(1)}])
