"""The SecAgg+ neighbour graph (common/secagg/graph.py): symmetric, degree k, the same at every
client from public data, a different graph for another public seed."""

import os
import random

import pytest

from common.secagg.errors import SecAggError
from common.secagg.graph import max_degree, neighbours


@pytest.mark.parametrize(("n", "k"), [(10, 4), (11, 4), (12, 5), (13, 5), (20, 8), (20, 19), (3, 2)])
def test_the_graph_is_symmetric_loop_free_and_of_degree_k(n, k):
    ids = random.sample(range(1, 2**63), n)
    graph = neighbours(ids, k, os.urandom(32))
    assert set(graph) == set(ids)
    assert all(u not in graph[u] and all(u in graph[v] for v in graph[u]) for u in graph)
    degrees = sorted(len(graph[u]) for u in graph)
    if k % 2 and n % 2:  # no k-regular graph exists: one node has k + 1
        assert degrees == [k] * (n - 1) + [k + 1]
    else:
        assert degrees == [k] * n
    assert max(degrees) == max_degree(n, k)


def test_every_client_recomputes_the_same_graph_and_the_seed_changes_it():
    ids, seed = list(range(100, 120)), os.urandom(32)
    reference = neighbours(ids, 6, seed)
    for _ in range(5):  # each client gets the ids in its own order
        shuffled = random.sample(ids, len(ids))
        assert neighbours(shuffled, 6, seed) == reference
    assert neighbours(ids, 6, os.urandom(32)) != reference


def test_too_many_neighbours_are_refused():
    with pytest.raises(SecAggError, match="a graph over 5 nodes has 1 to 4 neighbours per node, not 5"):
        neighbours(range(5), 5, b"s" * 16)
