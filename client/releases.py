"""Client-level releases, client side: what leaves a client, by the run's release.
server/releases holds the server sides under the same names.

Each release takes the client's increment (adapter state minus the round's global state), the
round's instruction and the run config, and returns what is sent plus the meta values the server
checks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from autoencoder.coded import encode_update
from client.drencoder.round_codec import round_codec
from common.config import RunConfig
from common.models import AdapterState
from common.privacy.release import clip_and_noise
from common.wire import TrainInstruction

Sent = tuple[AdapterState, dict]
#: (increment, instruction, run config, device, node state dir) -> (what is sent, extra reply meta)
ClientRelease = Callable[[AdapterState, TrainInstruction, RunConfig, torch.device, Path], Sent]


def release_none(increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device, state_dir) -> Sent:
    """No client-level release: the increment as it is."""
    return increment, {}


def release_gaussian(
    increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device, state_dir
) -> Sent:
    """The increment clipped to the run's C plus this client's noise share for the round."""
    return clip_and_noise(increment, cfg.clip, ins.noise_std), {}


def release_dr_encoder(
    increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device: torch.device, state_dir: Path
) -> Sent:
    """The increment encoded by the round's codec ({latent, dense entries}), then clipped and noised."""
    codec = round_codec(ins, device, state_dir)
    coded, _ = release_gaussian(encode_update(codec, increment), ins, cfg, device, state_dir)
    return coded, {"ae-version": str(ins.codec["ae-version"])}


CLIENT_RELEASES: dict[str, ClientRelease] = {
    "none": release_none,
    "gaussian": release_gaussian,
    "dr-encoder": release_dr_encoder,
}

__all__ = ["CLIENT_RELEASES", "ClientRelease"]
