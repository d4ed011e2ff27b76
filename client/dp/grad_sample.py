"""Per-example gradients of LoRA factors (and of dense trainable Linears such as a classifier head)
from layer activations and output gradients, as Opacus's linear grad sampler does.

For a PEFT LoRA Linear, ``y = base(x) + s · lora_B(lora_A(drop(x)))``. With ``x̃ = drop(x)``:
(b, T, n), ``h = x̃ lora_Aᵀ``: (b, T, r) and ``δ = ∂L/∂(lora_B output)``: (b, T, m) (it contains s),
the per-example weight gradients are ``∂L_i/∂lora_B = δ_iᵀ h_i`` and ``∂L_i/∂lora_A = (δ_i lora_B)ᵀ x̃_i``,
contracted over tokens: never an (m, n) per-example matrix. In paper factors
(``A = √s·lora_B``, ``B = √s·lora_Aᵀ``, common.models.lora) this is
``g_A,i = G_i B`` and ``g_B,i = G_iᵀ A`` with ``G_i = ∂L_i/∂Z`` (PRISM §3; docs/design.md §7.2).

Gradients are per example only if the loss is a **sum** of per-example losses (each example's loss
may average over its own tokens); the tasks' ``per_example_loss`` followed by ``.sum()`` is.

Cost (issue 54). Both factors' per-example gradients are materialised: ``b·T·r·(m + n)`` multiply-adds
a module, against ``b·T²·(m + n)`` for ghost norms (the Gram-matrix identity, which pays off for full
weights: client/dp/optimizers/dense.py), so for LoRA's width ``r < T`` the stored pieces are the
cheaper route to the norms, and the clipped sum is their reweighting (book-keeping: no second
backward). They are computed **inside the backward**, as each module's output gradient arrives, into
buffers stacked per :func:`shape_groups` (one ``(g, b, ·, r)`` tensor per group and factor): no layer
input or output gradient is held past its module's backward, and the optimizers norm, clip, sum and
noise a whole group per operation, so a step's operator count does not grow with the model's depth.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from peft.tuners.lora import LoraLayer
from torch import Tensor, nn

from common.models.lora import dense_trainables, lora_layers

NO_PASS = "no activations captured: run forward and backward inside the engine first"


def shape_groups(layers: Mapping[str, LoraLayer], adapter: str = "default") -> list[list[str]]:
    """Names of ``layers`` grouped by the shapes, dtype and device of their LoRA weights and by
    their scaling (model order within a group; groups in order of their first member): the modules
    whose per-example gradients, sums and updates are stacked into one tensor."""
    members: dict[tuple, list[str]] = {}
    for name, layer in layers.items():
        lora_b, lora_a = layer.lora_B[adapter].weight, layer.lora_A[adapter].weight
        key = (tuple(lora_b.shape), tuple(lora_a.shape), lora_b.dtype, lora_b.device, layer.scaling[adapter])
        members.setdefault(key, []).append(name)
    return list(members.values())


@dataclass(frozen=True)
class GradGroup:
    """Per-example paper-factor gradients of the modules ``names`` (one shape group), stacked:
    ``g_a: (g, b, m, r)``, ``g_b: (g, b, n, r)`` for ``g = len(names)`` modules and ``b`` examples."""

    names: tuple[str, ...]
    g_a: Tensor
    g_b: Tensor


class StackedGrads(Mapping[str, tuple[Tensor, Tensor]]):
    """Per-example gradients of every LoRA module of a batch, held stacked per shape group
    (:attr:`groups`) and read per module: ``grads[name] = (g_A: (b, m, r), g_B: (b, n, r))``."""

    def __init__(self, groups: Sequence[GradGroup]) -> None:
        self.groups = tuple(groups)
        self._where = {name: (k, i) for k, g in enumerate(self.groups) for i, name in enumerate(g.names)}

    @classmethod
    def of(cls, pairs: Mapping[str, tuple[Tensor, Tensor]], groups: Sequence[Sequence[str]]) -> StackedGrads:
        """Stack per-module ``pairs`` into ``groups`` (names as :func:`shape_groups` gives them)."""
        return cls(
            GradGroup(
                tuple(names),
                torch.stack([pairs[n][0] for n in names]),
                torch.stack([pairs[n][1] for n in names]),
            )
            for names in groups
        )

    def __getitem__(self, name: str) -> tuple[Tensor, Tensor]:
        k, i = self._where[name]
        return self.groups[k].g_a[i], self.groups[k].g_b[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


def stacked(
    grads: Mapping[str, tuple[Tensor, Tensor]], groups: Sequence[Sequence[str]]
) -> tuple[GradGroup, ...]:
    """``grads`` stacked per ``groups``: a :class:`StackedGrads` grouped that way as it is (no copy),
    anything else (a plain dict, another grouping) restacked."""
    if isinstance(grads, StackedGrads) and [list(g.names) for g in grads.groups] == [list(n) for n in groups]:
        return grads.groups
    return StackedGrads.of(grads, groups).groups


def per_module(groups: Sequence[Sequence[str]], stacks: Sequence[Sequence[Tensor | None]]) -> dict[str, list]:
    """``{module: [each of its group's stacks at the module's index (None stays None)]}``: per-module
    views of per-group ``(g, ...)`` stacks, ``stacks[k]`` belonging to ``groups[k]``."""
    return {
        name: [None if t is None else t[i] for t in group_stacks]
        for names, group_stacks in zip(groups, stacks, strict=True)
        for i, name in enumerate(names)
    }


def factor_grads_into(
    x: Tensor, h: Tensor, delta: Tensor, lora_b: Tensor, root: float, out_a: Tensor, out_b: Tensor
) -> None:
    """One module's per-example paper-factor gradients: ``out_a = δᵀh/√s``: (b, m, r) and
    ``out_b = x̃ᵀ(δ lora_B)/√s``: (b, n, r), from ``x̃: (b, T, n)``, ``h: (b, T, r)``,
    ``δ: (b, T, m)`` and ``lora_B``'s weight ``(m, r)``; each in one batched product."""
    torch.baddbmm(out_a, delta.mT, h, beta=0, alpha=1 / root, out=out_a)
    torch.baddbmm(out_b, x.mT, delta @ lora_b, beta=0, alpha=1 / root, out=out_b)


class _LoraTap:
    """Hooks on one LoRA module: ``lora_A``'s input ``x̃``, ``lora_B``'s input ``h``, and ``lora_B``'s
    output gradient ``δ``, handed to ``sampler`` as soon as the backward reaches it."""

    def __init__(self, name: str, layer: LoraLayer, adapter: str, sampler: GradSampler) -> None:
        self.name, self.sampler = name, sampler
        self.lora_a, self.lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
        self.root = math.sqrt(layer.scaling[adapter])
        self.x: Tensor | None = None
        self.h: Tensor | None = None
        self.delta: Tensor | None = None
        self._handles = [
            self.lora_a.register_forward_hook(self._input),
            self.lora_b.register_forward_hook(self._output),
        ]

    def _input(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        # in the factors' dtype (fp32 also under a bf16 base: common/models/precision.py)
        self.x = args[0].detach().to(module.weight.dtype)

    def _output(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        self.h = args[0].detach().to(module.weight.dtype)
        if output.requires_grad:
            output.register_hook(self._grad)

    def _grad(self, grad: Tensor) -> None:
        self.delta = grad.detach().to(self.lora_b.weight.dtype)
        self.sampler._arrived(self)

    def write(self, out_a: Tensor, out_b: Tensor) -> None:
        """This module's per-example gradients of the last pass into ``out_a``, ``out_b``."""
        if self.x is None or self.h is None or self.delta is None:
            raise RuntimeError(NO_PASS)
        x, h, delta = _tokens(self.x), _tokens(self.h), _tokens(self.delta)
        factor_grads_into(x, h, delta, self.lora_b.weight.detach(), self.root, out_a, out_b)

    def forget(self) -> None:
        self.x = self.h = self.delta = None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


class _LinearCapture:
    """Keeps one Linear's input and output gradient from the last forward/backward."""

    def __init__(self, module: nn.Linear) -> None:
        self.module = module
        self.inputs: Tensor | None = None
        self.grad_out: Tensor | None = None
        self._handles = [module.register_forward_hook(self._forward)]

    def _forward(self, module: nn.Module, args: tuple, output: Tensor) -> None:
        # in the trainable weight's dtype (fp32 also under a bf16 base: common/models/precision.py)
        self.inputs = args[0].detach().to(module.weight.dtype)
        if output.requires_grad:  # the output's gradient, whether or not the input needs one
            output.register_hook(self._backward)

    def _backward(self, grad: Tensor) -> None:
        self.grad_out = grad.detach().to(self.module.weight.dtype)

    def weight_grad(self) -> Tensor:
        """Per-example ``∂L_i/∂W``: (b, out, in); inputs may be (b, in) or (b, T, in)."""
        x, g = _tokens(self.inputs), _tokens(self.grad_out)
        return torch.einsum("bto,bti->boi", g, x)

    def bias_grad(self) -> Tensor:
        return _tokens(self.grad_out).sum(dim=1)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _tokens(t: Tensor | None) -> Tensor:
    if t is None:
        raise RuntimeError(NO_PASS)
    if t.dim() == 3:
        return t
    return t.unsqueeze(1) if t.dim() == 2 else t.reshape(t.shape[0], -1, t.shape[-1])


class GradSampler:
    """Hooks on every LoRA module of ``model`` (and on dense trainable Linears); after one
    ``losses.sum().backward()``, :meth:`factor_grads` and :meth:`dense_grads` give per-example
    gradients of the batch. ``layer_io``: keep each LoRA layer's input and output gradient for
    :meth:`layer_io` (Wishart's full-weight view) instead of reducing them in the backward. Use as a
    context manager (hooks are removed on exit)."""

    def __init__(self, model: nn.Module, adapter: str = "default", *, layer_io: bool = False) -> None:
        self.adapter, self.keep_io = adapter, layer_io
        self.layers = lora_layers(model, adapter)
        self.groups = shape_groups(self.layers, adapter)
        self._slot = {name: (k, i) for k, names in enumerate(self.groups) for i, name in enumerate(names)}
        self._taps = {name: _LoraTap(name, layer, adapter, self) for name, layer in self.layers.items()}
        self._buffers: list[tuple[Tensor, Tensor] | None] = [None] * len(self.groups)
        self._batch = -1
        self._written: set[str] = set()
        self._dense = _dense_linears(model)

    def _buffer(self, k: int, batch: int) -> tuple[Tensor, Tensor]:
        """Group ``k``'s ``(g, b, m, r)`` and ``(g, b, n, r)`` buffers for a pass of ``batch`` examples."""
        if batch != self._batch:  # a new pass: what an unread one left is dropped
            self._buffers, self._batch, self._written = [None] * len(self.groups), batch, set()
        if self._buffers[k] is None:
            first = self._taps[self.groups[k][0]]
            (m, r), n = first.lora_b.weight.shape, first.lora_a.weight.shape[1]
            opts = {"dtype": first.lora_b.weight.dtype, "device": first.lora_b.weight.device}
            g = len(self.groups[k])
            self._buffers[k] = (torch.empty(g, batch, m, r, **opts), torch.empty(g, batch, n, r, **opts))
        return self._buffers[k]

    def _reduce(self, tap: _LoraTap) -> None:
        """``tap``'s per-example gradients of the last pass into its slot of its group's buffers."""
        if tap.delta is None:
            raise RuntimeError(NO_PASS)
        k, i = self._slot[tap.name]
        g_a, g_b = self._buffer(k, tap.delta.shape[0])
        tap.write(g_a[i], g_b[i])
        self._written.add(tap.name)

    def _arrived(self, tap: _LoraTap) -> None:
        """``tap``'s output gradient arrived: reduce it to per-example gradients now (unless keeping io)."""
        if self.keep_io:
            return
        self._reduce(tap)
        tap.forget()  # the layer's input and output gradient are not held past its backward

    def factor_grads(self) -> StackedGrads:
        """The last pass's per-example gradients, ``{module: (g_A: (b, m, r), g_B: (b, n, r))}`` in
        paper factors, stacked per :attr:`groups`. Each call hands over that pass's buffers."""
        if self.keep_io:
            for tap in self._taps.values():
                self._reduce(tap)
        if len(self._written) != len(self._taps):
            raise RuntimeError(NO_PASS)
        out = StackedGrads(
            GradGroup(tuple(names), *buffers)
            for names, buffers in zip(self.groups, self._buffers, strict=True)
        )
        self._buffers, self._batch, self._written = [None] * len(self.groups), -1, set()
        return out

    def layer_io(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{module: (x: (b, T, n), dy: (b, T, m))}``: each LoRA layer's input (after LoRA dropout)
        and ``∂L/∂y`` of its output ``y`` (the LoRA branch's output gradient is ``s·∂L/∂y``); the
        per-example full weight gradient is ``dyᵢᵀ xᵢ``. Needs ``layer_io=True``."""
        if not self.keep_io:
            raise RuntimeError(
                "layer inputs are reduced in the backward: open the sampler with layer_io=True"
            )
        out = {}
        for name, tap in self._taps.items():
            scaling = self.layers[name].scaling[self.adapter]
            out[name] = (_tokens(tap.x), _tokens(tap.delta) / scaling)
        return out

    def dense_grads(self) -> dict[str, Tensor]:
        """Per-example gradients of dense trainable parameters by name: (b, *shape)."""
        out = {}
        for name, (param_kind, cap) in self._dense.items():
            out[name] = cap.weight_grad() if param_kind == "weight" else cap.bias_grad()
        return out

    def close(self) -> None:
        for tap in self._taps.values():
            tap.remove()
        for cap in {id(c): c for _, c in self._dense.values()}.values():
            cap.remove()

    def __enter__(self) -> GradSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dense_linears(model: nn.Module) -> dict[str, tuple[str, _LinearCapture]]:
    """Dense trainables must belong to Linears (a classifier head); anything else is an error."""
    trainable = dense_trainables(model)
    by_module: dict[str, _LinearCapture] = {}
    out: dict[str, tuple[str, _LinearCapture]] = {}
    for name in trainable:
        module_name, _, kind = name.rpartition(".")
        module = model.get_submodule(module_name)
        if not isinstance(module, nn.Linear) or kind not in ("weight", "bias"):
            raise ValueError(f"per-example gradients support Linear layers only, not {name}")
        cap = by_module.setdefault(module_name, _LinearCapture(module))
        out[name] = (kind, cap)
    return out
