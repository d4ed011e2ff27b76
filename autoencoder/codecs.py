"""Codecs: the flat float32 latent a client sends instead of its LoRA factor increments, and the way back.

A codec covers the factor entries named by its :class:`Layout` (dense entries such as a classifier head are
not encoded). ``encode`` takes an adapter-like dict (extra dense entries are ignored) and returns a
``(latent_size,)`` float32 tensor on the input's device; ``decode`` returns ``{name: (d, r)}`` float32 on the
latent's device.

- ``ae``: latent ``g · Enc(tiles / scale)``, ``num_images · c_k · (H/2^k) · (W/2^k)`` numbers; decode
  ``scale · Dec(z / g)``, untiled (:mod:`autoencoder.normalise` for the scale); ``g = 1`` for the paper's
  ``raw`` latent, and the ``homogeneous`` latent decodes positively homogeneously
  (:func:`autoencoder.train.calibrate_latent`).
- ``identity``: latent = the ``num_coords`` entries in layout order; decode is exact.
- ``constant-mean``: latent is empty (0 numbers, nothing is sent); decodes to the synthetic prior's mean
  whatever it gets.
- ``random-projection``: ``k`` numbers (default: the ``ae`` latent size); decode projects back onto a
  seeded random ``k``-dimensional subspace (:class:`RandomProjectionCodec`).

- ``pca`` (:func:`fit_pca`, not yet a federation option): ``k`` numbers, the coordinates in an
  orthonormal basis fitted on public increments (their mean direction, then their top principal
  directions); decode maps back, so ``decode∘encode`` is the projection onto that subspace.

``identity``, ``random-projection`` and ``pca`` are linear; ``constant-mean`` is constant (the "learns nothing"
baseline of docs/design.md §6); ``ae`` is neither.

Each codec is registered by a :class:`CodecDescriptor` in :data:`CODEC_REGISTRY` (its facts:
common/codec_specs.py); :func:`make_codec` and a node's ``round_codec`` ask it, never compare a name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from autoencoder.checkpoint import ae_version
from autoencoder.layout import Layout
from autoencoder.train import TrainedAe
from common.codec_specs import CODEC_SPECS, CodecSpec
from common.errors import FedloraError


@runtime_checkable
class Codec(Protocol):
    name: str
    layout: Layout
    latent_size: int

    def encode(self, state: Mapping[str, Tensor]) -> Tensor:
        """Factors of ``layout`` → ``(latent_size,)`` float32."""
        ...

    def decode(self, latent: Tensor) -> dict[str, Tensor]:
        """``(latent_size,)`` → ``{name: (d, r)}`` float32 for every factor of ``layout``."""
        ...


def check_latent(latent: Tensor, size: int) -> Tensor:
    """``latent`` as float32 if it is a finite floating ``(size,)`` tensor, else :class:`FedloraError`."""
    if not isinstance(latent, Tensor) or tuple(latent.shape) != (size,) or not latent.is_floating_point():
        what = (
            f"{tuple(latent.shape)} {latent.dtype}" if isinstance(latent, Tensor) else type(latent).__name__
        )
        raise FedloraError(f"latent must be a floating ({size},) tensor, got {what}")
    if not torch.isfinite(latent).all():
        raise FedloraError("latent has non-finite values")
    return latent.float()


def _device(state: Mapping[str, Tensor], layout: Layout) -> torch.device:
    return state[layout.names[0]].device


class IdentityCodec:
    """Sends every factor entry: ``latent = layout.to_vector(state)``."""

    name = "identity"

    def __init__(self, layout: Layout) -> None:
        self.layout, self.latent_size = layout, layout.num_coords

    def encode(self, state: Mapping[str, Tensor]) -> Tensor:
        return self.layout.to_vector(state).float()

    def decode(self, latent: Tensor) -> dict[str, Tensor]:
        return self.layout.from_vector(check_latent(latent, self.latent_size))


class ConstantMeanCodec:
    """Sends nothing (latent size 0) and decodes to ``mean`` (the synthetic prior's ``E[X]``) whatever it gets."""

    name = "constant-mean"
    latent_size = 0

    def __init__(self, layout: Layout, mean: Mapping[str, Tensor]) -> None:
        layout.check_state(mean)
        self.layout = layout
        self.mean = {name: mean[name].detach().float().cpu().clone() for name in layout.names}

    def encode(self, state: Mapping[str, Tensor]) -> Tensor:
        self.layout.check_state(state)
        return torch.zeros(0, device=_device(state, self.layout))

    def decode(self, latent: Tensor) -> dict[str, Tensor]:
        check_latent(latent, 0)
        return {name: m.to(latent.device, copy=True) for name, m in self.mean.items()}


class AeCodec:
    """``latent = g · Enc(layout.to_images(x) / scale)`` flattened; ``decode = layout.from_images(scale · Dec(z / g))``,
    positively homogeneous when the autoencoder has a ``latent_norm`` (see :class:`TrainedAe`)."""

    name = "ae"

    def __init__(self, trained: TrainedAe, version: str | None = None, can_decode: bool = True) -> None:
        """``version``: the autoencoder's content hash (computed when not given); ``can_decode`` False for
        a client's encoder-only copy (:mod:`autoencoder.broadcast`)."""
        self.trained, self.layout = trained, trained.layout
        self.latent_shape = trained.latent_shape
        self.latent_size = math.prod(self.latent_shape)
        self.version = version or ae_version(trained)
        self.can_decode = can_decode

    @torch.no_grad()
    def encode(self, state: Mapping[str, Tensor]) -> Tensor:
        self.layout.check_state(state)
        ae = self.trained
        x = self.layout.to_images({n: state[n].to(ae.device, torch.float32) for n in self.layout.names})
        z = ae.latent_gain * ae.model.encode(x / ae.scale)
        return z.reshape(-1).to(_device(state, self.layout))

    @torch.no_grad()
    def decode(self, latent: Tensor) -> dict[str, Tensor]:
        if not self.can_decode:
            raise FedloraError("this is an encoder-only copy of the autoencoder; the server decodes")
        ae = self.trained
        u = check_latent(latent, self.latent_size).to(ae.device).reshape(self.latent_shape) / ae.latent_gain
        if ae.latent_norm > 0:  # homogeneous (autoencoder.train.calibrate_latent)
            length = u.norm()
            if length == 0:
                return {n: torch.zeros(s, device=latent.device) for n, s in self.layout.shapes.items()}
            x = (length / ae.latent_norm) * ae.model.decode(u * (ae.latent_norm / length)) * ae.scale
        else:
            x = ae.model.decode(u) * ae.scale
        return {name: t.to(latent.device) for name, t in self.layout.from_images(x).items()}


class RandomProjectionCodec:
    """Seeded block-diagonal Gaussian (JL) projection to ``k`` numbers, decoded with its pseudo-inverse.

    The ``D = num_coords`` entries are permuted by a seeded permutation ``π`` and split into ``nb`` near-equal
    blocks, ``nb = min(ceil(D / block), k)``; block ``b`` (``D_b`` entries) gets ``k_b`` near-equal latent
    numbers (``1 ≤ k_b ≤ D_b``, ``Σ k_b = k``) and ``Q_b: (D_b, k_b)``, orthonormal columns of a seeded Gaussian
    (QR). ``z_b = sqrt(D_b / k_b) · Q_bᵀ x_b`` (so ``E‖z‖² = ‖x‖²``) and ``x̂_b = sqrt(k_b / D_b) · Q_b z_b``:
    ``decode∘encode`` is the orthogonal projection onto a random ``k``-dimensional subspace and
    ``encode∘decode`` is the identity. Memory: ``O(D)`` plus one ``Q_b`` (``≈ block · k / nb`` floats); all
    ``Q_b`` (``≈ k · D / nb`` floats) are kept only if they fit in ``cache_floats``, else rebuilt per call.
    """

    name = "random-projection"

    def __init__(
        self, layout: Layout, latent_size: int, seed: int = 0, block: int = 4096, cache_floats: int = 2**25
    ) -> None:
        D, k = layout.num_coords, latent_size
        if not 1 <= k <= D:
            raise FedloraError(f"random-projection latent size must be in [1, {D}], got {k}")
        if block < 1:
            raise FedloraError(f"random-projection block must be >= 1, got {block}")
        self.layout, self.latent_size, self.seed = layout, k, seed
        self.perm = torch.randperm(D, generator=torch.Generator().manual_seed(seed))
        nb = min(math.ceil(D / block), k)
        self.in_sizes = [D // nb + (b < D % nb) for b in range(nb)]
        self.out_sizes = [k // nb + (b < k % nb) for b in range(nb)]
        cached = sum(d * q for d, q in zip(self.in_sizes, self.out_sizes, strict=True)) <= cache_floats
        self._cache = [self._basis(b) for b in range(nb)] if cached else None

    def _basis(self, b: int) -> Tensor:
        """``Q_b: (D_b, k_b)`` float32 on the CPU, from the seed and the block index only."""
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + b + 1) % 2**63)
        gauss = torch.randn(self.in_sizes[b], self.out_sizes[b], generator=g, dtype=torch.float64)
        return torch.linalg.qr(gauss).Q.float()

    def _bases(self) -> Iterator[Tensor]:
        for b in range(len(self.in_sizes)):
            yield self._cache[b] if self._cache is not None else self._basis(b)

    def encode(self, state: Mapping[str, Tensor]) -> Tensor:
        x = self.layout.to_vector(state).float()
        parts = x[self.perm.to(x.device)].split(self.in_sizes)
        z = [
            math.sqrt(d / q) * (Q.to(x.device).T @ p)
            for p, Q, d, q in zip(parts, self._bases(), self.in_sizes, self.out_sizes, strict=True)
        ]
        return torch.cat(z)

    def decode(self, latent: Tensor) -> dict[str, Tensor]:
        z = check_latent(latent, self.latent_size)
        parts = z.split(self.out_sizes)
        xp = torch.cat(
            [
                math.sqrt(q / d) * (Q.to(z.device) @ p)
                for p, Q, d, q in zip(parts, self._bases(), self.in_sizes, self.out_sizes, strict=True)
            ]
        )
        x = torch.empty_like(xp)
        x[self.perm.to(z.device)] = xp
        return self.layout.from_vector(x)


class PcaCodec:
    """``z = Qᵀ x``, ``x̂ = Q z`` with ``Q: (D, k)`` orthonormal columns (float32): linear and norm-preserving
    on the subspace, so a clip of the latent is a clip of the decoded increment."""

    name = "pca"

    def __init__(self, layout: Layout, basis: Tensor, version: str | None = None) -> None:
        if basis.ndim != 2 or basis.shape[0] != layout.num_coords:
            raise FedloraError(f"pca basis must be ({layout.num_coords}, k), got {tuple(basis.shape)}")
        self.layout, self.basis = layout, basis.float().contiguous()
        self.latent_size = basis.shape[1]
        self.version = version  # names the basis in a round (dr-encoder release), None elsewhere

    def encode(self, state: Mapping[str, Tensor]) -> Tensor:
        x = self.layout.to_vector(state).float()
        return self.basis.to(x.device).T @ x

    def decode(self, latent: Tensor) -> dict[str, Tensor]:
        z = check_latent(latent, self.latent_size)
        return self.layout.from_vector(self.basis.to(z.device) @ z)


def fit_pca(layout: Layout, samples: Tensor, k: int) -> PcaCodec:
    """The ``pca`` codec of ``k`` numbers fitted on ``samples: (n, D)`` (flattened increments in layout
    order): the basis is the samples' mean direction followed by the top ``k - 1`` principal directions
    of the samples with that direction projected out (float64 SVD). Needs ``1 <= k <= min(D, n)``."""
    n, D = samples.shape
    if layout.num_coords != D:
        raise FedloraError(f"pca samples have {D} coordinates, the layout {layout.num_coords}")
    if not 1 <= k <= D:
        raise FedloraError(f"pca latent size must be in [1, {D}] (the factor entries), got {k}")
    if k > n:
        raise FedloraError(f"pca latent size {k} exceeds the {n} public increments it is fitted on")
    x = samples.double()
    mean = x.mean(0)
    if mean.norm() == 0:
        raise FedloraError("pca samples have a zero mean: no direction to start the basis")
    first = mean / mean.norm()
    rest = x - mean
    rest = rest - (rest @ first)[:, None] * first[None, :]
    _, _, vh = torch.linalg.svd(rest, full_matrices=False)
    basis = torch.cat([first[:, None], vh[: k - 1].T], dim=1)
    basis, _ = torch.linalg.qr(basis)  # exact orthonormality in float64 (columns keep their spans)
    return PcaCodec(layout, basis)


def _build_ae(layout: Layout | None, trained: TrainedAe | None, **_) -> Codec:
    if trained is None:
        raise FedloraError("codec 'ae' needs a trained autoencoder")
    if layout != trained.layout:
        raise FedloraError("codec 'ae': the layout differs from the autoencoder's")
    return AeCodec(trained)


def _build_identity(layout: Layout, **_) -> Codec:
    return IdentityCodec(layout)


def _build_pca(layout: Layout, samples: Tensor | None, latent_size: int | None, **_) -> Codec:
    if samples is None or latent_size is None:
        raise FedloraError("codec 'pca' is fitted: it needs samples (public increments) and a latent size")
    return fit_pca(layout, samples, latent_size)


def _build_constant_mean(
    layout: Layout, trained: TrainedAe | None, mean: Mapping[str, Tensor] | None, **_
) -> Codec:
    if mean is None and trained is None:
        raise FedloraError("codec 'constant-mean' needs a mean (or a trained autoencoder's prior)")
    if mean is None:
        mean = trained.layout.from_images(trained.mean.cpu())
    return ConstantMeanCodec(layout, mean)


def _build_random_projection(
    layout: Layout, trained: TrainedAe | None, latent_size: int | None, seed: int, **_
) -> Codec:
    if latent_size is None:
        if trained is None:
            raise FedloraError("codec 'random-projection' needs a latent size (or a trained autoencoder)")
        latent_size = math.prod(trained.latent_shape)
    return RandomProjectionCodec(layout, latent_size, seed)


def _zero_mean(layout: Layout, latent_size: int, seed: int) -> Codec:
    """A node's ``constant-mean``: it sends nothing, so it needs no mean (its copy decodes to zeros;
    only the server decodes)."""
    return ConstantMeanCodec(layout, {n: torch.zeros(s) for n, s in layout.shapes.items()})


@dataclass(frozen=True)
class CodecDescriptor:
    """One codec: its facts (``spec``, common/codec_specs.py) and its builders.

    ``build``: the server's codec from :func:`make_codec`'s keyword arguments (``layout`` already
    taken from ``trained`` when absent; a codec that does not train an autoencoder gets one).
    ``node_copy(layout, latent_size, seed)``: the copy a node builds from the round's instruction to
    encode with; None when the server broadcasts it instead (the encoder or the basis:
    autoencoder/broadcast.py).
    """

    spec: CodecSpec
    build: Callable[..., Codec]
    node_copy: Callable[[Layout, int, int], Codec] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def broadcast(self) -> bool:
        return self.node_copy is None


#: name -> descriptor, one per spec of common/codec_specs.py, in ``--codec``'s order
CODEC_REGISTRY: dict[str, CodecDescriptor] = {
    d.name: d
    for d in (
        CodecDescriptor(CODEC_SPECS["ae"], _build_ae),
        CodecDescriptor(
            CODEC_SPECS["identity"], _build_identity, lambda layout, k, seed: IdentityCodec(layout)
        ),
        CodecDescriptor(CODEC_SPECS["constant-mean"], _build_constant_mean, _zero_mean),
        CodecDescriptor(CODEC_SPECS["random-projection"], _build_random_projection, RandomProjectionCodec),
        CodecDescriptor(CODEC_SPECS["pca"], _build_pca),
    )
}
CODECS = tuple(CODEC_REGISTRY)


def make_codec(
    name: str,
    *,
    layout: Layout | None = None,
    trained: TrainedAe | None = None,
    mean: Mapping[str, Tensor] | None = None,
    latent_size: int | None = None,
    seed: int = 0,
    samples: Tensor | None = None,
) -> Codec:
    """Build a codec by name (:data:`CODECS`).

    ``ae`` needs ``trained``. The others need a ``layout`` (default: ``trained.layout``); ``constant-mean``
    needs ``mean`` (default: ``trained``'s prior mean); ``random-projection`` takes ``latent_size`` (default:
    the ``ae`` latent size of ``trained``) and ``seed``; ``pca`` is fitted on ``samples: (n, D)`` with
    ``latent_size`` directions (:func:`fit_pca`).
    """
    descriptor = CODEC_REGISTRY.get(name)
    if descriptor is None:
        raise FedloraError(f"unknown codec '{name}'; choose one of {', '.join(CODECS)}")
    if layout is None and trained is not None:
        layout = trained.layout
    if layout is None and not descriptor.spec.trains_autoencoder:
        raise FedloraError(f"codec '{name}' needs a layout")
    return descriptor.build(
        layout=layout, trained=trained, mean=mean, latent_size=latent_size, seed=seed, samples=samples
    )
