"""``fedlora bench prism-step``: step time, peak memory and dispatched ops of PRISM vs factor-space DP-AdamW.

Both optimizers run on one model, batch, sequence length and set of LoRA targets, through the same
engine (client/dp/engine.py: per-example gradients, global clip, noise, step), interleaved in one
process; each figure is the median over ``--repeats`` steps after a warm-up step each. A step here is
one logical batch of exactly ``--batch`` examples of ``--seq`` tokens (news-articles blocks).

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
import json
import statistics
import time
from collections.abc import Callable
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
from common.tasks.training import Trainee


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


def one_step(batch: int) -> DpSteps:
    """One DP step on the whole ``batch`` in one micro-batch (every example, clip 1, σ 1)."""
    return DpSteps(steps=1, sample_rate=1.0, clip=1.0, noise_multiplier=1.0, microbatch=batch)


def step_ops(
    model: nn.Module,
    task,
    examples: list[dict],
    cfg: RunConfig,
    methods: tuple[str, ...],
    device: torch.device,
) -> dict[str, int]:
    """Aten ops of one DP step per method on ``model`` (fresh optimizers, one warm-up step each)."""
    plan = one_step(len(examples))
    trainee, dense = Trainee(model, task, examples, device), DenseUpdate(cfg.lr)
    out = {}
    for m in methods:
        opt = make_dp_optimizer(m, lora_layers(model), cfg.lr)

        def step(opt=opt, m=m):
            rngs = (np.random.default_rng(0), torch.Generator(device=device).manual_seed(0))
            dp_train(trainee, opt, plan, dense, rngs=rngs, desc=m)

        step()
        out[m] = count_ops(step)
    return out


def step_costs(
    cfg: RunConfig, methods: tuple[str, ...], batch: int, repeats: int
) -> dict[str, dict[str, float]]:
    """Median ``seconds``, ``peak_bytes`` and ``step_extra_bytes`` per method (one process, interleaved),
    ``ops`` per step, and ``ops_per_layer`` (the growth per decoder layer, against half the depth)."""
    split = open_split(cfg, 1)
    bundle = open_model(cfg, split)
    model, device = bundle.model, bundle.device
    apply_lora_init(model, "balanced", cfg.seed)
    task = make_task(bundle, split.corpus, cfg.max_length, cfg.lm_blocks)
    pool = task.encode(split.texts(split.clients[0][:64]), split.labels(split.clients[0][:64]))
    examples = [ex for ex in pool if len(ex["ids"]) == cfg.max_length][:batch]
    if len(examples) < batch:
        raise RuntimeError(f"only {len(examples)} full-length blocks of {cfg.max_length} tokens")
    plan = one_step(batch)
    trainee, dense = Trainee(model, task, examples, device), DenseUpdate(cfg.lr)
    opts = {m: make_dp_optimizer(m, lora_layers(model), cfg.lr) for m in methods}
    rngs = (np.random.default_rng(0), torch.Generator(device=device).manual_seed(0))
    samples: dict[str, dict[str, list[float]]] = {
        m: {"seconds": [], "peak": [], "extra": []} for m in methods
    }
    for i in range(repeats + 1):
        for m in methods:
            before = _reset_peak(device)
            start = time.perf_counter()
            dp_train(trainee, opts[m], plan, dense, rngs=rngs, desc=m)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            peak = _peak(device)
            if i:  # the first round is warm-up
                samples[m]["seconds"].append(seconds)
                samples[m]["peak"].append(peak)
                # Linux batches RSS counters per thread (up to 64 pages each), so on the CPU a step
                # that allocates nothing can read a few pages under ``before``: that is zero extra.
                samples[m]["extra"].append(max(peak - before, 0))
    ops = step_ops(model, task, examples, cfg, methods, device)
    depth = model.config.num_hidden_layers
    half = depth // 2
    fewer = step_ops(truncated(model, half), task, examples, cfg, methods, device) if half else None
    return {
        m: {
            "seconds": statistics.median(s["seconds"]),
            "peak_bytes": statistics.median(s["peak"]),
            "step_extra_bytes": statistics.median(s["extra"]),
            "ops": ops[m],
            "ops_per_layer": (ops[m] - fewer[m]) / (depth - half) if fewer else float("nan"),
        }
        for m, s in samples.items()
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
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
    costs = step_costs(cfg, ("prism", "dp-adamw"), args.batch, args.repeats)
    prism, base = costs["prism"], costs["dp-adamw"]
    device = resolve_device(cfg.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    record = {
        "model": args.model,
        "targets": args.targets,
        "rank": args.rank,
        "batch": args.batch,
        "seq": args.seq,
        "repeats": args.repeats,
        "device": name,
        "threads": torch.get_num_threads(),
        "prism": prism,
        "dp_adamw": base,
        "time_ratio": prism["seconds"] / base["seconds"],
        "memory_ratio": prism["peak_bytes"] / base["peak_bytes"],
        "step_extra_memory_ratio": prism["step_extra_bytes"] / max(base["step_extra_bytes"], 1),
        "ops_ratio": prism["ops"] / base["ops"],
        "prism_extra_ops_per_layer": prism["ops_per_layer"] - base["ops_per_layer"],
        "precision": args.precision,
    }
    if args.json:
        print(json.dumps(record))
        return 0
    print(
        f"PRISM vs dp-adamw, one DP step: {args.model}, r = {args.rank}, targets {args.targets}, "
        f"batch {args.batch} x {args.seq} tokens, {name}, median of {args.repeats}"
    )
    for label, c in (("prism", prism), ("dp-adamw", base)):
        print(
            f"  {label:9s} {c['seconds'] * 1e3:8.1f} ms   peak {c['peak_bytes'] / 2**20:8.1f} MiB   "
            f"step extra {c['step_extra_bytes'] / 2**20:7.1f} MiB   {c['ops']:7d} ops "
            f"({c['ops_per_layer']:.0f} per layer)"
        )
    print(
        f"time ratio {record['time_ratio']:.3f}   memory ratio {record['memory_ratio']:.3f}   "
        f"step-extra memory ratio {record['step_extra_memory_ratio']:.3f}   ops ratio {record['ops_ratio']:.3f}   "
        f"PRISM's extra ops per layer {record['prism_extra_ops_per_layer']:.0f}"
    )
    return 0
