"""Threshold sharing (common/secagg/shamir.py): any t shares recover the secret, t-1 do not, the
shares are Flower's (each side combines the other's), and the module refuses what Flower would
silently combine."""

import contextlib
import itertools
import os
import random

import pytest
from flwr.common.secure_aggregation.crypto.shamir import combine_shares, create_shares

from common.secagg import shamir
from common.secagg.errors import SecAggError


@pytest.mark.parametrize("size", [32, 48])
def test_any_t_shares_recover_the_secret(size):
    secret = os.urandom(size)
    shares = shamir.split(secret, 3, 5)
    assert sorted(shamir.share_index(s) for s in shares) == [1, 2, 3, 4, 5]
    for subset in itertools.combinations(shares, 3):
        assert shamir.combine(list(subset), 3, size) == secret
    assert shamir.combine(shares[::-1], 3, size) == secret


@pytest.mark.parametrize("size", [1, 16, 32, 48])
def test_shares_are_flowers_format_both_ways(size):
    secret = os.urandom(size)
    ours = shamir.split(secret, 3, 5)
    assert [len(s) for s in ours] == [4 + 16 * (size // 16 + 1)] * 5  # PKCS#7 always pads
    for subset in itertools.combinations(ours, 3):
        assert combine_shares(list(subset)) == secret
    theirs = create_shares(secret, 3, 5)
    for subset in itertools.combinations(theirs, 3):
        assert shamir.combine(list(subset), 3, size) == secret


def test_mixed_or_truncated_shares_are_refused():
    a, b = shamir.split(os.urandom(32), 2, 3), shamir.split(os.urandom(48), 2, 3)
    with pytest.raises(SecAggError, match="do not combine to a 32-byte secret"):
        shamir.combine([a[0], b[1]], 2, 32)
    with pytest.raises(SecAggError, match="do not combine to a 32-byte secret"):
        shamir.combine([a[0][:4], a[1][:4]], 2, 32)


def test_fewer_than_t_shares_do_not_reconstruct():
    secret = os.urandom(32)
    shares = shamir.split(secret, 4, 7)
    for subset in itertools.combinations(shares, 3):
        with contextlib.suppress(ValueError):  # Flower fails to unpad t-1 shares' combination...
            assert combine_shares(list(subset)) != secret  # ...or combines them to garbage
        with pytest.raises(SecAggError, match="3 shares cannot recover a secret shared 4-of-m"):
            shamir.combine(list(subset), 4, 32)


def test_repeated_shares_and_bad_thresholds_are_refused():
    shares = shamir.split(os.urandom(32), 2, 3)
    with pytest.raises(SecAggError, match="repeated indices"):
        shamir.combine([shares[0], shares[0]], 2, 32)
    with pytest.raises(SecAggError, match="needs 2 <= threshold <= shares"):
        shamir.split(os.urandom(32), 4, 3)
    with pytest.raises(SecAggError, match="needs 2 <= threshold <= shares"):
        shamir.split(os.urandom(32), 1, 3)


def test_field_arithmetic_is_pycryptodomes():
    from Crypto.Protocol.SecretSharing import _Element  # the reference: pycryptodome's own field

    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.getrandbits(128), rng.getrandbits(128)
        assert shamir._mul(a, b) == int(_Element(a) * _Element(b))
        if a:
            assert shamir._mul(a, shamir._inverse(a)) == 1
            assert shamir._inverse(a) == int(_Element(a).inverse())


def test_any_index_set_combines_like_pycryptodome():
    from Crypto.Protocol.SecretSharing import Shamir

    secret = os.urandom(48)
    shares = shamir.split(secret, 4, 9)
    for subset in itertools.islice(itertools.permutations(shares, 4), 0, 3000, 97):
        assert shamir.combine(list(subset), 4, 48) == secret
        chunk = [(shamir.share_index(s), s[4:20]) for s in subset]
        assert Shamir.combine(chunk, ssss=False) == secret[:16]
