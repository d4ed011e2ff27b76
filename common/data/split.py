"""Seeded train/test split and client partitioners (IID, Dirichlet label skew, natural users).

Every function is a pure function of its arguments and seed: the server and each client compute
the same split independently, so no example indices travel over the wire.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from common.data.dedup import keep_together
from common.errors import FedloraError


def train_test_split(
    n: int, test_fraction: float, seed: int, groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint index arrays ``(train, test)`` covering ``range(n)``, ``test`` a seeded
    ``test_fraction`` of it. With ``groups`` (``text_groups`` of the texts) every copy of a text then
    follows its first occurrence (:func:`~common.data.dedup.keep_together`), so the sizes move by at
    most the number of copies; without copies the split is the same as without ``groups``."""
    perm = np.random.default_rng([seed, 0x5E1]).permutation(n)
    n_test = max(1, round(n * test_fraction))
    train, test = np.sort(perm[n_test:]), np.sort(perm[:n_test])
    if groups is not None:
        train, test = keep_together((train, test), groups)
    return train, test


def iid_partition(n: int, num_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle ``range(n)`` and deal it into ``num_clients`` near-equal parts."""
    _check(n, num_clients)
    perm = np.random.default_rng([seed, 0x11D]).permutation(n)
    return [np.sort(part) for part in np.array_split(perm, num_clients)]


def dirichlet_partition(labels: np.ndarray, num_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Label-skew partition: for each class, client shares ~ Dir(alpha) (Hsu et al., 2019).

    Small ``alpha`` gives few classes per client; large ``alpha`` approaches IID. Every example
    goes to exactly one client, and every client gets at least one example (a client left empty
    takes one from the largest).
    """
    labels = np.asarray(labels)
    _check(len(labels), num_clients)
    if alpha <= 0:
        raise FedloraError(f"dirichlet alpha must be > 0, got {alpha}")
    rng = np.random.default_rng([seed, 0xD1C])
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        shares = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(shares)[:-1] * len(idx)).astype(int)
        for client, chunk in enumerate(np.split(idx, cuts)):
            parts[client].extend(chunk.tolist())
    for client in range(num_clients):
        if not parts[client]:
            donor = max(range(num_clients), key=lambda c: len(parts[c]))
            parts[client].append(parts[donor].pop())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def natural_partition(
    users: Sequence[object], num_clients: int, seed: int, per_client: int = 1
) -> list[np.ndarray]:
    """Clients of whole users: the positions of ``users`` grouped by value (the user of each text).
    Each client holds ``per_client`` users (a silo of several, e.g. plays): a seeded choice of
    ``num_clients × per_client`` users, in their order of first appearance, cut into runs of
    ``per_client`` (every user when that is their number)."""
    by_user: dict[object, list[int]] = {}
    for i, key in enumerate(users):
        by_user.setdefault(key, []).append(i)
    count, wanted = len(by_user), num_clients * per_client
    if not 1 <= wanted <= count:
        raise FedloraError(
            f"natural partition: {count} users in the training pool; --num-clients x --users-per-client "
            f"must be 1..{count}, got {num_clients} x {per_client}"
        )
    members = list(by_user.values())  # in order of first appearance
    chosen = np.sort(np.random.default_rng([seed, 0x7A7]).permutation(count)[:wanted])
    return [
        np.sort(np.concatenate([np.asarray(members[c], dtype=np.int64) for c in group]))
        for group in chosen.reshape(num_clients, per_client)
    ]


def partition(
    labels: np.ndarray,
    num_clients: int,
    method: str,
    alpha: float,
    seed: int,
    users: Sequence[object] | None = None,
    per_client: int = 1,
) -> list[np.ndarray]:
    """``method``: ``iid``, ``dirichlet`` or ``natural`` (``per_client`` whole users per client:
    ``users[i]`` is the user of text ``i``; without ``users`` each text is its own user, e.g. a
    shakespeare role)."""
    if method == "iid":
        return iid_partition(len(labels), num_clients, seed)
    if method == "dirichlet":
        return dirichlet_partition(labels, num_clients, alpha, seed)
    if method == "natural":
        return natural_partition(
            range(len(labels)) if users is None else users, num_clients, seed, per_client
        )
    raise FedloraError(f"unknown partition '{method}'; choose iid, dirichlet or natural")


def _check(n: int, num_clients: int) -> None:
    if num_clients < 1:
        raise FedloraError(f"number of clients must be >= 1, got {num_clients}")
    if num_clients > n:
        raise FedloraError(f"more clients ({num_clients}) than training examples ({n})")
