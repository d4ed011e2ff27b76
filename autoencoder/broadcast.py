"""What the server broadcasts so that clients can encode: the encoder half of a trained autoencoder,
or the basis of a ``pca`` codec (:func:`pca_payload`: tensor ``basis`` ``(D, k)``, metadata ``format``
:data:`PCA_FORMAT`, ``ae_version`` (the basis' content hash) and ``layout``).

Clients only encode, so they get the encoder's parameters (``in_conv``, ``down``, ``enc_blocks`` of
:class:`Uformer`) and the scale map; the decoder and the prior mean stay on the server. Tensors:
``encoder.<parameter>`` and ``scale`` ``(num_images, 1, H, W)``. Metadata (strings): ``format``
(:data:`BROADCAST_FORMAT`), ``ae_version`` (the full autoencoder's content hash, which names it in every
train round), ``config`` (:class:`AeConfig` JSON), ``layout`` (:class:`Layout` JSON), ``normalise``,
``latent_gain`` (the encoder output's multiplier, a float's repr).
Everything is checked against the configuration before use; nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping

import torch
from torch import Tensor

from autoencoder.codecs import AeCodec, PcaCodec
from autoencoder.layout import Layout
from autoencoder.train import TrainedAe
from autoencoder.uformer import AeConfig, Uformer
from common.errors import FedloraError

BROADCAST_FORMAT = "fedlora-ae-encoder/1"
PCA_FORMAT = "fedlora-pca-basis/1"
ENCODER_MODULES = ("in_conv.", "down.", "enc_blocks.")
PREFIX = "encoder."


def encoder_payload(trained: TrainedAe, version: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``(tensors, metadata)`` that :func:`encoder_from_payload` turns back into an encode-only codec."""
    tensors = {
        PREFIX + k: v.detach().cpu().float().contiguous()
        for k, v in trained.model.state_dict().items()
        if k.startswith(ENCODER_MODULES)
    }
    tensors["scale"] = trained.scale.detach().cpu().float().contiguous()
    meta = {
        "format": BROADCAST_FORMAT,
        "ae_version": version,
        "config": json.dumps(trained.config.to_dict()),
        "layout": trained.layout.to_json(),
        "normalise": trained.normalise,
        "latent_gain": repr(float(trained.latent_gain)),
    }
    return tensors, meta


def encoder_from_payload(
    tensors: Mapping[str, Tensor], meta: Mapping[str, str], device: torch.device | str = "cpu"
) -> AeCodec:
    """An ``ae`` codec that can encode (its ``decode`` refuses); :class:`FedloraError` on any mismatch."""
    if meta.get("format") != BROADCAST_FORMAT:
        raise FedloraError(f"not an encoder broadcast (format {meta.get('format')!r})")
    try:
        config = AeConfig.from_dict(json.loads(str(meta["config"])))
        layout = Layout.from_json(str(meta["layout"]))
        normalise, version = str(meta["normalise"]), str(meta["ae_version"])
        gain = float(str(meta["latent_gain"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise FedloraError(f"malformed encoder broadcast: {exc}") from None
    model = Uformer(config)
    expected = {k: v.shape for k, v in model.state_dict().items() if k.startswith(ENCODER_MODULES)}
    got = {k[len(PREFIX) :]: v for k, v in tensors.items() if k.startswith(PREFIX)}
    if set(got) != set(expected) or set(tensors) != {PREFIX + k for k in expected} | {"scale"}:
        raise FedloraError("encoder broadcast: parameter names differ from the configured encoder")
    for name, t in [*got.items(), ("scale", tensors["scale"])]:
        want = expected.get(name, layout.image_shape)
        if tuple(t.shape) != tuple(want) or t.dtype != torch.float32 or not torch.isfinite(t).all():
            raise FedloraError(f"encoder broadcast: '{name}' is not a finite float32 {tuple(want)}")
    scale = tensors["scale"]
    if not (scale > 0).all():
        raise FedloraError("encoder broadcast: the scale map must be positive")
    if not (math.isfinite(gain) and gain > 0):
        raise FedloraError(f"encoder broadcast: latent gain must be finite and > 0, got {gain}")
    model.load_state_dict(got, strict=False)
    device = torch.device(device)
    zeros = torch.zeros(layout.image_shape, device=device)
    trained = TrainedAe(config, layout, model.to(device).eval(), scale.to(device), zeros, normalise, {}, gain)
    return AeCodec(trained, version=version, can_decode=False)


def basis_version(basis: Tensor) -> str:
    """``pca-<12 hex>``: the content hash that names a basis in every train round."""
    data = basis.detach().cpu().float().contiguous().numpy().tobytes()
    return "pca-" + hashlib.sha256(data).hexdigest()[:12]


def pca_payload(codec: PcaCodec) -> tuple[dict[str, Tensor], dict[str, str]]:
    """``(tensors, metadata)`` of a ``pca`` codec's basis for :func:`codec_from_payload`."""
    meta = {"format": PCA_FORMAT, "ae_version": str(codec.version), "layout": codec.layout.to_json()}
    return {"basis": codec.basis.detach().cpu().float().contiguous()}, meta


def _pca_from_payload(tensors: Mapping[str, Tensor], meta: Mapping[str, str], device) -> PcaCodec:
    try:
        layout, version = Layout.from_json(str(meta["layout"])), str(meta["ae_version"])
    except (KeyError, ValueError, TypeError) as exc:
        raise FedloraError(f"malformed pca broadcast: {exc}") from None
    basis = tensors.get("basis")
    if set(tensors) != {"basis"} or basis is None or basis.ndim != 2 or basis.dtype != torch.float32:
        raise FedloraError("pca broadcast: expected one float32 tensor 'basis' (D, k)")
    if basis.shape[0] != layout.num_coords or not 1 <= basis.shape[1] <= basis.shape[0]:
        raise FedloraError(f"pca broadcast: basis {tuple(basis.shape)} does not fit D = {layout.num_coords}")
    if not torch.isfinite(basis).all() or basis_version(basis) != version:
        raise FedloraError(f"pca broadcast: the basis is not finite or is not version {version}")
    return PcaCodec(layout, basis.to(torch.device(device)), version=version)


def codec_from_payload(
    tensors: Mapping[str, Tensor], meta: Mapping[str, str], device: torch.device | str = "cpu"
) -> AeCodec | PcaCodec:
    """The encode-side codec of a broadcast, by its ``format`` (an autoencoder's encoder or a pca basis)."""
    if meta.get("format") == PCA_FORMAT:
        return _pca_from_payload(tensors, meta, device)
    return encoder_from_payload(tensors, meta, device)


__all__ = [
    "BROADCAST_FORMAT",
    "PCA_FORMAT",
    "basis_version",
    "codec_from_payload",
    "encoder_from_payload",
    "encoder_payload",
    "pca_payload",
]
