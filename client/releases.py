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
from common.errors import FedloraError
from common.models import AdapterState
from common.privacy.plan import plan_noise
from common.privacy.release import add_noise, clip
from common.wire import CLIP_BIT, TrainInstruction

Sent = tuple[AdapterState, dict]
#: (increment, instruction, run config, device, the node's encoder cache directory)
#:     -> (what is sent, extra reply meta)
ClientRelease = Callable[[AdapterState, TrainInstruction, RunConfig, torch.device, Path], Sent]


def release_none(
    increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device, encoder_cache
) -> Sent:
    """No client-level release: the increment as it is."""
    return increment, {}


def round_clip(ins: TrainInstruction, cfg: RunConfig) -> float:
    """The C this round clips to: the server's under adaptive clipping, else the run config's."""
    if not cfg.adaptive_clip:
        return cfg.clip
    if ins.clip <= 0:
        raise FedloraError("an adaptive-clipping round must name its clip (> 0)")
    return ins.clip


def release_gaussian(
    increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device, encoder_cache
) -> Sent:
    """The increment clipped to the round's C plus this client's noise share for the round; with
    adaptive clipping also the bit [‖Δ‖ ≤ C], with its noise share under distributed noise."""
    bound = round_clip(ins, cfg)
    clipped, norm = clip(increment, bound)
    sent = add_noise(clipped, ins.noise_std)
    if not cfg.adaptive_clip:
        return sent, {}
    plan = plan_noise(cfg)
    # the count's share is sized like the update's: σ_b/sqrt(m) against z_Δ·C/sqrt(m) (distributed
    # noise); no share where the client adds no update noise (central: the server noises the count)
    share = ins.noise_std * plan.count_std / (plan.update_sigma * bound) if ins.noise_std else 0.0
    sent[CLIP_BIT] = add_noise({CLIP_BIT: torch.tensor([float(norm <= bound)])}, share)[CLIP_BIT]
    return sent, {"clip": bound}


def release_dr_encoder(
    increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device: torch.device, encoder_cache: Path
) -> Sent:
    """The increment encoded by the round's codec ({latent, dense entries}), then clipped and noised;
    with ``--encode-at server`` (central noise only, checked by the run config) the raw increment: the
    trusted server encodes, clips and noises it."""
    site = str(ins.codec.get("encode-at", "client"))
    if site != cfg.encode_at:
        raise FedloraError(f"the round asks to encode at the {site}, the run config says {cfg.encode_at}")
    if site == "server":
        return increment, {"ae-version": str(ins.codec["ae-version"])}
    codec = round_codec(ins, device, encoder_cache)
    coded, _ = release_gaussian(encode_update(codec, increment), ins, cfg, device, encoder_cache)
    return coded, {"ae-version": str(ins.codec["ae-version"])}


CLIENT_RELEASES: dict[str, ClientRelease] = {
    "none": release_none,
    "gaussian": release_gaussian,
    "dr-encoder": release_dr_encoder,
}

__all__ = ["CLIENT_RELEASES", "ClientRelease"]
