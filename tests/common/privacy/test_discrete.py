"""The integer encoding for secure aggregation: rotation, conditional rounding, Skellam shares, the
modular sum, overflow detection and an end-to-end cohort of 50 clients."""

import math

import numpy as np
import pytest
import scipy.linalg
import torch
from scipy import stats

from common.privacy.accounting.skellam import integer_sensitivities, rounding_norm_bound, skellam_mu
from common.privacy.mechanisms import discrete
from common.privacy.mechanisms.discrete import (
    choose_bits,
    clip_l2,
    conditional_round,
    decode,
    decode_limit,
    encode,
    hadamard_transform,
    modular_sum,
    padded_dim,
    rotate,
    rotated_linf_bound,
    rotation_signs,
    skellam_noise,
    unrotate,
    unwrap,
    wrap,
)


def test_hadamard_transform_matches_the_matrix():
    x = torch.randn(64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    expected = torch.from_numpy(scipy.linalg.hadamard(64).astype(np.float64)) @ x
    assert torch.allclose(hadamard_transform(x), expected, atol=1e-12)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard_transform(torch.zeros(12))


def test_signs_are_public_and_seeded():
    signs = rotation_signs(b"round 7", 1000)
    assert signs.shape == (1024,) and padded_dim(1000) == 1024 and padded_dim(1024) == 1024
    assert set(signs.tolist()) == {-1.0, 1.0} and abs(float(signs.sum())) < 4 * math.sqrt(1024)
    assert torch.equal(signs, rotation_signs(b"round 7", 1000))
    assert not torch.equal(signs, rotation_signs(b"round 8", 1000))


def test_rotation_preserves_the_norm_and_inverts():
    x = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    signs = rotation_signs(b"seed", 1000)
    y = rotate(x, signs)
    assert y.shape == (1024,)
    assert float(y.norm()) == pytest.approx(float(x.norm()), rel=1e-12)
    assert torch.allclose(unrotate(y, signs, 1000), x, atol=1e-12)


def test_long_vectors_rotate_block_by_block():
    """Past ROTATION_BLOCK coordinates, D is the next multiple of the block, the rotation is
    orthogonal and inverts, and a spike spreads over its own block only."""
    dim = 3 * discrete.ROTATION_BLOCK + 5
    assert padded_dim(dim) == 4 * discrete.ROTATION_BLOCK and padded_dim(74_000) == 77_824
    x = torch.randn(dim, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    signs = rotation_signs(b"blocks", dim)
    y = rotate(x, signs)
    assert y.shape == (4 * discrete.ROTATION_BLOCK,)
    assert float(y.norm()) == pytest.approx(float(x.norm()), rel=1e-12)
    assert torch.allclose(unrotate(y, signs, dim), x, atol=1e-12)
    spike = torch.zeros(dim, dtype=torch.float64)
    spike[discrete.ROTATION_BLOCK + 9] = 2.0
    spread = rotate(spike, signs).reshape(4, -1).abs()
    block = discrete.ROTATION_BLOCK
    assert torch.allclose(spread[1], torch.full((block,), 2.0 / math.sqrt(block), dtype=torch.float64))
    assert not spread[[0, 2, 3]].any()
    assert float(y.abs().max()) <= rotated_linf_bound(float(x.norm()), dim, 1e-6)


def test_rotation_spreads_a_spike():
    """A one-hot vector of norm c becomes ±c/√D everywhere; a dense Gaussian one stays within
    the Hoeffding bound."""
    signs = rotation_signs(b"spike", 4096)
    spike = torch.zeros(4096, dtype=torch.float64)
    spike[17] = 3.0
    assert torch.allclose(rotate(spike, signs).abs(), torch.full((4096,), 3.0 / 64, dtype=torch.float64))
    dense = torch.randn(4096, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert float(rotate(dense, signs).abs().max()) <= rotated_linf_bound(float(dense.norm()), 4096, 1e-6)


@pytest.mark.parametrize(
    ("norm", "dtype"),
    [
        (0.0, torch.float64),
        (0.3, torch.float64),
        (0.7, torch.float64),
        (5.0, torch.float32),
        (3e38, torch.float32),
    ],
)
def test_clip_l2_scales_only_what_lies_outside_the_clip(norm, dtype):
    """Clip C = 0.7: a zero vector stays zero (no nan), one inside (or on) the ball is unchanged, one
    outside is scaled onto it, float64 (n,) whatever the input's dtype and shape; against numpy."""
    clip = 0.7
    direction = np.random.default_rng(4).normal(size=(6, 5))
    x = torch.from_numpy(direction * (norm / np.linalg.norm(direction))).to(dtype)
    flat = x.numpy().astype(np.float64).reshape(-1)
    size = np.linalg.norm(flat)
    want = flat * min(1.0, clip / size) if size > 0 else flat
    got = clip_l2(x, clip)
    assert got.dtype == torch.float64 and got.shape == (30,)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=0)
    assert np.linalg.norm(got.numpy()) == pytest.approx(min(size, clip), rel=1e-12)
    assert bool((got == 0).all()) == (norm == 0)  # (allclose above: no nan either)


def test_conditional_rounding():
    x = torch.linspace(-3.3, 4.7, 256, dtype=torch.float64)
    bound = rounding_norm_bound(float(x.norm()), 256, 1e-3)
    z = conditional_round(x, bound)
    assert z.dtype == np.int64 and np.all(np.abs(z - x.numpy()) < 1)
    assert np.linalg.norm(z) <= bound
    draws = np.stack([conditional_round(x, bound) for _ in range(400)])
    # unbiased: 6 sd of a mean of 400 draws (sd <= 0.025), so the max over 256 coordinates flakes ~1e-6
    assert np.abs(draws.mean(axis=0) - x.numpy()).max() < 0.15
    assert not all(np.array_equal(draws[0], d) for d in draws[1:])  # fresh OS-seeded randomness


def test_conditional_rounding_enforces_the_bound_or_raises():
    x = np.full(64, 0.5)
    for _ in range(20):
        z = conditional_round(x, 6.0)  # ‖z‖² = number of coordinates rounded up: ≤ 36 in 84 % of tries
        assert int(np.square(z).sum()) <= 36
    with pytest.raises(ValueError, match="no vector with L2 norm <= 2"):
        conditional_round(x, 2.0, max_tries=5)  # needs ≤ 4 of 64 coins up: ~1e-13 per try
    with pytest.raises(ValueError, match="finite"):
        conditional_round(np.array([np.nan]), 1.0)


def test_skellam_shares_sum_to_the_skellam_of_the_total():
    shares = [skellam_noise(200_000, 2.0) for _ in range(3)]
    total = sum(shares)
    assert all(s.dtype == np.int64 for s in shares)
    assert total.var() == pytest.approx(6.0, rel=0.03) and abs(total.mean()) < 0.03
    for k in (0, 1, -2, 4):  # the pmf of Pois(3) − Pois(3), by scipy
        p = stats.skellam.pmf(k, 3.0, 3.0)
        assert np.mean(total == k) == pytest.approx(p, abs=5 * math.sqrt(p / 200_000))
    assert not np.array_equal(skellam_noise(100, 5.0), skellam_noise(100, 5.0))
    assert not skellam_noise(10, 0.0).any()


def test_wrap_and_unwrap():
    bits = 10
    z = np.arange(-512, 512)
    residues = wrap(z, bits)
    assert residues.dtype == np.uint64 and residues.min() == 0 and residues.max() == 1023
    assert np.array_equal(unwrap(residues, bits), z)
    assert np.array_equal(unwrap(wrap(np.array([512, -513, 1500]), bits), bits), [-512, 511, 476])
    vectors = [np.random.default_rng(i).integers(-300, 300, 50) for i in range(7)]
    assert np.array_equal(modular_sum([wrap(v, bits) for v in vectors], bits), wrap(sum(vectors), bits))
    with pytest.raises(ValueError, match="bits"):
        wrap(z, 63)


def test_choose_bits_is_the_smallest_with_the_margin():
    clients, bound, variance, h = 50, 103.3, 1e4, 6.0
    bits = choose_bits(clients, bound, variance, h)
    need = 2 * clients * bound + 3 * h * math.sqrt(variance)
    assert 2**bits >= need > 2 ** (bits - 1)
    limit = decode_limit(clients, bound, variance, h)
    assert limit == pytest.approx(clients * bound + h * 100) and limit < 2 ** (bits - 1)
    tighter = choose_bits(clients, bound, variance, h, linf=10.0)
    assert tighter < bits and 2**tighter >= 2 * clients * 10.0 + 3 * h * 100


def test_every_wrap_inside_the_margin_is_reported():
    """Exhaustively: each true sum T with |T| < 2^b − L decodes to T when |T| ≤ L and is reported
    otherwise (choose_bits's argument), and the first undetectable wrap sits at |T| = 2^b − L."""
    bits, limit = 8, 60
    signs = torch.ones(1, dtype=torch.float64)
    for t in range(-(2**bits) + limit + 1, 2**bits - limit):
        residues = wrap(np.array([t]), bits)
        if abs(t) <= limit:
            assert float(decode(residues, bits, signs, 1, 1.0, limit)[0]) == t
        else:
            with pytest.raises(OverflowError, match="wrapped around or left its plan"):
                decode(residues, bits, signs, 1, 1.0, limit)
    undetected = decode(wrap(np.array([2**bits - limit]), bits), bits, signs, 1, 1.0, limit)
    assert float(undetected[0]) == -limit
    with pytest.raises(ValueError, match="inside the decode range"):
        decode(wrap(np.array([0]), bits), bits, signs, 1, 1.0, 128)


def test_an_in_range_sum_decodes_exactly():
    rng = np.random.default_rng(3)
    dim, bits = 300, 16
    signs = rotation_signs(b"exact", dim)
    ints = [rng.integers(-100, 101, padded_dim(dim)) for _ in range(20)]
    summed = modular_sum([wrap(z, bits) for z in ints], bits)
    assert np.array_equal(unwrap(summed, bits), sum(ints))
    decoded = decode(summed, bits, signs, dim, 4.0, 2000)
    expected = unrotate(torch.from_numpy(sum(ints).astype(np.float64)), signs, dim) / 4.0
    assert torch.allclose(decoded, expected, atol=1e-9)


def _cohort(clients: int, dim: int, clip: float) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    scales = torch.linspace(0.2, 2.0, clients)  # norms ~ 0.2·√dim/… : some clipped, some not
    return [torch.randn(dim, generator=gen) * s * clip / math.sqrt(dim) for s in scales]


@pytest.mark.parametrize("sigma", [0.0, 1.0])
def test_fifty_clients_decode_to_the_clipped_sum(sigma):
    """n = 50 encoded updates summed mod 2^b decode to the sum of the clipped inputs; the error's
    per-coordinate std matches the prediction sqrt(μ + (1/D)·Σ_clients Σ_i f_i(1 − f_i))/s (rounding
    variance f(1 − f) of each rotated coordinate, spread evenly by the inverse rotation)."""
    clients, dim, clip, scale = 50, 1000, 1.0, 100.0
    signs = rotation_signs(b"cohort", dim)
    bound = rounding_norm_bound(scale * clip, padded_dim(dim), 1e-3)
    mu = (sigma * scale * clip) ** 2  # summed variance: σ·C in model units
    bits = choose_bits(clients, bound, mu, 6.0)
    inputs = _cohort(clients, dim, clip)
    messages = [encode(x, clip, scale, signs, bound, mu / clients, bits) for x in inputs]
    total = decode(
        modular_sum(messages, bits), bits, signs, dim, scale, decode_limit(clients, bound, mu, 6.0)
    )
    truth = sum(clip_l2(x, clip) for x in inputs)
    error = (total - truth).numpy()

    frac = [np.modf(rotate(clip_l2(x, clip) * scale, signs).numpy())[0] % 1.0 for x in inputs]
    rounding_var = sum(float(np.mean(f * (1 - f))) for f in frac)
    predicted = math.sqrt(mu + rounding_var) / scale
    assert error.std() == pytest.approx(predicted, rel=0.1)
    assert abs(error.mean()) < 5 * predicted / math.sqrt(dim)
    mean_error = np.abs(error / clients).max()
    assert mean_error < 6 * predicted / clients  # within 6 sd on all 1,000 coordinates (flakes ~2e-6)
    if sigma == 0:  # noiseless: only rounding, each rotated coordinate off by < 1 per client
        assert np.linalg.norm(error) <= clients * math.sqrt(padded_dim(dim)) / scale


def test_a_wrapping_cohort_is_reported():
    """The same cohort with too few bits for its noise: the decode refuses instead of returning junk."""
    clients, dim, clip, scale = 50, 1000, 1.0, 100.0
    signs = rotation_signs(b"wrap", dim)
    bound = rounding_norm_bound(scale * clip, padded_dim(dim), 1e-3)
    bits = 9  # ±256, against noise of sd 100 on 1024 coordinates
    messages = [
        encode(x, clip, scale, signs, bound, 1e4 / clients, bits) for x in _cohort(clients, dim, clip)
    ]
    with pytest.raises(OverflowError, match="coordinates of the decoded sum exceed"):
        decode(modular_sum(messages, bits), bits, signs, dim, scale, 128)


def test_the_module_docstring_figures():
    """MiniLM LoRA: d = 74,000, n = 100, C = 0.5, s = 5√D/C, ε = 8 at q = 0.1 over 30 rounds."""
    dim, clients, clip = 74_000, 100, 0.5
    size = padded_dim(dim)
    scale = 5 * math.sqrt(size) / clip
    bound = rounding_norm_bound(scale * clip, size, 1e-3)
    mu = skellam_mu(8.0, *integer_sensitivities(bound, size), 0.1, 30, 1e-6)
    assert size == 77_824 and bound == pytest.approx(1403.84, abs=0.01)
    assert mu == pytest.approx(1.414e6, rel=0.005) and math.sqrt(mu) / bound == pytest.approx(
        0.847, abs=0.001
    )
    bits = choose_bits(clients, bound, mu, 6.0)
    linf = rotated_linf_bound(scale * clip, dim, 1e-9) + 1
    tight = choose_bits(clients, bound, mu, 6.0, linf=linf)
    assert (bits, size * bits // 8) == (19, 184_832)
    assert linf == pytest.approx(177.2, abs=0.05) and (tight, size * tight // 8) == (16, 155_648)
