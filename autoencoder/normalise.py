"""Fixed scales from the synthetic prior, so that the autoencoder sees O(1) inputs.

The autoencoder runs on ``x / scale`` and its output is scaled back: ``x̂ = scale · Dec(Enc(x / scale))``.
The scale map ``(num_images, 1, H, W)`` depends on the statistics only (the prior's ``E[X²] = m² + s²``),
so the server and every client hold the same one (it is stored with the autoencoder); nothing per client
is sent. Modes:

- ``none``: scale 1.
- ``image``: one scale per tile image, ``sqrt(mean E[X²])`` over the image's real entries.
- ``factor``: one scale per factor, ``sqrt(mean E[X²])`` over its entries (padding keeps scale 1).

Scales are floored at ``floor`` so that an all-zero prior does not divide by zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from autoencoder.layout import Layout
from autoencoder.synthetic import Stats, prior_moments
from common.errors import FedloraError

NORMALISATIONS = ("none", "image", "factor")


def scale_map(layout: Layout, stats_list: Sequence[Stats], mode: str, floor: float = 1e-12) -> Tensor:
    """``(num_images, 1, H, W)`` float32 scales on the CPU; see the module docstring."""
    if mode not in NORMALISATIONS:
        raise FedloraError(f"unknown normalisation '{mode}'; choose one of {', '.join(NORMALISATIONS)}")
    if mode == "none":
        return torch.ones(layout.image_shape)
    _, second = prior_moments(stats_list, layout.shapes)
    mask = layout.mask()
    if mode == "factor":
        rms = {
            name: torch.full(shape, float(second[name].mean().sqrt()))
            for name, shape in layout.shapes.items()
        }
        return layout.to_images(rms).clamp(min=floor) * mask + (1 - mask)
    per_image = (layout.to_images(second) * mask).sum((1, 2, 3)) / mask.sum((1, 2, 3))
    return per_image.sqrt().clamp(min=floor)[:, None, None, None].expand(layout.image_shape).contiguous()


def mean_images(layout: Layout, stats_list: Sequence[Stats]) -> Tensor:
    """The prior's mean ``E[X]`` tiled, ``(num_images, 1, H, W)`` float32 (what ``constant-mean`` decodes to)."""
    first, _ = prior_moments(stats_list, layout.shapes)
    return layout.to_images(first)
