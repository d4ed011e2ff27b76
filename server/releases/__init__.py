"""Client-level releases, server side: one class per release, looked up by name (as Flower picks a
strategy and Opacus an optimizer). client/releases.py holds the client sides under the same names."""

from __future__ import annotations

from common.config import RunConfig
from common.privacy.plan import NoisePlan
from server.releases.base import Release, RunHandles
from server.releases.dr_encoder import DrEncoderRelease
from server.releases.gaussian import GaussianRelease
from server.releases.none import NoRelease

RELEASES: dict[str, type[Release]] = {
    NoRelease.name: NoRelease,
    GaussianRelease.name: GaussianRelease,
    DrEncoderRelease.name: DrEncoderRelease,
}


def make_release(cfg: RunConfig, plan: NoisePlan | None) -> Release:
    """The run's release (``none`` when there is no client-level noise plan)."""
    return RELEASES[cfg.release_kind if plan else "none"](cfg, plan)


__all__ = ["RELEASES", "Release", "RunHandles", "make_release"]
