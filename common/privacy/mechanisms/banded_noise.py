"""The streaming noise of a banded Toeplitz strategy: round t's ``w_t = (C⁻¹z)_t`` from fresh z_t and the
last b−1 outputs, never the whole matrix (Algorithm 9 of Choquette-Choo et al. 2023; jax_privacy
``toeplitz.inverse_as_streaming_matrix``):

    w_t = (z_t − Σ_{j=1}^{min(t, b−1)} c_j · w_{t−j}) / c_0                       (C w = z, row t)

z_t ~ N(0, 1) per coordinate, drawn from a generator seeded by OS entropy (never the run's seed);
the caller scales w_t by σζ. The state (the round index and the last b−1 outputs, float64) is a
secret: with it, a reader subtracts those rounds' noise from the released means. It is kept apart
from anything a checkpoint shares.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from common.models import AdapterState


def standard_normal(shapes: Mapping[str, Sequence[int]]) -> AdapterState:
    """Fresh N(0, 1) float64 tensors of ``shapes``, from a generator seeded by OS entropy."""
    gen = torch.Generator().manual_seed(secrets.randbits(63))
    return {k: torch.randn(tuple(s), generator=gen, dtype=torch.float64) for k, s in shapes.items()}


class BandedNoise:
    """The stream of w_t for coefficients ``coefs`` (c_0 > 0), from round ``index`` with the
    outputs ``past`` (most recent first, at most b−1)."""

    def __init__(self, coefs: Sequence[float], index: int = 0, past: Sequence[AdapterState] = ()) -> None:
        self.coefs, self.index = [float(c) for c in coefs], index
        if not self.coefs or self.coefs[0] <= 0:
            raise ValueError("a banded strategy needs c_0 > 0")
        if len(past) > min(index, len(self.coefs) - 1):
            raise ValueError(
                f"{len(past)} past outputs for round {index} of a {len(self.coefs)}-band strategy"
            )
        self.past: list[AdapterState] = [dict(w) for w in past]

    def next(self, z: AdapterState) -> AdapterState:
        """w_t for this round's fresh ``z`` (float64), and the stream one round on."""
        w = {}
        for name, zt in z.items():
            acc = zt.to(torch.float64).clone()
            for j, prev in enumerate(self.past, start=1):
                acc.sub_(prev[name], alpha=self.coefs[j])
            w[name] = acc.div_(self.coefs[0])
        self.past = [w, *self.past][: len(self.coefs) - 1]
        self.index += 1
        return w

    def tensors(self) -> dict[str, Tensor]:
        """The stream's state as flat tensors (``past.<j>.<name>``), for a safetensors file."""
        out = {"index": torch.tensor([self.index], dtype=torch.int64)}
        for j, w in enumerate(self.past):
            out.update({f"past.{j}.{name}": t for name, t in w.items()})
        return out

    @classmethod
    def from_tensors(cls, coefs: Sequence[float], tensors: Mapping[str, Tensor]) -> BandedNoise:
        """The stream :meth:`tensors` saved."""
        past: dict[int, AdapterState] = {}
        for key, t in tensors.items():
            if key.startswith("past."):
                j, _, name = key[len("past.") :].partition(".")
                past.setdefault(int(j), {})[name] = t.to(torch.float64)
        return cls(coefs, int(tensors["index"][0]), [past[j] for j in sorted(past)])


__all__ = ["BandedNoise", "standard_normal"]
