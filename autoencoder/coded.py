"""A client's update in coded form: the codec's latent for the LoRA factors, the dense entries as they are.

Adapter states can hold dense trainable entries besides the factors (a classification head, see
:func:`autoencoder.layout.is_factor`); a codec covers only the factors, so the coded update is
``{"latent": (k,), **dense}``: one flat dict that is clipped, noised and averaged like an increment.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from autoencoder.codecs import Codec

LATENT = "latent"


def coded_shapes(codec: Codec, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Shapes of the coded update of an adapter with ``shapes``."""
    dense = {name: tuple(s) for name, s in shapes.items() if name not in codec.layout.shapes}
    return {LATENT: (codec.latent_size,), **dense}


def encode_update(codec: Codec, increment: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``{"latent": codec.encode(factors), **dense entries}``."""
    dense = {name: t for name, t in increment.items() if name not in codec.layout.shapes}
    return {LATENT: codec.encode(increment), **dense}


def decode_update(codec: Codec, coded: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`encode_update` up to the codec's error: the increment with every factor and dense entry."""
    dense = {name: t for name, t in coded.items() if name != LATENT}
    return {**codec.decode(coded[LATENT]), **dense}


__all__ = ["LATENT", "coded_shapes", "decode_update", "encode_update"]
