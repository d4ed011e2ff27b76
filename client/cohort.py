"""A cohort of clients' local steps in one pass: K clients, one forward/backward per micro-step.

The frozen base runs once over the concatenated examples of K clients; each client's own LoRA
factors apply to its own rows only, by batched matmul over stacked factors (PEFT's
``lora_A.weight``: ``(K, r, d_in)``, ``lora_B.weight``: ``(K, d_out, r)``), and each module with
dense trainables (a classification head) runs once per client under ``torch.func.vmap``. Client k's
loss is the mean of its own examples' losses, and the cohort minimises the sum of the K losses: the
gradient of client k's parameters is exactly its own loss's (no parameter is shared, no layer mixes
rows: LayerNorm and attention act per example), so one backward gives all K gradients. AdamW and
SGD are elementwise, so one optimizer over the stacked parameters takes all K clients' steps.

What is the same as K sequential runs of :func:`common.tasks.training.train_steps`: each client's
batches (its own ``sample_batches`` stream from its own seed), its loss, its optimizer and step
count, hence its local adapter, to float rounding. What is not: the base model's dropout masks (the
cohort draws them over its own batch layout; the same distribution, other draws), so equivalence is
exact with the base's dropout off, and equal in distribution with it on.

Rows are laid out client-major: a micro-step carries ``R`` rows of every client (``R`` = the
micro-batch, at most the largest client batch), a client with fewer rows left padded by copies of
one of its own examples with weight 0 (their gradient is exactly zero), so that every LoRA input
reshapes to ``(K, R·T, d_in)``. Clients are trained in chunks of at most ``rows // R`` clients
(``rows``: the rows of one forward, what bounds the device's memory).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from peft.tuners.lora import Linear as LoraLinear
from torch import Tensor, nn
from torch.func import functional_call, vmap

from common.errors import FedloraError
from common.models.lora import AdapterState, adapter_state, dense_trainables, load_adapter_state, lora_layers
from common.tasks.base import Task, by_length, sample_batches
from common.tasks.training import StepSchedule

#: rows (examples) of one cohort forward by default: what bounds its activation memory
DEFAULT_ROWS = 256


class CohortUnsupported(FedloraError):
    """The model or the schedules cannot be trained as one cohort (they run one by one)."""


@dataclass(frozen=True)
class Member:
    """One client of a cohort: its examples, its local schedule (seed, steps, lr, optimizer) and the
    adapter state it starts from (the round's global adapter)."""

    examples: Sequence[dict]
    schedule: StepSchedule
    start: AdapterState


def train_cohort(
    model: nn.Module, task: Task, device: torch.device, members: Sequence[Member], rows: int = DEFAULT_ROWS
) -> list[tuple[AdapterState, dict[str, float]]]:
    """Every member's local steps; returns, per member in order, ``(its local adapter state, its
    metrics)``: what :func:`common.models.adapter_state` and ``train_steps`` give after its own
    sequential run. ``model``'s adapter is left at the last member's local state."""
    check_cohort(model, members)
    out: list[tuple[AdapterState, dict[str, float]]] = []
    for chunk in _chunks(members, rows):
        out.extend(_train_chunk(model, task, device, chunk))
    return out


def check_cohort(model: nn.Module, members: Sequence[Member]) -> None:
    """Refuse (:class:`CohortUnsupported`) what one cohort cannot train: LoRA variants (DoRA), more
    than one adapter, schedules that differ in anything but their seed and batch size."""
    for name, layer in lora_layers(model).items():
        if not isinstance(layer, LoraLinear) or layer.lora_variant or list(layer.lora_A) != ["default"]:
            raise CohortUnsupported(f"{name}: only plain single-adapter LoRA linear layers train as a cohort")
    kinds = {(m.schedule.steps, m.schedule.lr, m.schedule.optimizer, m.schedule.microbatch) for m in members}
    if len(kinds) > 1:
        raise CohortUnsupported("a cohort's members must share steps, lr, optimizer and micro-batch")


def _chunks(members: Sequence[Member], rows: int) -> Iterator[Sequence[Member]]:
    per_client = _rows_per_client(members)
    size = max(1, rows // per_client)
    for start in range(0, len(members), size):
        yield members[start : start + size]


def _rows_per_client(members: Sequence[Member]) -> int:
    """``R``: rows of each client in one micro-step (its micro-batch, at most the largest batch)."""
    largest = max(min(m.schedule.batch_size, len(m.examples)) for m in members)
    return min(members[0].schedule.microbatch, largest)


def _train_chunk(
    model: nn.Module, task: Task, device: torch.device, members: Sequence[Member]
) -> list[tuple[AdapterState, dict[str, float]]]:
    k, s = len(members), members[0].schedule
    stacked = _stacked(model, [m.start for m in members])
    params = [p for group in stacked.values() for p in group.values()]
    if s.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=s.lr)
    else:
        opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0)
    streams = [
        sample_batches(len(m.examples), min(m.schedule.batch_size, len(m.examples)), s.steps, _rng(m))
        for m in members
    ]
    torch.manual_seed(members[0].schedule.seed)  # the base's dropout (see the module's docstring)
    per_client = _rows_per_client(members)
    losses = torch.zeros(s.steps, k)
    model.train()
    with _cohort_forward(model, stacked, k, per_client):
        for step in range(s.steps):
            opt.zero_grad(set_to_none=True)
            batches = [next(stream) for stream in streams]
            losses[step] = _step_backward(model, task, device, members, batches, per_client)
            opt.step()
    model.eval()
    return [(_member_state(model, stacked, i), {"train-loss": float(losses[:, i].mean())}) for i in range(k)]


def _rng(member: Member) -> np.random.Generator:
    return np.random.default_rng(member.schedule.seed)


def _step_backward(
    model: nn.Module,
    task: Task,
    device: torch.device,
    members: Sequence[Member],
    batches: Sequence[np.ndarray],
    per_client: int,
) -> Tensor:
    """Accumulate every client's gradient of its batch's mean loss; returns those K mean losses."""
    k = len(members)
    total = torch.zeros(k, device=device)
    ordered = [by_length(b.tolist(), m.examples) for m, b in zip(members, batches, strict=True)]
    passes = -(-max(len(b) for b in ordered) // per_client)
    for j in range(passes):
        rows, weights = [], torch.zeros(k, per_client)
        for c, (member, idx) in enumerate(zip(members, ordered, strict=True)):
            part = idx[j * per_client : (j + 1) * per_client]
            weights[c, : len(part)] = 1.0 / len(idx)
            # padding rows: copies of one of the client's own examples, weight 0 (zero gradient)
            rows.extend(member.examples[i] for i in part + [idx[0]] * (per_client - len(part)))
        batch = task.collate(rows, device)
        losses = task.per_example_loss(model, batch).view(k, per_client) * weights.to(device)
        losses.sum().backward()
        total += losses.detach().sum(1)
    return total.cpu()


def _stacked(model: nn.Module, starts: Sequence[AdapterState]) -> dict[str, dict[str, nn.Parameter]]:
    """Per trained module, its own trainable parameters stacked over the K clients, from each
    client's start state (written through :func:`load_adapter_state`, so PEFT's scaling is
    folded as the adapter state defines it): ``{module name: {parameter name: (K, *shape)}}``."""
    layers, owners = lora_layers(model), _dense_owners(model)
    per_client: list[dict[str, dict[str, Tensor]]] = []
    for start in starts:
        load_adapter_state(model, start)
        state = {
            name: {"A": layer.lora_A["default"].weight, "B": layer.lora_B["default"].weight}
            for name, layer in layers.items()
        }
        for name, module in owners.items():
            state[name] = {p: t for p, t in module.named_parameters(recurse=False) if t.requires_grad}
        per_client.append({m: {p: t.detach().clone() for p, t in ps.items()} for m, ps in state.items()})
    return {
        m: {p: nn.Parameter(torch.stack([c[m][p] for c in per_client])) for p in ps}
        for m, ps in per_client[0].items()
    }


def _dense_owners(model: nn.Module) -> dict[str, nn.Module]:
    """The modules that hold dense trainables themselves (a head's Linear), by qualified name."""
    owners = {}
    names = set(dense_trainables(model))
    for name, module in model.named_modules():
        own = [f"{name}.{p}" if name else p for p, t in module.named_parameters(recurse=False)]
        if any(n in names for n in own):
            owners[name] = module
    return owners


def _member_state(model: nn.Module, stacked: dict[str, dict[str, nn.Parameter]], i: int) -> AdapterState:
    """Client ``i``'s adapter state: its slice written into the model, read by :func:`adapter_state`."""
    layers, owners = lora_layers(model), _dense_owners(model)
    with torch.no_grad():
        for name, group in stacked.items():
            if name in layers:
                layers[name].lora_A["default"].weight.copy_(group["A"][i])
                layers[name].lora_B["default"].weight.copy_(group["B"][i])
            else:
                for p, value in group.items():
                    getattr(owners[name], p).copy_(value[i])
    return adapter_state(model)


@contextmanager
def _cohort_forward(
    model: nn.Module, stacked: dict[str, dict[str, nn.Parameter]], k: int, per_client: int
) -> Iterator[None]:
    """Every trained module's forward replaced, for the block, by its cohort form over ``stacked``."""
    layers, owners = lora_layers(model), _dense_owners(model)
    patched = []
    for name, group in stacked.items():
        module = layers.get(name) or owners[name]
        if name in layers:
            module.forward = _lora_forward(module, group["A"], group["B"], k)
        else:
            module.forward = _dense_forward(module, group, k)
        patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward  # the class's own forward again


def _lora_forward(layer: LoraLinear, a: Tensor, b: Tensor, k: int):
    """PEFT's vanilla LoRA forward (``base(x) + lora_B(lora_A(dropout(x))) · s``) with client c's
    factors on client c's rows: ``a``: ``(K, r, d_in)``, ``b``: ``(K, d_out, r)``; ``x``: ``(K·R, …, d_in)``."""
    base, dropout, scaling = layer.base_layer, layer.lora_dropout["default"], layer.scaling["default"]

    def forward(x: Tensor, *args, **kwargs) -> Tensor:
        result = base(x, *args, **kwargs)
        h = dropout(x.to(a.dtype))
        if h.shape[0] % k:
            raise CohortUnsupported(f"a LoRA input of {h.shape[0]} rows is not {k} clients' rows")
        lo = torch.bmm(h.reshape(k, -1, h.shape[-1]), a.transpose(1, 2))  # (K, R·T, r)
        up = torch.bmm(lo, b.transpose(1, 2)).reshape(*result.shape[:-1], -1)  # (K·R, …, d_out)
        return (result + up * scaling).to(result.dtype)

    return forward


def _dense_forward(module: nn.Module, params: dict[str, nn.Parameter], k: int):
    """``module``'s own forward with client c's parameters on client c's rows (``torch.func.vmap``
    over a copy of the module: its other parameters and buffers shared)."""
    shadow = copy.deepcopy(module)

    def one(p: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(shadow, p, (x,))

    batched = vmap(one, randomness="different")

    def forward(x: Tensor) -> Tensor:
        if x.shape[0] % k:
            raise CohortUnsupported(f"an input of {x.shape[0]} rows is not {k} clients' rows")
        out = batched(dict(params), x.reshape(k, -1, *x.shape[1:]))
        return out.reshape(-1, *out.shape[2:])

    return forward


__all__ = ["DEFAULT_ROWS", "CohortUnsupported", "Member", "check_cohort", "train_cohort"]
