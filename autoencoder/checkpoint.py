"""Trained-autoencoder checkpoints: one safetensors file, JSON metadata, a content-hash version.

Tensors: ``model.<parameter>`` (the :class:`Uformer` state dict), ``scale`` and ``mean``
(``(num_images, 1, H, W)``), and for a ``homogeneous`` latent ``latent`` = ``[gain, norm]`` (float64).
Metadata (strings): ``format`` (:data:`CHECKPOINT_FORMAT`), ``ae_version``, ``config`` (:class:`AeConfig` JSON), ``layout`` (:class:`Layout` JSON), ``normalise``, ``history`` (JSON).
The version ``ae-<16 hex>`` is a SHA-256 of the config, layout, normalisation and every tensor's bytes,
so equal versions mean equal encoders; loading recomputes it and refuses a file whose content does not match.
Never pickled; writes are atomic (temporary file + ``os.replace``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from autoencoder.layout import Layout
from autoencoder.train import TrainedAe
from autoencoder.uformer import AeConfig, Uformer
from common.atomic import replacing
from common.errors import FedloraError

CHECKPOINT_FORMAT = "fedlora-ae/1"


def _tensors(trained: TrainedAe) -> dict[str, Tensor]:
    out = {f"model.{k}": v.detach().cpu().contiguous() for k, v in trained.model.state_dict().items()}
    out["scale"] = trained.scale.detach().cpu().contiguous()
    out["mean"] = trained.mean.detach().cpu().contiguous()
    if trained.latent_norm > 0 or trained.latent_gain != 1:  # absent for the paper's raw latent
        out["latent"] = torch.tensor([trained.latent_gain, trained.latent_norm], dtype=torch.float64)
    return out


def _version(config: AeConfig, layout: Layout, normalise: str, tensors: dict[str, Tensor]) -> str:
    h = hashlib.sha256(CHECKPOINT_FORMAT.encode())
    h.update(json.dumps(config.to_dict(), sort_keys=True).encode())
    h.update(layout.to_json().encode())
    h.update(normalise.encode())
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.numpy().tobytes())
    return "ae-" + h.hexdigest()[:16]


def ae_version(trained: TrainedAe) -> str:
    """Content hash ``ae-<16 hex>`` of the encoder, decoder, layout and scales."""
    return _version(trained.config, trained.layout, trained.normalise, _tensors(trained))


def save_checkpoint(path: str | os.PathLike, trained: TrainedAe, overwrite: bool = False) -> str:
    """Write ``trained`` to ``path`` atomically; returns its version. Refuses an existing file unless ``overwrite``."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FedloraError(f"checkpoint '{path}' exists; refusing to overwrite it")
    tensors = _tensors(trained)
    version = _version(trained.config, trained.layout, trained.normalise, tensors)
    metadata = {
        "format": CHECKPOINT_FORMAT,
        "ae_version": version,
        "config": json.dumps(trained.config.to_dict()),
        "layout": trained.layout.to_json(),
        "normalise": trained.normalise,
        "history": json.dumps(trained.history),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)
    return version


def load_checkpoint(path: str | os.PathLike, device: torch.device | str = "cpu") -> tuple[TrainedAe, str]:
    """Read a checkpoint written by :func:`save_checkpoint`: ``(trained, version)``, the model in eval mode."""
    path = Path(path)
    if not path.is_file():
        raise FedloraError(f"autoencoder checkpoint '{path}' does not exist")
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
        tensors = load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise FedloraError(f"'{path}' is not a readable safetensors file: {exc}") from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise FedloraError(
            f"'{path}' is not a {CHECKPOINT_FORMAT} checkpoint (format {meta.get('format')!r})"
        )
    try:
        config = AeConfig.from_dict(json.loads(meta["config"]))
        layout = Layout.from_json(meta["layout"])
        normalise, version, history = meta["normalise"], meta["ae_version"], json.loads(meta["history"])
        model = Uformer(config)
        prefix = "model."
        model.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
        scale, mean = tensors["scale"], tensors["mean"]
        gain, norm = (float(v) for v in tensors.get("latent", torch.tensor([1.0, 0.0])).reshape(2))
    except (KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise FedloraError(
            f"'{path}' is a malformed autoencoder checkpoint: {str(exc).splitlines()[0]}"
        ) from None
    if not (gain > 0 and norm >= 0 and math.isfinite(gain) and math.isfinite(norm)):
        raise FedloraError(f"'{path}': latent gain {gain} / norm {norm} must be finite, > 0 and >= 0")
    if scale.shape != layout.image_shape or mean.shape != layout.image_shape:
        raise FedloraError(f"'{path}': scale/mean shapes do not match the layout {layout.image_shape}")
    if _version(config, layout, normalise, tensors) != version:
        raise FedloraError(f"'{path}' is corrupt: its content does not match its version {version}")
    device = torch.device(device)
    trained = TrainedAe(
        config,
        layout,
        model.to(device).eval(),
        scale.to(device),
        mean.to(device),
        normalise,
        history,
        gain,
        norm,
    )
    return trained, version
