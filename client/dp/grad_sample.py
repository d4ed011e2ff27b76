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
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from common.models.lora import dense_trainables, lora_layers


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
        raise RuntimeError("no activations captured: run forward and backward inside the engine first")
    return t.unsqueeze(1) if t.dim() == 2 else t.reshape(t.shape[0], -1, t.shape[-1])


class GradSampler:
    """Hooks on every LoRA module of ``model`` (and on dense trainable Linears); after one
    ``losses.sum().backward()``, :meth:`factor_grads` and :meth:`dense_grads` give per-example
    gradients of the batch. Use as a context manager (hooks are removed on exit)."""

    def __init__(self, model: nn.Module, adapter: str = "default") -> None:
        self.adapter = adapter
        self.layers = lora_layers(model, adapter)
        self._lora = {
            name: (_LinearCapture(layer.lora_A[adapter]), _LinearCapture(layer.lora_B[adapter]))
            for name, layer in self.layers.items()
        }
        self._dense = _dense_linears(model)

    def factor_grads(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{module: (g_A: (b, m, r), g_B: (b, n, r))}`` in paper factors."""
        out = {}
        for name, (cap_a, cap_b) in self._lora.items():
            root = math.sqrt(self.layers[name].scaling[self.adapter])
            h, delta = _tokens(cap_b.inputs), _tokens(cap_b.grad_out)  # (b, T, r), (b, T, m)
            x = _tokens(cap_a.inputs)  # (b, T, n)
            lora_b = cap_b.module.weight.detach()  # (m, r)
            g_lora_b = torch.einsum("btm,btr->bmr", delta, h)  # ∂L_i/∂lora_B
            g_lora_a_t = torch.einsum("btn,btr->bnr", x, delta @ lora_b)  # (∂L_i/∂lora_A)ᵀ
            out[name] = (g_lora_b / root, g_lora_a_t / root)  # A = √s·lora_B, B = √s·lora_Aᵀ
        return out

    def layer_io(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{module: (x: (b, T, n), dy: (b, T, m))}``: each LoRA layer's input (after LoRA dropout)
        and ``∂L/∂y`` of its output ``y`` (the LoRA branch's output gradient is ``s·∂L/∂y``); the
        per-example full weight gradient is ``dyᵢᵀ xᵢ``."""
        out = {}
        for name, (cap_a, cap_b) in self._lora.items():
            scaling = self.layers[name].scaling[self.adapter]
            out[name] = (_tokens(cap_a.inputs), _tokens(cap_b.grad_out) / scaling)
        return out

    def dense_grads(self) -> dict[str, Tensor]:
        """Per-example gradients of dense trainable parameters by name: (b, *shape)."""
        out = {}
        for name, (param_kind, cap) in self._dense.items():
            out[name] = cap.weight_grad() if param_kind == "weight" else cap.bias_grad()
        return out

    def close(self) -> None:
        for cap_a, cap_b in self._lora.values():
            cap_a.remove()
            cap_b.remove()
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
