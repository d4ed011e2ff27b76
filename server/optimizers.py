"""Server optimizers applied to the (noised) mean client increment: DP post-processing.

``delta`` is the released mean increment Δ_t = mean_k(x_k - x_t), same names and shapes as the
adapter; the pseudo-gradient is -Δ_t. Every kind matches Flower 1.41's ``flwr.serverapp.strategy``
(and the legacy ``flwr.server.strategy``, whose arithmetic is the same):

* ``sgd``: x + η Δ_t (what ``server.aggregate.apply_increment`` does with ``server_lr``).
* ``momentum``: FedAvgM (Hsu et al. 2019, arXiv:1909.06335). Buffer b_1 = -Δ_1,
  b_t = β₁ b_{t-1} - Δ_t (no dampening, no Nesterov); x - η b_t.
* ``adam`` / ``yogi``: FedAdam / FedYogi (Reddi et al. 2021, "Adaptive Federated Optimization",
  ICLR, Algorithm 2): m_t = β₁ m_{t-1} + (1-β₁) Δ_t;
  adam v_t = β₂ v_{t-1} + (1-β₂) Δ_t²; yogi v_t = v_{t-1} - (1-β₂) Δ_t² sign(v_{t-1} - Δ_t²);
  x + η_t m_t / (√v_t + τ).

Where Flower differs from Algorithm 2 (we follow Flower):

* m_0 = 0 and v_0 = 0; Algorithm 2 starts from m_{-1} = 0 and v_{-1} ≥ τ².
* FedAdam bias-corrects the step, η_t = η √(1-β₂^(t+1)) / (1-β₁^(t+1)) with t the server round
  (1 on the first step), i.e. Kingma & Ba's α_t with the exponent shifted by one; Algorithm 2 has
  no bias correction. Here t = ``steps`` (this step included), which equals Flower's server round
  when every round updates the model. FedYogi uses η_t = η (no correction).

Arithmetic is in float32 on the params' device; the result keeps each parameter's dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from common.errors import FedloraError
from common.models import AdapterState

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi")

#: moment buffers kept by each kind ("m": first moment / momentum buffer, "v": second moment)
_MOMENTS = {"sgd": (), "momentum": ("m",), "adam": ("m", "v"), "yogi": ("m", "v")}


@dataclass(frozen=True)
class ServerOptimizerSpec:
    """``kind`` in ``SERVER_OPTIMIZERS``; ``lr`` = η; ``momentum`` = β₁ (FedAvgM momentum, or the
    Adam/Yogi first-moment decay); ``beta2`` = β₂ and ``tau`` = τ (adam, yogi only)."""

    kind: str
    lr: float
    momentum: float
    beta2: float
    tau: float


class ServerOptimizer:
    """One server optimizer; its state is the moment tensors (float32, shaped like the params) and
    the number of steps taken."""

    def __init__(self, spec: ServerOptimizerSpec) -> None:
        if spec.kind not in SERVER_OPTIMIZERS:
            raise FedloraError(
                f"unknown server optimizer '{spec.kind}'; choose one of {', '.join(SERVER_OPTIMIZERS)}"
            )
        self.spec = spec
        self.steps = 0
        self._moments: dict[str, dict[str, Tensor]] = {}  # "m" / "v" -> name -> float32 tensor

    def step(self, params: AdapterState, delta: AdapterState) -> AdapterState:
        """New params from ``params`` and the mean increment ``delta`` (same names and shapes).
        Inputs are not modified; ``steps`` grows by one."""
        if set(delta) != set(params) or any(delta[n].shape != params[n].shape for n in params):
            raise ValueError("delta must have the same names and shapes as params")
        self._check_fits(params)
        spec, kind = self.spec, self.spec.kind
        t = self.steps + 1
        if kind == "adam":
            lr = spec.lr * math.sqrt(1.0 - spec.beta2 ** (t + 1)) / (1.0 - spec.momentum ** (t + 1))
        else:
            lr = spec.lr
        moments: dict[str, dict[str, Tensor]] = {key: {} for key in _MOMENTS[kind]}
        new: AdapterState = {}
        with torch.no_grad():
            for name, p in params.items():
                x = p.to(torch.float32)
                d = delta[name].to(device=p.device, dtype=torch.float32)
                if kind == "sgd":
                    x = x + lr * d
                elif kind == "momentum":
                    prev = self._moment("m", name, p.device)
                    buf = -d if prev is None else spec.momentum * prev + -d
                    moments["m"][name] = buf
                    x = x - lr * buf
                else:
                    prev_m = self._moment("m", name, p.device)
                    prev_v = self._moment("v", name, p.device)
                    prev_m = torch.zeros_like(d) if prev_m is None else prev_m
                    prev_v = torch.zeros_like(d) if prev_v is None else prev_v
                    m = spec.momentum * prev_m + (1.0 - spec.momentum) * d
                    d2 = d * d
                    if kind == "adam":
                        v = spec.beta2 * prev_v + (1.0 - spec.beta2) * d2
                    else:
                        v = prev_v - (1.0 - spec.beta2) * d2 * torch.sign(prev_v - d2)
                    moments["m"][name], moments["v"][name] = m, v
                    x = x + lr * m / (torch.sqrt(v) + spec.tau)
                new[name] = x.to(p.dtype)
        self._moments = moments
        self.steps = t
        return new

    def state_tensors(self) -> dict[str, Tensor]:
        """``{"m/<name>": ..., "v/<name>": ...}`` (float32 copies, params' shapes); empty for sgd and
        before the first step."""
        return {
            f"{key}/{name}": t.clone() for key, byname in self._moments.items() for name, t in byname.items()
        }

    def load_state(self, tensors: Mapping[str, Tensor], steps: int) -> None:
        """Restore what ``state_tensors`` and ``steps`` gave. Names and shapes are checked against the
        kind here and against the params at the next ``step``; a misfit raises ``FedloraError``."""
        kind = self.spec.kind
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise FedloraError(f"server optimizer state: steps must be an integer >= 0, got {steps!r}")
        moments: dict[str, dict[str, Tensor]] = {key: {} for key in _MOMENTS[kind]}
        for full, tensor in tensors.items():
            key, _, name = full.partition("/")
            if key not in moments or not name:
                raise FedloraError(f"server optimizer state: unexpected tensor '{full}' for '{kind}'")
            if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
                raise FedloraError(f"server optimizer state: '{full}' is not a floating-point tensor")
            moments[key][name] = tensor.detach().to(torch.float32, copy=True)
        if moments:
            names = [set(byname) for byname in moments.values()]
            if any(n != names[0] for n in names):
                raise FedloraError(
                    f"server optimizer state: {'/'.join(moments)} tensors do not name the same params"
                )
            for name in names[0]:
                shapes = {byname[name].shape for byname in moments.values()}
                if len(shapes) != 1:
                    raise FedloraError(f"server optimizer state: moments of '{name}' differ in shape")
            if bool(names[0]) != (steps > 0):
                raise FedloraError(
                    f"server optimizer state: steps={steps} does not fit "
                    f"{'the' if names[0] else 'no'} saved moments of '{kind}'"
                )
        self._moments = {key: byname for key, byname in moments.items() if byname}
        self.steps = steps

    def _moment(self, key: str, name: str, device: torch.device) -> Tensor | None:
        byname = self._moments.get(key)
        return None if byname is None else byname[name].to(device)

    def _check_fits(self, params: AdapterState) -> None:
        for key, byname in self._moments.items():
            if set(byname) != set(params):
                raise FedloraError(
                    f"server optimizer state: '{key}/' tensors do not name the adapter's params"
                )
            for name, t in byname.items():
                if t.shape != params[name].shape:
                    raise FedloraError(
                        f"server optimizer state: '{key}/{name}' has shape {tuple(t.shape)}, "
                        f"the adapter {tuple(params[name].shape)}"
                    )
