"""Threshold sharing (common/secagg/shamir.py): any t shares recover the secret, t-1 do not, the
interpolation agrees with an independent one (a Vandermonde system solved mod p by sympy), and the
module refuses what a bare Shamir would silently combine."""

import itertools
import os

import pytest
import sympy

from common.secagg import shamir
from common.secagg.errors import SecAggError


def test_the_modulus_is_prime_and_holds_every_secret():
    assert sympy.isprime(shamir.PRIME) and shamir.PRIME == 2**521 - 1
    assert shamir.PRIME.bit_length() <= 8 * shamir.ELEMENT_BYTES
    assert 2**520 + 2 ** (8 * shamir.MAX_SECRET_BYTES) <= shamir.PRIME


@pytest.mark.parametrize("size", [1, 32, 64])
def test_any_t_shares_recover_the_secret(size):
    secret = os.urandom(size)
    shares = shamir.split(secret, 3, 5)
    assert sorted(shamir.share_index(s) for s in shares) == [1, 2, 3, 4, 5]
    assert {len(s) for s in shares} == {4 + shamir.ELEMENT_BYTES}
    for subset in itertools.permutations(shares, 3):
        assert shamir.combine(list(subset), 3, size) == secret
    assert shamir.combine(shares[::-1], 3, size) == secret
    assert shamir.combine(list(shamir.split(bytes(size), 2, 2)), 2, size) == bytes(size)  # zero secret


def test_interpolation_matches_a_vandermonde_solve_mod_p():
    """Independent reference: solve V·a = y mod p for the polynomial's coefficients with sympy's
    modular matrix inverse; a_0 is the encoded secret 2^520 + s."""
    secret = os.urandom(32)
    shares = shamir.split(secret, 4, 9)
    for subset in itertools.islice(itertools.combinations(shares, 4), 0, 126, 25):
        xs = [shamir.share_index(s) for s in subset]
        ys = [int.from_bytes(s[4:], "big") for s in subset]
        vandermonde = sympy.Matrix([[x**j for j in range(4)] for x in xs])
        a = (vandermonde.inv_mod(shamir.PRIME) * sympy.Matrix(ys)).applyfunc(lambda v: v % shamir.PRIME)
        assert int(a[0]) == 2**520 + int.from_bytes(secret, "big")
        assert shamir.combine(list(subset), 4, 32) == secret


def test_one_share_reveals_nothing_its_value_is_uniform():
    """A share of a 2-of-m sharing is a_0 + a_1·x with a_1 uniform: f(1) − a_0 is uniform mod p, so
    the top bits of (f(1) − a_0) over many splits are uniform (a chi-square over 16 cells)."""
    secret = bytes(32)
    top = [
        ((int.from_bytes(shamir.split(secret, 2, 2)[0][4:], "big") - 2**520) % shamir.PRIME) >> 517
        for _ in range(1600)
    ]
    counts = [top.count(c) for c in range(16)]
    chi2 = sum((c - 100) ** 2 / 100 for c in counts)
    # the 1 − 1e-6 quantile of chi-square with 15 degrees of freedom (the shares come from OS entropy:
    # at 0.999 one run in a thousand failed; a biased a_1 lands far above either)
    assert chi2 < 56.5


def test_mixed_truncated_or_oversized_are_refused():
    a, b = shamir.split(os.urandom(32), 2, 3), shamir.split(os.urandom(32), 2, 3)
    with pytest.raises(SecAggError, match="do not combine to a 32-byte secret"):
        shamir.combine([a[0], b[1]], 2, 32)
    with pytest.raises(SecAggError, match="do not combine to a 32-byte secret"):
        shamir.combine([a[0][:20], a[1][:20]], 2, 32)
    with pytest.raises(SecAggError, match="at most 64 bytes, got 65"):
        shamir.split(bytes(65), 2, 3)


def test_fewer_than_t_shares_do_not_reconstruct():
    secret = os.urandom(32)
    shares = shamir.split(secret, 4, 7)
    for subset in itertools.combinations(shares, 3):
        with pytest.raises(SecAggError, match="3 shares cannot recover a secret shared 4-of-m"):
            shamir.combine(list(subset), 4, 32)
        with pytest.raises(SecAggError, match="do not combine"):  # interpolated as if 3-of-m: garbage
            shamir.combine(list(subset), 3, 32)


def test_repeated_shares_and_bad_thresholds_are_refused():
    shares = shamir.split(os.urandom(32), 2, 3)
    with pytest.raises(SecAggError, match="repeated indices"):
        shamir.combine([shares[0], shares[0]], 2, 32)
    with pytest.raises(SecAggError, match="needs 2 <= threshold <= shares"):
        shamir.split(os.urandom(32), 4, 3)
    with pytest.raises(SecAggError, match="needs 2 <= threshold <= shares"):
        shamir.split(os.urandom(32), 1, 3)
