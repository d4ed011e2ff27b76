"""The SecAgg+ neighbour graph (Bell et al. 2020, CCS, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", §3): each node shares its secrets with, and masks against, only its
k neighbours instead of all n-1 nodes.

The graph is a Harary graph H(k, n) (a ring where each node links to the ⌊k/2⌋ nodes on either
side, plus the opposite node when k is odd) over a permutation of the round's sorted node ids. The
permutation sorts the ids by HMAC-SHA256(public seed, id): a keyed pseudo-random order that anyone
holding (ids, k, seed) recomputes, so every client can check the server's graph (Flower's SecAgg+
shuffles with the server's unseeded ``random.shuffle``, which clients cannot verify).

Degrees: exactly k, except when k and n are both odd (no k-regular graph exists): one node has k+1.
The graph is connected and k-connected (Harary 1962).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from functools import lru_cache

from common.secagg.errors import SecAggError


def _position_key(seed: bytes, node_id: int) -> bytes:
    return hmac.new(seed, node_id.to_bytes(8, "little"), hashlib.sha256).digest()


def max_degree(n: int, k: int) -> int:
    """The largest neighbourhood of :func:`neighbours` for ``n`` nodes and ``k`` neighbours."""
    return k + 1 if k % 2 and n % 2 else k


def neighbours(node_ids: Iterable[int], k: int, seed: bytes) -> dict[int, frozenset[int]]:
    """Each node's neighbours (never itself): symmetric, degree k (one node k+1 if k and n are odd).

    ``node_ids``: the round's distinct node ids (any order: they are sorted first); ``k``: the
    neighbour count, 1 <= k <= n-1; ``seed``: public bytes fixing the permutation.
    """
    return _harary(tuple(sorted(set(node_ids))), k, seed)


@lru_cache(maxsize=16)  # every node and every stage of a round asks for the same graph
def _harary(ids: tuple[int, ...], k: int, seed: bytes) -> dict[int, frozenset[int]]:
    n = len(ids)
    if not 1 <= k <= n - 1:
        raise SecAggError(f"a graph over {n} nodes has 1 to {n - 1} neighbours per node, not {k}")
    ring = sorted(ids, key=lambda node: _position_key(seed, node))
    links: dict[int, set[int]] = {node: set() for node in ring}

    def link(i: int, j: int) -> None:
        a, b = ring[i % n], ring[j % n]
        links[a].add(b)
        links[b].add(a)

    for i in range(n):
        for offset in range(1, k // 2 + 1):
            link(i, i + offset)
    if k % 2:
        # the diameters i -- i + ⌊n/2⌋; for odd n the first and the last chord share node ⌊n/2⌋
        for i in range((n + 1) // 2):
            link(i, i + n // 2)
    return {node: frozenset(links[node]) for node in ids}
