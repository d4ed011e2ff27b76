"""Client-level releases, server side: one class per release, looked up by name (as Flower picks a
strategy and Opacus an optimizer). client/releases.py holds the client sides under the same names."""

from __future__ import annotations

from common.config import RunConfig
from common.privacy.plan import NoisePlan
from server.releases.base import Release, RunHandles
from server.releases.dr_encoder import DrEncoderRelease
from server.releases.gaussian import CorrelatedRelease, MechanismRelease
from server.releases.none import NoRelease

RELEASES: dict[str, type[Release]] = {
    NoRelease.name: NoRelease,
    MechanismRelease.name: MechanismRelease,
    DrEncoderRelease.name: DrEncoderRelease,
    CorrelatedRelease.name: CorrelatedRelease,
}


def make_release(cfg: RunConfig, plan: NoisePlan | None) -> Release:
    """The run's release (``none`` when there is no client-level noise plan; a registered release kind
    without a class of its own runs through :class:`MechanismRelease`)."""
    return RELEASES.get(cfg.release_kind if plan else "none", MechanismRelease)(cfg, plan)


__all__ = ["RELEASES", "MechanismRelease", "Release", "RunHandles", "make_release"]
