"""Integer encoding of a client update for secure aggregation with distributed Skellam noise.

A library only (no protocol, no messaging). A client turns its flat float update x (``dim``
coordinates) into a vector of D ≥ dim integers mod 2^b (:func:`padded_dim`); the server adds the vectors of
the clients that replied mod 2^b and decodes the sum. Steps (Kairouz, Liu & Steinke, ICML 2021,
arXiv 2102.06387, Algorithm 1 of the distributed discrete Gaussian, with Skellam noise as in
Agarwal, Kairouz & Liu, NeurIPS 2021, arXiv 2110.04995, Algorithm 1):

1. clip ‖x‖_2 ≤ C, scale by s (integer units: s per unit of the update);
2. rotate: y = diag(H, …, H)·(ξ ⊙ pad(x))/√B with H the Walsh–Hadamard matrix of a block of B
   coordinates and ξ public random signs (:func:`rotation_signs`): orthogonal, so ‖y‖_2 = ‖x‖_2,
   and the L2 mass spreads evenly over each block (:func:`rotated_linf_bound`);
3. conditional randomized rounding (:func:`conditional_round`): round each coordinate up with
   probability its fractional part, re-draw until ‖z‖_2 ≤ the bound Δ2 (which is then the L2
   sensitivity the accountant charges, common/privacy/accounting/skellam.py);
4. add the client's share of Skellam noise (:func:`skellam_noise`): shares of variance μ/n sum to
   exactly Sk(μ);
5. reduce mod 2^b (:func:`wrap`); the server sums mod 2^b (:func:`modular_sum`), lifts to the
   centred range (:func:`unwrap`), checks for wrap-around, unrotates and unscales (:func:`decode`).

Randomness: rounding draws from a numpy generator seeded with ``secrets.randbits(128)`` on every
call (as common/privacy/mechanisms/release.py does for the Gaussian): never the run's seed; its PCG64 stream
is not a CSPRNG, only the seed is. The noise share comes from common/privacy/mechanisms/skellam_sampler.py:
inversion of a 128-bit table of the Skellam CDF with uniforms from a ChaCha20 keystream under a key
from ``os.urandom``, within (2K + 1)·2^-128 of it in total variation per coordinate (K ≈ 14.6·σ).
The rotation signs are public randomness, the same on every client and the server: SHAKE-256 of a
shared seed.

Communication, from :func:`choose_bits` (test_discrete.py recomputes these figures): MiniLM's LoRA
adapter, dim = 74,000 (D = 77,824 after padding to 19 rotation blocks of 4,096), n = 100 clients,
C = 0.5, s = 5√D/C (so sC = 5√D and rounding inflates Δ2 by 0.6 %), β = 1e-3 for the rounding
bound (Δ2 = 1,403.8), ε = 8 noise from :func:`common.privacy.accounting.skellam.skellam_mu` (Poisson rate
0.1, 30 rounds, δ = 1e-6: summed variance μ = 1.41e6, σ ≈ 0.85 in units of Δ2), 6 standard
deviations of headroom:

* worst-case signal n·Δ2 per coordinate: b = 19 bits per coordinate, 184,832 bytes per client;
* the rotated L∞ bound at β = 1e-9 plus 1 for rounding (n·177.2): b = 16 bits, 155,648 bytes per client;

against 296,000 bytes for the float32 update. The rotation is block-wise (:data:`ROTATION_BLOCK`):
one Walsh–Hadamard transform over the whole vector would pad it to 2^17 (77 % more words, so
more mask, noise and message per client) for an L∞ bound only √(D/B) tighter, which the plan
(worst-case signal) does not use; σ in units of Δ2, and so the noise in units of the update, is
the same (0.847).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Sequence

import numpy as np
import torch

from common.privacy.mechanisms import skellam_sampler

#: largest modulus exponent: sums of two residues < 2^62 fit in uint64, lifts fit in int64
MAX_BITS = 62
#: largest |coordinate| before rounding: squares stay exact in float64 for the norm check
_MAX_COORD = 2.0**26
#: the rotation's largest Walsh–Hadamard block: a longer vector is padded to a multiple of it and
#: rotated block by block (MiniLM's 74,000 coordinates: D = 77,824, not 2^17 = 131,072)
ROTATION_BLOCK = 4096
#: domain separation for the public rotation signs
_SIGNS_DOMAIN = b"fedlora-dp/discrete/rotation-signs/v1\x00"


def padded_dim(dim: int) -> int:
    """D, the rotation's length: the smallest power of two ≥ ``dim`` up to :data:`ROTATION_BLOCK`,
    beyond it the smallest multiple of :data:`ROTATION_BLOCK` ≥ ``dim`` (blocks rotated apart)."""
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if dim <= ROTATION_BLOCK:
        return 1 << (dim - 1).bit_length()
    return -(-dim // ROTATION_BLOCK) * ROTATION_BLOCK


def block_size(size: int) -> int:
    """B, the Walsh–Hadamard block of a rotation of length D = ``size``: D up to
    :data:`ROTATION_BLOCK`, else :data:`ROTATION_BLOCK`."""
    return min(size, ROTATION_BLOCK)


def _generator() -> np.random.Generator:
    return np.random.default_rng(secrets.randbits(128))


def rotation_signs(seed: bytes, dim: int) -> torch.Tensor:
    """Public random signs ξ ∈ {−1, +1}^D (float64, D = :func:`padded_dim` (``dim``)): bit i of
    SHAKE-256(domain ‖ ``seed``) gives ξ_i. Every party with ``seed`` derives the same signs."""
    size = padded_dim(dim)
    stream = hashlib.shake_256(_SIGNS_DOMAIN + bytes(seed)).digest((size + 7) // 8)
    bits = np.unpackbits(np.frombuffer(stream, dtype=np.uint8))[:size]
    return torch.from_numpy(1.0 - 2.0 * bits.astype(np.float64))


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """H·x along the last axis for the (Sylvester-ordered, unnormalised) Walsh–Hadamard matrix H of
    size B = x.shape[-1], a power of two; O(B log B) butterflies a row. H is symmetric, H·H = B·I."""
    size = x.shape[-1]
    if size & (size - 1):
        raise ValueError(f"the Walsh–Hadamard transform needs a power-of-two length, got {size}")
    y = x.reshape(-1, size)
    rows, half = y.shape[0], 1
    while half < size:
        pairs = y.reshape(rows, -1, 2, half)
        y = torch.stack((pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]), dim=2)
        y = y.reshape(rows, size)
        half *= 2
    return y.reshape(x.shape)


def _blockwise(x: torch.Tensor) -> torch.Tensor:
    """H_B applied to each block of B = :func:`block_size` (len(x)) coordinates of ``x`` (D,), /√B:
    the orthogonal map diag(H_B, …, H_B)/√B."""
    size = x.shape[0]
    block = block_size(size)
    return (hadamard_transform(x.reshape(size // block, block)) / math.sqrt(block)).reshape(size)


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """y = diag(H_B, …, H_B)·(ξ ⊙ pad(x))/√B: ``x`` flat (dim ≤ D), ``signs`` ξ of length D
    (B = :func:`block_size` (D)); float64 (D,). Orthogonal: ‖y‖_2 = ‖x‖_2."""
    size = signs.shape[0]
    flat = x.reshape(-1).to(torch.float64)
    if flat.shape[0] > size:
        raise ValueError(f"{flat.shape[0]} coordinates do not fit {size} rotation signs")
    padded = torch.nn.functional.pad(flat, (0, size - flat.shape[0]))
    return _blockwise(padded * signs)


def unrotate(y: torch.Tensor, signs: torch.Tensor, dim: int) -> torch.Tensor:
    """The inverse of :func:`rotate`: the first ``dim`` coordinates of ξ ⊙ diag(H_B, …)·y/√B;
    float64 (dim,)."""
    size = signs.shape[0]
    if y.shape[-1] != size or dim > size:
        raise ValueError(f"a rotated vector of length {size} is needed for dim {dim}, got {y.shape[-1]}")
    return (signs * _blockwise(y.to(torch.float64)))[:dim]


def rotated_linf_bound(norm: float, dim: int, beta: float) -> float:
    """Bound on max_i |y_i| for y = :func:`rotate` (x) with ‖x‖_2 ≤ ``norm``, holding with
    probability ≥ 1 − ``beta`` over the random signs (x fixed before the signs are drawn):
    y_i = Σ_j ±x_j/√B over its block is a Rademacher sum with variance proxy ≤ norm²/B, so
    Hoeffding and a union bound over the D coordinates give norm·sqrt(2 log(2D/β)/B)."""
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    size = padded_dim(dim)
    return norm * math.sqrt(2 * math.log(2 * size / beta) / block_size(size))


def conditional_round(x: torch.Tensor | np.ndarray, bound: float, max_tries: int = 1000) -> np.ndarray:
    """Randomized rounding of ``x`` (flat, float) to int64, re-drawn until ‖z‖_2 ≤ ``bound``
    (Kairouz, Liu & Steinke §4 conditional rounding): coordinate i rounds up with probability
    x_i − ⌊x_i⌋, so E z = x before conditioning. Raises after ``max_tries`` draws; pick ``bound``
    with :func:`common.privacy.accounting.skellam.rounding_norm_bound` so that a redraw is rare. The norm
    check is exact (integer squares below 2^52 summed by ``math.fsum``)."""
    values = (x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).astype(np.float64)
    values = values.reshape(-1)
    if not np.isfinite(values).all() or (values.size and np.abs(values).max() >= _MAX_COORD):
        raise ValueError(f"coordinates must be finite and below {_MAX_COORD:g} in magnitude")
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    floor = np.floor(values)
    frac = values - floor
    gen = _generator()
    for _ in range(max_tries):
        z = (floor + (gen.random(values.shape) < frac)).astype(np.int64)
        if _squared_norm(z) <= bound * bound:
            return z
    raise ValueError(
        f"conditional rounding found no vector with L2 norm <= {bound:g} in {max_tries} tries "
        f"(input norm {math.sqrt(math.fsum(values * values)):g}, {values.size} coordinates)"
    )


def _squared_norm(z: np.ndarray) -> float:
    """‖z‖² of an int64 vector, exactly: summed in int64 when no overflow is possible, else by
    ``math.fsum`` of the (exact, below 2^52) float squares."""
    top = int(np.abs(z).max()) if z.size else 0
    if top * top * z.size < 2**63:
        return float(np.dot(z, z))
    return math.fsum(np.square(z.astype(np.float64)))


def skellam_noise(shape: int | tuple[int, ...], variance: float) -> np.ndarray:
    """One client's share of Skellam noise: Sk(variance/2, variance/2) per coordinate (int64, mean 0,
    variance ``variance`` in integer units²; common/privacy/mechanisms/skellam_sampler.py). Shares add: n
    shares of variance μ/n sum to exactly Sk(μ) (Agarwal et al. 2021, §3)."""
    size = math.prod((shape,) if isinstance(shape, int) else shape)
    return skellam_sampler.skellam(size, variance).reshape(shape)


def _check_bits(bits: int) -> None:
    if not 2 <= bits <= MAX_BITS or int(bits) != bits:
        raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {bits}")


def wrap(z: np.ndarray, bits: int) -> np.ndarray:
    """``z`` (integers) mod 2^``bits``, as uint64 in [0, 2^bits): the low bits of its two's
    complement."""
    _check_bits(bits)
    return np.asarray(z, dtype=np.int64).view(np.uint64) & np.uint64((1 << bits) - 1)


def modular_sum(vectors: Sequence[np.ndarray], bits: int) -> np.ndarray:
    """Σ ``vectors`` mod 2^``bits`` (what secure aggregation reveals); uint64 residues in, out."""
    _check_bits(bits)
    mask = np.uint64((1 << bits) - 1)
    total = np.zeros_like(np.asarray(vectors[0], dtype=np.uint64))
    for v in vectors:
        residues = np.asarray(v, dtype=np.uint64)
        if residues.size and residues.max() > mask:
            raise ValueError(f"a vector holds values outside [0, 2^{bits})")
        total = (total + residues) & mask
    return total


def unwrap(s: np.ndarray, bits: int) -> np.ndarray:
    """The centred lift of residues ``s`` mod 2^``bits``: int64 in [−2^(bits−1), 2^(bits−1))."""
    _check_bits(bits)
    v = np.asarray(s, dtype=np.uint64).astype(np.int64)
    return np.where(v >= (1 << (bits - 1)), v - (1 << bits), v)


def _plan(clients: int, bound: float, variance_total: float, linf: float | None) -> tuple[float, float]:
    """(signal bound S per coordinate of the sum, noise standard deviation)."""
    if clients < 1:
        raise ValueError(f"clients must be >= 1, got {clients}")
    if not (bound > 0 and math.isfinite(bound)):
        raise ValueError(f"bound must be finite and > 0, got {bound}")
    if not (variance_total >= 0 and math.isfinite(variance_total)):
        raise ValueError(f"noise variance must be finite and >= 0, got {variance_total}")
    per_client = bound if linf is None else min(bound, linf)
    return clients * per_client, math.sqrt(variance_total)


def decode_limit(
    clients: int, bound: float, variance_total: float, headroom_sds: float, linf: float | None = None
) -> float:
    """The planned limit L = S + h·sd on every |coordinate| of the summed integers: S the signal
    bound (``clients``·``bound``, since |z_i| ≤ ‖z‖_2 ≤ Δ2 for every client; or ``clients``·
    ``linf`` with a per-client L∞ bound such as :func:`rotated_linf_bound` + 1), sd the standard
    deviation of the summed noise, h = ``headroom_sds``."""
    signal, sd = _plan(clients, bound, variance_total, linf)
    return signal + headroom_sds * sd


def choose_bits(
    clients: int, bound: float, variance_total: float, headroom_sds: float, linf: float | None = None
) -> int:
    """The smallest b with 2^b ≥ 2S + 3h·sd (S, sd, h as in :func:`decode_limit`, L = S + h·sd).

    Why: the decoded value v of a coordinate whose true sum is T equals T whenever |T| < 2^(b−1)
    and T − 2^b·sign(T) when 2^(b−1) ≤ |T| < 2^b. So every T with L < |T| < 2^b − L decodes to
    |v| > L and :func:`decode` reports it (T ≤ L decodes exactly, since L ≤ 2^(b−1)). A wrap goes
    unnoticed only if |T| ≥ 2^b − L ≥ S + 2h·sd: with |signal| ≤ S that needs a noise excursion
    of 2h standard deviations, while any excursion beyond h is already reported."""
    if headroom_sds < 0:
        raise ValueError(f"headroom must be >= 0 standard deviations, got {headroom_sds}")
    signal, sd = _plan(clients, bound, variance_total, linf)
    bits = max(2, math.ceil(math.log2(max(2 * signal + 3 * headroom_sds * sd, 1.0))))
    if bits > MAX_BITS:
        raise ValueError(f"the plan needs {bits} bits per coordinate, more than {MAX_BITS}")
    return bits


def clip_l2(x: torch.Tensor, clip: float) -> torch.Tensor:
    """Flat ``x`` in float64 (n,), scaled down to L2 norm ≤ ``clip`` (kept when already inside; zero
    stays zero): x·min(1, C/max(‖x‖, tiny)) in tensor ops, the same work whatever the data (no branch
    on the norm: constant work, as a hidden coin's zero update needs)."""
    flat = x.reshape(-1).to(torch.float64)
    norm = torch.linalg.vector_norm(flat).clamp(min=torch.finfo(torch.float64).tiny)
    return flat * (clip / norm).clamp(max=1.0)


def encode(
    x: torch.Tensor,
    clip: float,
    scale: float,
    signs: torch.Tensor,
    bound: float,
    noise_variance: float,
    bits: int,
) -> np.ndarray:
    """A client's message: uint64 residues mod 2^``bits``, length D = len(``signs``).

    ``x`` flat update (dim ≤ D coordinates, model units); clipped to L2 ≤ ``clip``, times
    ``scale``, rotated by ``signs``, conditionally rounded to ‖z‖_2 ≤ ``bound`` (integer units),
    plus this client's Skellam share of variance ``noise_variance`` (integer units²), mod 2^bits."""
    if not (scale > 0 and math.isfinite(scale)) or not clip > 0:
        raise ValueError(f"scale and clip must be > 0, got scale {scale}, clip {clip}")
    rotated = rotate(clip_l2(x, clip) * scale, signs)
    z = conditional_round(rotated, bound) + skellam_noise(rotated.shape[0], noise_variance)
    return wrap(z, bits)


def decode(
    sum_mod: np.ndarray, bits: int, signs: torch.Tensor, dim: int, scale: float, limit: float
) -> torch.Tensor:
    """The server's decoding of Σ client messages mod 2^``bits``: the SUM of the clients' clipped
    updates plus noise, float64 (``dim``,), in model units (divide by the cohort for a mean).

    Lifts to [−2^(bits−1), 2^(bits−1)), then raises OverflowError when any |coordinate| exceeds
    ``limit`` (the plan's L, :func:`decode_limit`): by :func:`choose_bits`'s argument that is a
    wrap-around or an out-of-plan sum, never decoded silently. Then unrotates and divides by
    ``scale``."""
    _check_bits(bits)
    if not 0 <= limit < 1 << (bits - 1):
        raise ValueError(f"limit {limit:g} must lie inside the decode range [0, 2^{bits - 1})")
    lifted = unwrap(sum_mod, bits)
    over = np.abs(lifted) > limit
    if over.any():
        raise OverflowError(
            f"{int(over.sum())} of {lifted.size} coordinates of the decoded sum exceed the planned "
            f"limit {limit:g} (largest |v| = {int(np.abs(lifted).max())}, modulus 2^{bits}): the sum "
            f"wrapped around or left its plan; not decoded"
        )
    return unrotate(torch.from_numpy(lifted.astype(np.float64)), signs, dim) / scale


__all__ = [
    "MAX_BITS",
    "choose_bits",
    "clip_l2",
    "conditional_round",
    "decode",
    "decode_limit",
    "encode",
    "hadamard_transform",
    "modular_sum",
    "padded_dim",
    "rotate",
    "rotated_linf_bound",
    "rotation_signs",
    "skellam_noise",
    "unrotate",
    "unwrap",
    "wrap",
]
