"""``dp-ftrl``: the release of banded correlated noise (common/privacy/mechanisms/ftrl_mechanism.py), which says
at start-up which strategy and participation rule its ε assumes."""

from __future__ import annotations

from collections.abc import Sequence

from flwr.serverapp import Grid

from common.models import AdapterState
from common.privacy.planning.factorization import WORKLOADS
from server.releases.base import Release, RunHandles


class CorrelatedRelease(Release):
    def prepare(self, grid: Grid, nodes: Sequence[int], state: AdapterState, run: RunHandles) -> dict:
        f, optimizer = self.plan.family, self.cfg.server_optimizer
        run.echo(
            f"dp-ftrl: {f.bands}-band correlated noise (sigma {self.plan.sigma:.4g}, the strategy for server "
            f"{f.workload} over {f.rounds} rounds), assuming {f.guarantee}"
        )
        if optimizer not in WORKLOADS:
            run.echo(
                f"dp-ftrl: server {optimizer} is not linear: the noise before it is post-processing (the "
                "epsilon holds), but the strategy's cancellation is designed for server sgd or momentum"
            )
        return super().prepare(grid, nodes, state, run)


__all__ = ["CorrelatedRelease"]
