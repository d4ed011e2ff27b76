"""The codec a ``dr-encoder`` train round asks for, built from the round's instruction.

``ae``: the encoder broadcast (autoencoder/broadcast.py), rebuilt once per autoencoder version and
process; ``identity`` and ``random-projection``: from the layout (and latent size and seed);
``constant-mean``: sends nothing, so the client needs no mean (its copy decodes to zeros; only the
server decodes).
"""

from __future__ import annotations

import torch
from flwr.app import RecordDict

from autoencoder.broadcast import encoder_from_payload
from autoencoder.codecs import Codec, ConstantMeanCodec, IdentityCodec, RandomProjectionCodec
from autoencoder.layout import Layout
from common.errors import FedloraError

_ENCODERS: dict[str, Codec] = {}  # ae version -> encode-only codec
_MAX_CACHED = 2


def round_codec(content: RecordDict, device: torch.device) -> Codec:
    """The codec named by ``content["config"]``; :class:`FedloraError` if it cannot be built."""
    cfg = content["config"]
    name, layout = str(cfg["codec"]), Layout.from_json(str(cfg["layout"]))
    if name == "identity":
        return IdentityCodec(layout)
    if name == "random-projection":
        return RandomProjectionCodec(layout, int(cfg["latent-size"]), int(cfg["codec-seed"]))
    if name == "constant-mean":
        return ConstantMeanCodec(layout, {n: torch.zeros(s) for n, s in layout.shapes.items()})
    if name != "ae":
        raise FedloraError(f"unknown codec '{name}'")
    version = str(cfg["ae-version"])
    if version not in _ENCODERS:
        if "encoder" not in content or "encoder-meta" not in content:
            raise FedloraError(f"the round names autoencoder {version} but carries no encoder")
        tensors = content["encoder"].to_torch_state_dict()
        codec = encoder_from_payload(tensors, dict(content["encoder-meta"]), device)
        if codec.version != version or codec.layout != layout:
            raise FedloraError(f"the encoder broadcast is {codec.version}, the round names {version}")
        while len(_ENCODERS) >= _MAX_CACHED:
            _ENCODERS.pop(next(iter(_ENCODERS)))
        _ENCODERS[version] = codec
    return _ENCODERS[version]


__all__ = ["round_codec"]
