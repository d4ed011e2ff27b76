"""The codec a ``dr-encoder`` train round asks for, built from the round's instruction.

A broadcast codec (``ae``, ``pca``: autoencoder/broadcast.py, the encoder or the public basis) is
rebuilt once per version and process; the others are the node's copy its descriptor builds
(autoencoder/codecs.py ``CodecDescriptor.node_copy``): ``identity`` and ``random-projection`` from the
layout (and latent size and seed); ``constant-mean`` sends nothing, so the client needs no mean (its
copy decodes to zeros; only the server decodes).

The server sends the encoder to a node until that node has answered a round with it; the node keeps
it in memory and in its encoder cache (``encoders/<version>.safetensors`` under the node's state
directory; one directory shared by all nodes of an in-process simulation), so a restarted node does
not need it again. A round that names an encoder the node does not hold fails with a clear
error, and the server sends it with the next round.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from autoencoder.broadcast import codec_from_payload
from autoencoder.codecs import CODEC_REGISTRY, Codec
from autoencoder.layout import Layout
from common.atomic import replacing
from common.errors import FedloraError
from common.wire import TrainInstruction

_ENCODERS: dict[str, Codec] = {}  # ae version -> encode-only codec
_MAX_CACHED = 2


def round_codec(ins: TrainInstruction, device: torch.device, cache_dir: Path | None = None) -> Codec:
    """The codec the instruction names; :class:`FedloraError` if it cannot be built.
    ``cache_dir``: where this node keeps encoders it has received."""
    cfg, content = ins.codec, ins.records
    name, layout = str(cfg["codec"]), Layout.from_json(str(cfg["layout"]))
    descriptor = CODEC_REGISTRY.get(name)
    if descriptor is None:
        raise FedloraError(f"unknown codec '{name}'")
    if not descriptor.broadcast:
        return descriptor.node_copy(layout, int(cfg["latent-size"]), int(cfg["codec-seed"]))
    version = str(cfg["ae-version"])
    received = "encoder" in content and "encoder-meta" in content
    if received or version not in _ENCODERS:
        if received:
            tensors, meta = content["encoder"].to_torch_state_dict(), dict(content["encoder-meta"])
        else:
            tensors, meta = _read(cache_dir, version)
        codec = codec_from_payload(tensors, meta, device)
        if codec.name != name or codec.version != version or codec.layout != layout:
            raise FedloraError(f"the encoder broadcast is {codec.version}, the round names {version}")
        if received and cache_dir is not None:
            _write(cache_dir, version, tensors, meta)
        _ENCODERS.pop(version, None)
        while len(_ENCODERS) >= _MAX_CACHED:
            _ENCODERS.pop(next(iter(_ENCODERS)))
        _ENCODERS[version] = codec
    return _ENCODERS[version]


def _path(cache_dir: Path, version: str) -> Path:
    if not version.replace("-", "").isalnum():
        raise FedloraError(f"malformed autoencoder version {version!r}")
    return cache_dir / "encoders" / f"{version}.safetensors"


def _read(cache_dir: Path | None, version: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    path = _path(cache_dir, version) if cache_dir is not None else None
    if path is None or not path.is_file():
        raise FedloraError(
            f"autoencoder {version} is not cached on this node and the round carries no encoder"
        )
    try:
        with safe_open(path, "pt") as f:
            meta = dict(f.metadata() or {})
        return load_file(path), meta
    except (SafetensorError, OSError, ValueError) as exc:
        raise FedloraError(f"cached encoder {path} is unreadable: {exc}") from None


def _write(cache_dir: Path, version: str, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    path = _path(cache_dir, version)
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=meta)


__all__ = ["round_codec"]
