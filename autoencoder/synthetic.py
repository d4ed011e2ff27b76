"""DR-Encoder gradient statistics (Algorithm 1) and the synthetic Gaussian gradients drawn from them.

Algorithm 1, per layer, per factor (``A`` or ``B``) and per local epoch, over local steps ``t`` with
the factor's gradient (or increment) ``X_t``::

    m  ← β1·m + (1−β1)·X
    v  ← min(max(‖X − m‖², h1), h2)        (uses the m just updated)
    s² ← β2·s² + (1−β2)·v

with ``β1 = 0.99``, ``β2 = 0.9``, ``h1 = 1e-5``, ``h2 = 1e-3`` and ``m = s² = 0`` at the start of an epoch.
``h1`` can be lowered (``floor``): the paper's value is set for per-step gradients and sits above the
squared entries of small increments (SmolLM2's at lr 3e-4), where it replaces every std by the floor.
The paper's text available to us does not say whether ``‖X − m‖²`` is a per-entry square or a matrix
norm. We run the recursion **per entry** (``deviation="element"``: ``(X − m)²`` and the clamp act on
each entry, so ``s`` is a per-entry standard deviation and ``N(m, s)`` is a per-entry draw).
``deviation="matrix"`` clamps the *mean* square ``‖X − m‖_F² / (d·r)`` instead (one ``v`` per matrix,
still a per-entry scale); the unnormalised norm would grow with ``√(d·r)`` and is not offered.

What is sent is :meth:`GradStats.export` at a chosen granularity: per ``matrix`` (two numbers, the
paper's payload size), per ``row``, per ``column`` (rank component) or per ``element``. Reduced moments are
those of the pooled entries (law of total variance): ``mean = ⟨m⟩``, ``std² = ⟨s²⟩ + ⟨(m − ⟨m⟩)²⟩``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from autoencoder.layout import Layout
from common.errors import FedloraError

BETA1, BETA2 = 0.99, 0.9
H1, H2 = 1e-5, 1e-3
DEVIATIONS = ("element", "matrix")
GRANULARITIES = ("matrix", "row", "column", "element")

#: ``name -> (mean, std)``, both broadcastable to the factor's shape ``(d, r)``.
Stats = Mapping[str, tuple[Tensor, Tensor]]


@dataclass
class GradStats:
    """Running Algorithm 1 state of one factor: ``m, s2: (d, r)`` (``s2: ()`` with ``deviation="matrix"``)."""

    m: Tensor
    s2: Tensor
    steps: int = 0
    deviation: str = "element"
    floor: float = H1

    @classmethod
    def zeros(
        cls,
        shape: tuple[int, ...],
        deviation: str = "element",
        device: torch.device | str | None = None,
        floor: float = H1,
    ) -> GradStats:
        if deviation not in DEVIATIONS:
            raise FedloraError(f"unknown deviation '{deviation}'; choose one of {', '.join(DEVIATIONS)}")
        if not 0 < floor <= H2:
            raise FedloraError(f"statistics floor h1 must be in (0, {H2:g}], got {floor}")
        s2_shape = tuple(shape) if deviation == "element" else ()
        z = torch.zeros(shape, dtype=torch.float64, device=device)
        return cls(z, torch.zeros(s2_shape, dtype=torch.float64, device=device), 0, deviation, floor)

    def update(self, x: Tensor) -> GradStats:
        """One step of Algorithm 1 with ``x`` of the factor's shape (kept in float64); returns ``self``."""
        if x.shape != self.m.shape:
            raise FedloraError(
                f"gradient of shape {tuple(x.shape)} for statistics of shape {tuple(self.m.shape)}"
            )
        x = x.detach().to(self.m)
        self.m = BETA1 * self.m + (1 - BETA1) * x
        dev2 = (x - self.m) ** 2
        v = (dev2 if self.deviation == "element" else dev2.mean()).clamp(self.floor, H2)
        self.s2 = BETA2 * self.s2 + (1 - BETA2) * v
        self.steps += 1
        return self

    def export(self, granularity: str = "matrix", debias: bool = False) -> tuple[Tensor, Tensor]:
        """``(mean, std)`` float32, broadcastable to ``(d, r)``: ``matrix`` → ``()``, ``row`` → ``(d, 1)``,
        ``column`` → ``(1, r)``, ``element`` → ``(d, r)``.

        ``debias``: divide ``m`` by ``1 − β1^t`` and ``s²`` by ``1 − β2^t`` (Adam's correction for the zero
        start; not in the paper, which leaves ``m`` shrunk towards 0 after few steps).
        """
        if granularity not in GRANULARITIES:
            raise FedloraError(
                f"unknown granularity '{granularity}'; choose one of {', '.join(GRANULARITIES)}"
            )
        if self.steps == 0:
            raise FedloraError("no gradient was recorded; statistics are undefined")
        m, s2 = self.m, self.s2.expand_as(self.m)
        if debias:
            m, s2 = m / (1 - BETA1**self.steps), s2 / (1 - BETA2**self.steps)
        if granularity == "element":
            return m.float(), s2.sqrt().float()
        dims = {"matrix": (0, 1), "row": (1,), "column": (0,)}[granularity]
        keep = granularity != "matrix"
        mean = m.mean(dims, keepdim=keep)
        var = (s2 + (m - m.mean(dims, keepdim=True)) ** 2).mean(dims, keepdim=keep)
        return mean.float(), var.sqrt().float()


def track(
    shapes: Mapping[str, tuple[int, ...]], deviation: str = "element", floor: float = H1
) -> dict[str, GradStats]:
    """Fresh statistics for each entry of ``shapes`` (call again at each local epoch); ``floor``: h1."""
    return {name: GradStats.zeros(shape, deviation, floor=floor) for name, shape in shapes.items()}


def update_all(stats: Mapping[str, GradStats], grads: Mapping[str, Tensor]) -> None:
    """One Algorithm 1 step for every tracked factor; ``grads`` must hold each of them."""
    for name, st in stats.items():
        if name not in grads:
            raise FedloraError(f"no gradient for tracked factor '{name}'")
        st.update(grads[name])


def export_all(
    stats: Mapping[str, GradStats], granularity: str = "matrix", debias: bool = False
) -> dict[str, tuple[Tensor, Tensor]]:
    """``{name: (mean, std)}`` for every tracked factor; see :meth:`GradStats.export`."""
    return {name: st.export(granularity, debias) for name, st in stats.items()}


def empirical_stats(layout: Layout, samples: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-entry ``(mean, std)`` over the rows of ``samples: (n, D)`` (increments in ``layout``'s vector
    order), as ``{name: ((d, r), (d, r))}`` float32: the moments of a ``public`` prior."""
    x = samples.double()
    mean, std = x.mean(0), x.std(0, correction=0)
    means, stds = layout.from_vector(mean.float()), layout.from_vector(std.float())
    return {name: (means[name], stds[name]) for name in layout.names}


def pack_stats(stats: Stats, names: Sequence[str]) -> Tensor:
    """``(F, 2, w)`` float32: the ``matrix`` (``w = 1``) or ``column`` (``w = r``) moments of ``names``, in order."""
    rows = [torch.stack([t.float().reshape(-1) for t in stats[n]]) for n in names]
    if len({r.shape for r in rows}) > 1:
        raise FedloraError("pack_stats needs one granularity and one rank for all factors")
    return torch.stack(rows)


def unpack_stats(moments: Tensor, names: Sequence[str]) -> dict[str, tuple[Tensor, Tensor]]:
    """Inverse of :func:`pack_stats`: ``{name: (mean, std)}``, each ``(1, w)`` (broadcastable to ``(d, r)``)."""
    return {n: (moments[i, 0][None, :].clone(), moments[i, 1][None, :].clone()) for i, n in enumerate(names)}


def check_stats(stats: Stats, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Every name of ``shapes`` has finite ``(mean, std)`` broadcastable to its shape, ``std >= 0``."""
    for name, shape in shapes.items():
        if name not in stats:
            raise FedloraError(f"statistics lack factor '{name}'")
        mean, std = stats[name]
        for what, t in (("mean", mean), ("std", std)):
            try:
                fits = torch.broadcast_shapes(t.shape, tuple(shape)) == tuple(shape)
            except RuntimeError:
                fits = False
            if not fits:
                raise FedloraError(
                    f"{what} of '{name}' has shape {tuple(t.shape)}, not broadcastable to {shape}"
                )
            if not torch.isfinite(t).all():
                raise FedloraError(f"{what} of '{name}' is not finite")
        if (std < 0).any():
            raise FedloraError(f"std of '{name}' is negative")


def sample_gradients(
    stats: Stats, shapes: Mapping[str, tuple[int, ...]], n: int, generator: torch.Generator
) -> dict[str, Tensor]:
    """``n`` synthetic gradients per factor, ``X ~ N(mean, std²)`` entry-wise: ``{name: (n, *shape)}`` float32.

    Drawn on ``generator.device`` in the order of ``shapes``, so a seed reproduces the same batch.
    """
    check_stats(stats, shapes)
    device = generator.device
    out = {}
    for name, shape in shapes.items():
        mean, std = (t.to(device=device, dtype=torch.float32) for t in stats[name])
        noise = torch.randn((n, *shape), generator=generator, device=device)
        out[name] = mean + std * noise
    return out


def prior_moments(
    stats_list: Sequence[Stats], shapes: Mapping[str, tuple[int, ...]]
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Mean ``E[X]`` and second moment ``E[X²]``, ``(d, r)`` each, of the equal mixture of ``stats_list``."""
    if not stats_list:
        raise FedloraError("no statistics to build a prior from")
    first, second = {}, {}
    for name, shape in shapes.items():
        for stats in stats_list:
            check_stats(stats, {name: shape})
        means = [stats[name][0].float().cpu().expand(shape) for stats in stats_list]
        stds = [stats[name][1].float().cpu().expand(shape) for stats in stats_list]
        first[name] = torch.stack(means).mean(0)
        second[name] = torch.stack([m**2 + s**2 for m, s in zip(means, stds, strict=True)]).mean(0)
    return first, second
