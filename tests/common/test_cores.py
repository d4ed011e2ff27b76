"""common/cores.py: the cores a process may use (its affinity) and their share among processes."""

import os

import pytest

from common import cores


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_the_cores_are_the_affinity_and_each_of_n_processes_gets_its_share(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5, 7})
    assert cores.available_cores() == 4
    assert [cores.threads_each(n) for n in (0, 1, 2, 3, 4, 9)] == [4, 4, 2, 1, 1, 1]
