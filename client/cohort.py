"""A cohort of clients' local steps in one pass: K clients, one forward/backward per micro-step.

The frozen base runs once over the concatenated examples of K clients; each client's own LoRA
factors apply to its own rows only, by batched matmul over the factors gathered per row (PEFT's
``lora_A.weight`` stacked ``(K, r, d_in)``, ``lora_B.weight`` ``(K, d_out, r)``, row n taking its
client's), and each module with dense trainables (a classification head) runs per row under
``torch.func.vmap`` with its client's parameters. Client k's loss is the mean of its own examples'
losses, and the cohort minimises the sum of the K losses: the gradient of client k's parameters is
exactly its own loss's (no parameter is shared, no layer mixes rows: LayerNorm and attention act per
example), so one backward gives all K gradients. AdamW and SGD are elementwise, so one optimizer
over the stacked parameters takes all K clients' steps.

What is the same as K sequential runs of :func:`common.tasks.training.train_steps`: each client's
batches (its own ``sample_batches`` stream from its own seed), its loss, its optimizer and step
count, hence its local adapter, to float rounding. What is not: the base model's dropout masks (the
cohort draws them over its own batch layout; the same distribution, other draws), so equivalence is
exact with the base's dropout off, and equal in distribution with it on.

A step's rows (every client's batch) are sorted by length, whoever's they are, and run in forwards
of at most ``tokens`` padded tokens (what bounds activation memory, a language model's logits above
all: 49,152 fp32 per token for SmolLM2; sorted, they pad little). Clients are trained
in chunks of at most ``clients`` (what bounds the stacked parameters and optimizer state).
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
from common.tasks.base import Task, example_length, sample_batches
from common.tasks.training import StepSchedule, step_optimizer

#: padded tokens of one cohort forward, and clients trained together, by default (on the CPU, on
#: CUDA). On the CPU, tensors over glibc's 32 MB mmap ceiling are mapped and zero-filled afresh on
#: every allocation: two workers at ~7,700 tokens a forward spent 3x the sequential engine's system
#: time in page faults and ran 1.3x slower per client (MiniLM, 2026-11-29); at ~2,000 they did not
DEFAULT_TOKENS = (2048, 16384)
DEFAULT_CLIENTS = (64, 256)
#: on the CPU, the most output logits one forward may hold (2^25 fp32 numbers, 128 MB): a 2,048-token
#: SmolLM2 forward's 100 M logits ran its log-softmax and its backward 15x slower per number than a
#: 512-token one's (8 clients, 2 threads, 2026-11-29: batched 0.82x sequential per client; capped, 1.00x)
CPU_LOGITS = 2**25


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
    model: nn.Module,
    task: Task,
    device: torch.device,
    members: Sequence[Member],
    tokens: int = DEFAULT_TOKENS[0],
    clients: int = DEFAULT_CLIENTS[0],
) -> list[tuple[AdapterState, dict[str, float]]]:
    """Every member's local steps, ``clients`` at a time in forwards of at most ``tokens`` padded
    tokens; returns, per member in order, ``(its local adapter state, its metrics)``: what
    :func:`common.models.adapter_state` and ``train_steps`` give after its own sequential run.
    ``model``'s adapter is left at the last member's local state."""
    check_cohort(model, members)
    out: list[tuple[AdapterState, dict[str, float]]] = []
    for start in range(0, len(members), max(1, clients)):
        out.extend(_train_chunk(model, task, device, members[start : start + max(1, clients)], tokens))
    return out


def default_tokens(model: nn.Module, device: torch.device) -> int:
    """Padded tokens of one cohort forward by default on ``device``: :data:`DEFAULT_TOKENS`, and on the
    CPU no more than :data:`CPU_LOGITS` output logits (a language model's head is its vocabulary wide)."""
    if device.type == "cuda":
        return DEFAULT_TOKENS[1]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    width = int(getattr(head, "out_features", 0) or 0)
    return min(DEFAULT_TOKENS[0], max(1, CPU_LOGITS // width)) if width else DEFAULT_TOKENS[0]


def check_cohort(model: nn.Module, members: Sequence[Member]) -> None:
    """Refuse (:class:`CohortUnsupported`) what one cohort cannot train: LoRA variants (DoRA), more
    than one adapter, schedules that differ in anything but their seed, batch size and micro-batch
    (a cohort's forwards are cut by ``tokens`` instead)."""
    for name, layer in lora_layers(model).items():
        if not isinstance(layer, LoraLinear) or layer.lora_variant or list(layer.lora_A) != ["default"]:
            raise CohortUnsupported(f"{name}: only plain single-adapter LoRA linear layers train as a cohort")
    kinds = {(m.schedule.steps, m.schedule.lr, m.schedule.optimizer) for m in members}
    if len(kinds) > 1:
        raise CohortUnsupported("a cohort's members must share steps, lr and optimizer")


def _train_chunk(
    model: nn.Module, task: Task, device: torch.device, members: Sequence[Member], tokens: int
) -> list[tuple[AdapterState, dict[str, float]]]:
    k, s = len(members), members[0].schedule
    stacked = _stacked(model, [m.start for m in members])
    opt = step_optimizer([p for group in stacked.values() for p in group.values()], s)
    streams = [
        sample_batches(
            len(m.examples),
            min(m.schedule.batch_size, len(m.examples)),
            s.steps,
            np.random.default_rng(m.schedule.seed),
        )
        for m in members
    ]
    torch.manual_seed(members[0].schedule.seed)  # the base's dropout (see the module's docstring)
    losses = torch.zeros(s.steps, k, device=device)  # read once, after the steps: no sync per step
    owner = _Owner()
    model.train()
    with _cohort_forward(model, stacked, owner):
        for step in range(s.steps):
            opt.zero_grad(set_to_none=True)
            batches = [next(stream) for stream in streams]
            losses[step] = _step_backward(model, task, device, members, batches, owner, tokens)
            opt.step()
    model.eval()
    means = losses.mean(0).tolist()
    return [(_member_state(model, stacked, i), {"train-loss": means[i]}) for i in range(k)]


class _Owner:
    """The client (0..K-1) of each row of the forward under way: ``rows``, ``(N,)`` on the device."""

    rows: Tensor


def _step_backward(
    model: nn.Module,
    task: Task,
    device: torch.device,
    members: Sequence[Member],
    batches: Sequence[np.ndarray],
    owner: _Owner,
    tokens: int,
) -> Tensor:
    """Accumulate every client's gradient of its batch's mean loss; returns those K mean losses."""
    k = len(members)
    total = torch.zeros(k, device=device)
    pairs = [(c, int(i)) for c, batch in enumerate(batches) for i in batch]
    lengths = [example_length(members[c].examples[i]) for c, i in pairs]
    order = sorted(range(len(pairs)), key=lengths.__getitem__)
    for piece in _passes([lengths[j] for j in order], tokens):
        part = [pairs[order[j]] for j in piece]
        clients = torch.tensor([c for c, _ in part], device=device)
        weights = torch.tensor([1.0 / len(batches[c]) for c, _ in part], device=device)
        owner.rows = clients
        batch = task.collate([members[c].examples[i] for c, i in part], device)
        losses = task.per_example_loss(model, batch) * weights
        losses.sum().backward()
        total.index_add_(0, clients, losses.detach())
    return total


def _passes(lengths: Sequence[int], tokens: int) -> Iterator[range]:
    """Consecutive pieces of rows sorted by ascending ``lengths``, each padding to at most ``tokens``
    (its row count times its longest row's length; a longer row alone)."""
    start = 0
    for end in range(1, len(lengths) + 1):
        if end == len(lengths) or (end + 1 - start) * lengths[end] > tokens:
            yield range(start, end)
            start = end


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
    """The modules that hold dense trainables themselves (a head's Linear), by qualified name: each
    trainable's parent, from the model's cached layout (no walk over its modules)."""
    names = {name.rpartition(".")[0] for name in dense_trainables(model)}
    return {name: model.get_submodule(name) for name in sorted(names)}


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
    model: nn.Module, stacked: dict[str, dict[str, nn.Parameter]], owner: _Owner
) -> Iterator[None]:
    """Every trained module's forward replaced, for the block, by its cohort form over ``stacked``
    (row n with client ``owner.rows[n]``'s parameters)."""
    layers, owners = lora_layers(model), _dense_owners(model)
    patched = []
    for name, group in stacked.items():
        if name in layers:
            module = layers[name]
            module.forward = _lora_forward(module, group["A"], group["B"], owner)
        else:
            module = owners[name]
            module.forward = _dense_forward(module, group, owner)
        patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.forward  # the class's own forward again


def _lora_forward(layer: LoraLinear, a: Tensor, b: Tensor, owner: _Owner):
    """PEFT's vanilla LoRA forward (``base(x) + lora_B(lora_A(dropout(x))) · s``) with each row's
    client's factors: ``a``: ``(K, r, d_in)``, ``b``: ``(K, d_out, r)``; ``x``: ``(N, …, d_in)``."""
    base, dropout, scaling = layer.base_layer, layer.lora_dropout["default"], layer.scaling["default"]

    def forward(x: Tensor, *args, **kwargs) -> Tensor:
        result = base(x, *args, **kwargs)
        h = dropout(x.to(a.dtype))
        rows = owner.rows
        lo = torch.bmm(h.reshape(len(rows), -1, h.shape[-1]), a[rows].transpose(1, 2))  # (N, T, r)
        up = torch.bmm(lo, b[rows].transpose(1, 2)).reshape(*result.shape[:-1], -1)  # (N, …, d_out)
        return (result + up * scaling).to(result.dtype)

    return forward


def _dense_forward(module: nn.Module, params: dict[str, nn.Parameter], owner: _Owner):
    """``module``'s own forward with each row's client's parameters (``torch.func.vmap`` over the
    rows, on a copy of the module: its other parameters and buffers shared)."""
    shadow = copy.deepcopy(module)

    def one(p: dict[str, Tensor], x: Tensor) -> Tensor:
        return functional_call(shadow, p, (x.unsqueeze(0),)).squeeze(0)

    batched = vmap(one, randomness="different")

    def forward(x: Tensor) -> Tensor:
        return batched({name: value[owner.rows] for name, value in params.items()}, x)

    return forward


__all__ = [
    "CPU_LOGITS",
    "DEFAULT_CLIENTS",
    "DEFAULT_TOKENS",
    "CohortUnsupported",
    "Member",
    "check_cohort",
    "default_tokens",
    "train_cohort",
]
