"""Threshold sharing through Flower's Shamir (common/secagg/shamir.py): any t shares recover the
secret, t-1 do not, and the wrapper refuses what Flower would silently combine."""

import contextlib
import itertools
import os

import pytest
from flwr.common.secure_aggregation.crypto.shamir import combine_shares

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
