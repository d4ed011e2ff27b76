"""What a client sends as its round increment: the raw factor change, or a gauge-fixed form of it.

``raw``: ``(dA, dB) = (A' − A, B' − B)`` per module, dense entries ``θ' − θ``. The split of a change of
``Z = A Bᵀ`` between ``dA`` and ``dB`` depends on the factorisation (``(A G, B G⁻ᵀ)`` is the same model),
so its norm and its statistics do too (docs/design.md §2).

``horizontal``: PRISM's horizontal (minimum-factor-norm) lift of the same first-order change
``dA Bᵀ + A dBᵀ`` at the global factors (PRISM Prop. A.11; docs/design.md §7.6;
:func:`client.dp.prism.horizontalize`): ``(dA + AΩ, dB − BΩᵀ)`` with ``AᵀdA' = dB'ᵀB``. The first-order
change of ``Z`` is kept exactly and the gauge (vertical) component is removed; the second-order term
``dA dBᵀ`` that adding the factors also applies is not kept (at PEFT's init, ``A = 0``, the lift keeps
``dA`` and projects ``dB`` off ``span(B)``). Dense entries stay raw.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from client.dp.prism import geometry, horizontalize
from common.config import INCREMENT_FORMS


def increment(local: Mapping[str, Tensor], start: Mapping[str, Tensor], form: str) -> dict[str, Tensor]:
    """The increment from ``start`` (the round's global adapter state) to ``local``, same names, shapes
    and dtypes; ``form`` one of :data:`INCREMENT_FORMS`."""
    if form not in INCREMENT_FORMS:
        raise ValueError(f"unknown increment form {form!r}")
    out = {k: local[k] - start[k] for k in start}
    if form == "raw":
        return out
    modules = [k.removesuffix(".A") for k in start if k.endswith(".A")]
    for a, b in ((m + ".A", m + ".B") for m in modules if m + ".B" in start):
        dA, dB = horizontalize(geometry(start[a], start[b]), out[a], out[b])
        out[a], out[b] = dA.to(start[a].dtype), dB.to(start[b].dtype)
    return out


__all__ = ["INCREMENT_FORMS", "increment"]
