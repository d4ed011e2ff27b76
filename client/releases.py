"""Client-level releases, client side: what leaves a client, by the run's release kind (named by
common/privacy/registry.py; server/releases holds the server sides).

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
from common.lazy import load_component
from common.models import AdapterState
from common.privacy.mechanisms.mechanism import run_mechanism
from common.privacy.registry import GENERIC_CLIENT, release_kind
from common.wire import TrainInstruction

Sent = tuple[AdapterState, dict]
#: (increment, instruction, run config, device, the node's encoder cache directory)
#:     -> (what is sent, extra reply meta)
ClientRelease = Callable[[AdapterState, TrainInstruction, RunConfig, torch.device, Path], Sent]


def release_none(
    increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device, encoder_cache
) -> Sent:
    """No client-level release: the increment as it is."""
    return increment, {}


def release_mechanism(
    increment: AdapterState, ins: TrainInstruction, cfg: RunConfig, device, encoder_cache
) -> Sent:
    """The client half of the run's mechanism (common/privacy/mechanisms/mechanism.py): the increment clipped to
    the round's C plus this client's noise share; with adaptive clipping also the bit [‖Δ‖ ≤ C]."""
    mechanism = run_mechanism(cfg)
    return mechanism.privatize(increment, ins.noise_std, mechanism.round_clip(ins.clip))


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
    coded, _ = release_mechanism(encode_update(codec, increment), ins, cfg, device, encoder_cache)
    return coded, {"ae-version": str(ins.codec["ae-version"])}


def client_release(kind: str) -> ClientRelease:
    """The client half of release ``kind``, named by the registry (common/privacy/registry.py; a kind
    without one of its own: :func:`release_mechanism`, its mechanism's)."""
    return load_component(release_kind(kind).client or GENERIC_CLIENT)


__all__ = ["ClientRelease", "client_release", "release_dr_encoder", "release_mechanism", "release_none"]
