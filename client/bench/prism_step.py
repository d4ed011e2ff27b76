"""``fedlora bench prism-step``: step time, peak memory and dispatched ops of PRISM and factor-space
DP-AdamW, and of the plain (non-private) step they are both measured against.

All three run on one model, batch, sequence length and set of LoRA targets, one after the other in
one process; the DP steps through the engine (client/dp/engine.py: per-example gradients, global clip,
noise, step), the plain step as the clients' non-private recipe does it (common/tasks/training.py: the
mean loss's gradient, AdamW on the LoRA factors). Each figure is the median over ``--repeats`` steps
after a warm-up step each, method by method: each measured step follows a step of its own method
(on the CPU a step run right after another method's pays for that step's allocations: at 32 × 128
a PRISM step right after the plain step took 16.6–17.4 s, 13.7 s after a dp-adamw step). A step is one logical batch of exactly ``--batch`` examples of
``--seq`` tokens (news-articles blocks); ``--batch 32,128`` measures each size in turn, one JSON line
each.

Passes (``--microbatch``): a given size cuts every method's batch alike. By default, on CUDA the plain
step takes its batch in one pass and a DP step sizes its passes from free device memory after the
warm-up (client/dp/microbatch.py: one pass when the batch fits); on the CPU both take passes of 32
examples (the plain recipe's micro-batch: a 128 × 128 SmolLM2 batch's logits alone are 3.2 GB).

Memory: on CUDA the step's peak allocated bytes (``torch.cuda.max_memory_allocated``); on the CPU the
process's peak resident set during the step (``VmHWM``, reset through ``/proc/self/clear_refs``), and
``step_extra`` its excess over the resident set just before the step (model weights excluded; the
kernel's RSS counters are exact only to tens of pages, so a step that adds nothing reads 0).

Ops: the aten operators one step dispatches (counted by a ``TorchDispatchMode`` below autograd, one
step after a warm-up step), the device-independent proxy for launch overhead (issue 36: on a GPU a
step of many tiny kernels is bound by their launches, not by arithmetic). ``ops_per_layer``: how
many more ops a step dispatches per added decoder layer, from a second count on a copy of the model
cut to half its layers.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from client.dp.engine import DenseUpdate, DpSteps, dp_train
from client.dp.optimizers import make_dp_optimizer
from common.config import RunConfig
from common.device import resolve_device
from common.models.lora import lora_layers
from common.models.lora_init import apply_lora_init
from common.runtime import open_model, open_split
from common.tasks import make_task
from common.tasks.training import Trainee, mean_loss_backward


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak(device: torch.device) -> int:
    """Reset the peak counter; returns the current usage in bytes."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset VmHWM to the current RSS
    return _rss_kb("VmRSS") * 1024


def _peak(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return _rss_kb("VmHWM") * 1024


class OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched while active (``total``)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> int:
    """Aten operators dispatched by one call of ``fn``."""
    with OpCounter() as counter:
        fn()
    return counter.total


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's stack of ``config.num_hidden_layers`` blocks (a transformers model's ``layers``)."""
    depth = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == depth:
            return module
    raise RuntimeError(f"no stack of {depth} layers in {type(model).__name__}")


def truncated(model: nn.Module, depth: int) -> nn.Module:
    """A copy of ``model`` keeping its first ``depth`` layers (LoRA modules included)."""
    copied = copy.deepcopy(model)
    stack = decoder_layers(copied)
    del stack[depth:]
    copied.config.num_hidden_layers = depth
    return copied


#: the non-private step every DP step is read against
PLAIN = "plain"
#: methods measured, the plain step first
METHODS = (PLAIN, "prism", "dp-adamw")
#: examples per pass on the CPU unless told (the plain recipe's default, StepSchedule.microbatch)
CPU_MICROBATCH = 32
#: a DP step's first pass on CUDA before it fits its passes to free memory
CUDA_FIRST_PASS = 64


@dataclass(frozen=True)
class Passes:
    """How a step cuts its batch: ``plain`` and ``dp`` examples per pass, ``fit``: the DP step's
    passes sized from free device memory after its first step (CUDA)."""

    plain: int
    dp: int
    fit: bool = False

    @classmethod
    def of(cls, microbatch: int, batch: int, device: torch.device) -> Passes:
        """``microbatch`` examples per pass for every method, or (0) the device's default."""
        if microbatch:
            return cls(microbatch, microbatch)
        if device.type == "cuda":
            return cls(batch, min(batch, CUDA_FIRST_PASS), fit=True)
        return cls(min(batch, CPU_MICROBATCH), min(batch, CPU_MICROBATCH))


def one_step(batch: int, passes: Passes | None = None) -> DpSteps:
    """One DP step on the whole ``batch`` (every example, clip 1, σ 1), in passes of ``passes.dp``
    examples (default: all in one)."""
    size, fit = (passes.dp, passes.fit) if passes else (batch, False)
    return DpSteps(steps=1, sample_rate=1.0, clip=1.0, noise_multiplier=1.0, microbatch=size, fit_memory=fit)


def steppers(
    model: nn.Module, task, examples: list[dict], cfg: RunConfig, methods: tuple[str, ...], passes: Passes
) -> dict[str, Callable[[], object]]:
    """One step per method on ``model`` and the whole of ``examples``, each with its own optimizer:
    ``plain`` the non-private step, the others DP steps through the engine."""
    device = next(model.parameters()).device
    plan = one_step(len(examples), passes)
    trainee, dense = Trainee(model, task, examples, device), DenseUpdate(cfg.lr)
    rngs = (np.random.default_rng(0), torch.Generator(device=device).manual_seed(0))
    out: dict[str, Callable[[], object]] = {}
    for m in methods:
        if m == PLAIN:
            out[m] = plain_step(trainee, cfg.lr, passes.plain)
        else:
            dp = make_dp_optimizer(m, lora_layers(model), cfg.lr)
            out[m] = functools.partial(dp_train, trainee, dp, plan, dense, rngs=rngs, desc=m)
    return out


def plain_step(trainee: Trainee, lr: float, microbatch: int) -> Callable[[], None]:
    """The clients' non-private step on all of ``trainee``'s examples: the mean loss's gradient in
    passes of ``microbatch`` examples, then AdamW on the trainable parameters (its own state)."""
    model = trainee.model
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, foreach=True)
    idx = range(len(trainee.examples))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        mean_loss_backward(model, trainee.task, trainee.examples, idx, trainee.device, microbatch)
        opt.step()

    return step


def step_ops(
    model: nn.Module, task, examples: list[dict], cfg: RunConfig, methods: tuple[str, ...], passes: Passes
) -> dict[str, int]:
    """Aten ops of one step per method on ``model`` (fresh optimizers, one warm-up step each)."""
    out = {}
    for m, step in steppers(model, task, examples, cfg, methods, passes).items():
        step()
        out[m] = count_ops(step)
    return out


def step_costs(
    cfg: RunConfig, methods: tuple[str, ...], batches: tuple[int, ...], repeats: int, microbatch: int = 0
) -> Iterator[dict[str, dict[str, float]]]:
    """Per batch size in ``batches``, in turn: median ``seconds``, ``peak_bytes`` and
    ``step_extra_bytes`` per method (one process, method by method), and, for the first size,
    ``ops`` per step and ``ops_per_layer`` (the growth per decoder layer, against half the depth);
    ops do not depend on the batch."""
    split = open_split(cfg, 1)
    bundle = open_model(cfg, split)
    model, device = bundle.model, bundle.device
    apply_lora_init(model, "balanced", cfg.seed)
    task = make_task(bundle, split.corpus, cfg.max_length, cfg.lm_blocks)
    need = max(batches)
    texts = split.clients[0][: max(64, 2 * need)]
    pool = task.encode(split.texts(texts), split.labels(texts))
    blocks = [ex for ex in pool if len(ex["ids"]) == cfg.max_length]
    if len(blocks) < need:
        raise RuntimeError(f"only {len(blocks)} full-length blocks of {cfg.max_length} tokens")
    for k, batch in enumerate(batches):
        examples, passes = blocks[:batch], Passes.of(microbatch, batch, device)
        steps = steppers(model, task, examples, cfg, methods, passes)
        samples: dict[str, dict[str, list[float]]] = {
            m: {"seconds": [], "peak": [], "extra": []} for m in methods
        }
        for m in methods:  # in blocks: each measured step follows a step of its own method
            for i in range(repeats + 1):
                before = _reset_peak(device)
                start = time.perf_counter()
                steps[m]()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds = time.perf_counter() - start
                peak = _peak(device)
                if i:  # the first step is warm-up
                    samples[m]["seconds"].append(seconds)
                    samples[m]["peak"].append(peak)
                    # Linux batches RSS counters per thread (up to 64 pages each), so on the CPU a step
                    # that allocates nothing can read a few pages under ``before``: that is zero extra.
                    samples[m]["extra"].append(max(peak - before, 0))
        costs = {
            m: {
                "seconds": statistics.median(s["seconds"]),
                "peak_bytes": statistics.median(s["peak"]),
                "step_extra_bytes": statistics.median(s["extra"]),
                "passes": {"plain": passes.plain, "dp": passes.dp, "fit": passes.fit},
            }
            for m, s in samples.items()
        }
        if k == 0:
            ops = step_ops(model, task, examples, cfg, methods, passes)
            depth = model.config.num_hidden_layers
            half = depth // 2
            fewer = step_ops(truncated(model, half), task, examples, cfg, methods, passes) if half else None
            for m in methods:
                costs[m]["ops"] = ops[m]
                costs[m]["ops_per_layer"] = (ops[m] - fewer[m]) / (depth - half) if fewer else float("nan")
        yield costs


def _batches(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--batch takes sizes like 32 or 32,128, not {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--batch sizes must be positive, got {text!r}")
    return sizes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument(
        "--batch",
        type=_batches,
        default=(8,),
        help="examples per step; a list (32,128) measures each in turn",
    )
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument(
        "--microbatch",
        type=int,
        default=0,
        help="examples per pass for every method (0: on CUDA one pass for the plain step and passes "
        "fitted to free memory for the DP steps; on the CPU 32)",
    )
    parser.add_argument(
        "--repeats", type=int, default=7, help="measured steps per method (after one warm-up)"
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda[:N]")
    parser.add_argument(
        "--precision",
        default="fp32",
        help="the frozen base's precision (fp32, bf16, auto); the DP math stays fp32",
    )
    parser.add_argument("--json", action="store_true")


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def record_of(args: argparse.Namespace, batch: int, costs: dict, device: str) -> dict:
    """One batch size's JSON record: every method's costs, PRISM against dp-adamw, and each DP step
    against the plain step (``over_plain``: time and peak-memory ratios)."""
    prism, base, plain = costs["prism"], costs["dp-adamw"], costs[PLAIN]
    record = {
        "model": args.model,
        "targets": args.targets,
        "rank": args.rank,
        "batch": batch,
        "seq": args.seq,
        "repeats": args.repeats,
        "device": device,
        "threads": torch.get_num_threads(),
        "plain": plain,
        "prism": prism,
        "dp_adamw": base,
        "over_plain": {
            key: {
                "time": _ratio(c["seconds"], plain["seconds"]),
                "memory": _ratio(c["peak_bytes"], plain["peak_bytes"]),
            }
            for key, c in (("prism", prism), ("dp_adamw", base))
        },
        "time_ratio": prism["seconds"] / base["seconds"],
        "memory_ratio": prism["peak_bytes"] / base["peak_bytes"],
        "step_extra_memory_ratio": prism["step_extra_bytes"] / max(base["step_extra_bytes"], 1),
        "precision": args.precision,
    }
    if "ops" in prism:
        record["ops_ratio"] = prism["ops"] / base["ops"]
        record["prism_extra_ops_per_layer"] = prism["ops_per_layer"] - base["ops_per_layer"]
        record["ops_over_plain"] = {
            key: _ratio(c["ops"], plain["ops"]) for key, c in (("prism", prism), ("dp_adamw", base))
        }
    return record


def _print(record: dict) -> None:
    r = record
    print(
        f"one step, {r['model']}, r = {r['rank']}, targets {r['targets']}, batch {r['batch']} x {r['seq']} "
        f"tokens, {r['device']}, base {r['precision']}, median of {r['repeats']}"
    )
    for label, key in (("plain", "plain"), ("prism", "prism"), ("dp-adamw", "dp_adamw")):
        c = r[key]
        ops = f"   {c['ops']:7d} ops ({c['ops_per_layer']:.0f} per layer)" if "ops" in c else ""
        versus = r["over_plain"].get(key)
        against = f"   {versus['time']:.2f}x time, {versus['memory']:.2f}x memory of plain" if versus else ""
        print(
            f"  {label:9s} {c['seconds'] * 1e3:9.1f} ms   peak {c['peak_bytes'] / 2**20:8.1f} MiB   "
            f"step extra {c['step_extra_bytes'] / 2**20:7.1f} MiB{ops}{against}"
        )
    line = f"  prism / dp-adamw: time {r['time_ratio']:.3f}, memory {r['memory_ratio']:.3f}"
    if "ops_ratio" in r:
        line += (
            f", ops {r['ops_ratio']:.3f}, PRISM's extra ops per layer {r['prism_extra_ops_per_layer']:.0f}"
        )
    print(line)


def run(args: argparse.Namespace) -> int:
    cfg = RunConfig(
        model=args.model,
        dataset="news-articles",
        targets=args.targets,
        rank=args.rank,
        max_length=args.seq,
        device=args.device,
        precision=args.precision,
        num_clients=1,
        partition="iid",
        lr=1e-4,
    ).check()
    device = resolve_device(cfg.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for batch, costs in zip(
        args.batch, step_costs(cfg, METHODS, args.batch, args.repeats, args.microbatch), strict=True
    ):
        record = record_of(args, batch, costs, name)
        if args.json:
            print(json.dumps(record), flush=True)
        else:
            _print(record)
    return 0
