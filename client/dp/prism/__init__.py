"""PRISM math (gauge-invariant tangent-space DP for LoRA) as pure tensor functions.

See docs/design.md §7 and the PRISM paper (Wang & Zhang, ICML 2026). Factors: ``A: (m, r)`` output
side, ``B: (n, r)`` input side, ``Z = A Bᵀ``.
"""

from client.dp.prism.adaptive import (
    AdaptiveSettings,
    Moments,
    adaptive_direction,
    dp_floors,
    init_moments,
    noise_second_moments,
    preconditioner,
)
from client.dp.prism.geometry import Geometry, as_compute, geometry, psd_eigh
from client.dp.prism.init import balanced_random_init, spectral_init
from client.dp.prism.retraction import procrustes_align, retract
from client.dp.prism.tangent import (
    clip_coefficients,
    horizontalize,
    lift,
    shape_noise,
    tangent_noise,
    tangent_sq_norm,
)

__all__ = [
    "AdaptiveSettings",
    "Geometry",
    "Moments",
    "adaptive_direction",
    "as_compute",
    "balanced_random_init",
    "clip_coefficients",
    "dp_floors",
    "geometry",
    "horizontalize",
    "init_moments",
    "lift",
    "noise_second_moments",
    "preconditioner",
    "procrustes_align",
    "psd_eigh",
    "retract",
    "shape_noise",
    "spectral_init",
    "tangent_noise",
    "tangent_sq_norm",
]
