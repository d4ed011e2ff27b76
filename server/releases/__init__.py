"""Client-level releases, server side: one class per release kind, named by the registry
(common/privacy/registry.py; a kind without a class of its own runs through ``Release``, the view of its mechanism),
as Flower picks a strategy and Opacus an optimizer."""

from __future__ import annotations

from common.config import RunConfig
from common.lazy import load_component
from common.privacy.planning.plan import NoisePlan
from common.privacy.registry import GENERIC_SERVER, release_kind
from server.releases.base import Release, RunHandles


def make_release(cfg: RunConfig, plan: NoisePlan | None) -> Release:
    """The run's release (``none`` when there is no client-level noise plan)."""
    kind = release_kind(cfg.release_kind if plan else "none")
    return load_component(kind.server or GENERIC_SERVER)(cfg, plan)


__all__ = ["Release", "RunHandles", "make_release"]
