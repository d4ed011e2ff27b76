"""Splits and partitioners: deterministic, disjoint, covering, and skewed as configured."""

import numpy as np
import pytest

from common.data import SplitSettings, dirichlet_partition, federated_split, iid_partition, train_test_split
from common.data.dedup import text_groups
from common.errors import FedloraError
from common.presets import preset


def _check_cover(parts, n):
    allidx = np.concatenate(parts)
    assert len(allidx) == n and len(np.unique(allidx)) == n
    assert all(len(p) > 0 for p in parts)


def test_train_test_split_disjoint_and_seeded():
    tr, te = train_test_split(1000, 0.2, seed=3)
    assert len(te) == 200 and len(np.intersect1d(tr, te)) == 0
    _check_cover([tr, te], 1000)
    _, te2 = train_test_split(1000, 0.2, seed=3)
    assert np.array_equal(te, te2)
    assert not np.array_equal(te, train_test_split(1000, 0.2, seed=4)[1])


def test_iid_partition_covers_and_balances():
    parts = iid_partition(103, 5, seed=0)
    _check_cover(parts, 103)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("alpha", [0.05, 1.0, 100.0])
def test_dirichlet_partition_deterministic_and_covering(alpha):
    labels = np.random.default_rng(0).integers(0, 4, size=500)
    a = dirichlet_partition(labels, 7, alpha, seed=11)
    b = dirichlet_partition(labels, 7, alpha, seed=11)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    _check_cover(a, 500)
    c = dirichlet_partition(labels, 7, alpha, seed=12)
    assert any(not np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_alpha_controls_label_skew():
    labels = np.repeat(np.arange(4), 250)

    def skew(alpha):  # mean total-variation distance of client label mix from the global mix
        parts = dirichlet_partition(labels, 10, alpha, seed=0)
        mixes = [np.bincount(labels[p], minlength=4) / len(p) for p in parts]
        return np.mean([0.5 * np.abs(m - 0.25).sum() for m in mixes])

    assert skew(0.1) > 0.4 > 0.1 > skew(100.0)


def test_more_clients_than_examples_is_an_error():
    with pytest.raises(FedloraError, match="more clients"):
        iid_partition(3, 4, seed=0)
    with pytest.raises(FedloraError, match="more clients"):
        dirichlet_partition(np.zeros(3, dtype=int), 4, 1.0, seed=0)


@pytest.mark.parametrize("method", ["iid", "dirichlet"])
def test_the_public_split_never_overlaps_a_clients_data_or_the_test_set(method):
    whole = federated_split("rotten-tomatoes", 7, SplitSettings(method=method, seed=3))
    split = federated_split("rotten-tomatoes", 7, SplitSettings(method=method, seed=3, public_fraction=0.25))
    clients = np.concatenate(split.clients)
    assert len(np.intersect1d(split.public, clients)) == 0
    assert len(np.intersect1d(split.public, split.test)) == 0
    np.testing.assert_array_equal(split.test, whole.test)  # the held-out set does not move
    pool = np.sort(np.concatenate([clients, split.public]))
    np.testing.assert_array_equal(pool, np.sort(np.concatenate(whole.clients)))
    copies = np.count_nonzero(text_groups(split.corpus.texts)[pool] != pool)  # copies follow their first
    assert abs(len(split.public) - round(0.25 * len(pool))) <= copies
    assert len(federated_split("rotten-tomatoes", 7, SplitSettings(method=method, seed=3)).public) == 0


@pytest.mark.parametrize("fraction", [-0.1, 0.6, 1.0])
def test_a_public_fraction_outside_the_range_is_one_line(fraction):
    with pytest.raises(FedloraError, match=r"public-fraction must be 0 or in \(0, 0.5\]"):
        preset("small", public_fraction=fraction).check()


def test_a_natural_client_of_several_users_holds_each_of_them_whole():
    """``--users-per-client K``: each client holds K whole users, no user is split or shared, and
    K = 1 is the one-user partition (the same seeded choice of users)."""
    from common.data.split import natural_partition

    users = [f"u{i % 13}" for i in range(200)]
    one = natural_partition(users, 4, seed=3)
    for per_client in (1, 3):
        parts = natural_partition(users, 4, seed=3, per_client=per_client)
        owners = [{users[i] for i in p} for p in parts]
        assert [len(o) for o in owners] == [per_client] * 4
        assert len(set().union(*owners)) == 4 * per_client  # no user on two clients
        for part, held in zip(parts, owners, strict=True):  # every text of a user it holds
            assert sorted(part.tolist()) == [i for i, u in enumerate(users) if u in held]
    assert [p.tolist() for p in natural_partition(users, 4, seed=3, per_client=1)] == [
        p.tolist() for p in one
    ]
    with pytest.raises(FedloraError, match=r"must be 1\.\.13, got 4 x 4"):
        natural_partition(users, 4, seed=3, per_client=4)


def test_users_per_client_needs_the_natural_partition():
    with pytest.raises(FedloraError, match="--users-per-client needs --partition natural"):
        preset("minilm-rt", users_per_client=2).check()
