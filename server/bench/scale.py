"""``fedlora bench scale``: what a federation costs as the population grows.

For each population N (default 10, 100 and 1,000 nodes) a fresh process runs ``fedlora simulate``
in-process (real ServerApp and ClientApp) for ``--rounds`` rounds with about ``--cohort`` clients
sampled per round (Poisson rate cohort / N), one local step each, no evaluation until the end.
Reported per N, from the run's metrics lines (the first round, which loads the model, is left out):
``round_s`` (mean wall time of a round), ``client_s`` (round time per reply: the cost of one
client's round), and ``peak_rss_mb`` (the whole process's peak resident memory, from the kernel).
Per-client time and memory should stay flat as N grows: a node costs nothing until it is sampled.

Each population runs once per ``--precisions`` × ``--workers`` (the frozen base's precision and the
client worker processes, server/workers.py), side by side. Beside them the bench measures this
machine's single-thread matrix-product peak at each precision (``torch.nn.functional.linear`` of
(400×384)·(384×1536), the shape of a MiniLM feed-forward product) and counts one client's FLOPs
(torch's FlopCounterMode over one client's local update at the run's settings), so that each row
reports its achieved GFLOP/s and the fraction of the peak of the cores it used.

``--backend inprocess,ray`` also runs the same federation through Flower's own Ray simulation
(``flwr run .`` with ``num-supernodes = N`` and one CPU per client actor, so as many workers as
cores, each keeping one model per process) at each precision, and reports ``vs_ray``: the Ray
row's per-client time over the fastest in-process row's at the same precision and population (> 1:
in-process is faster). Ray's round and per-client times come from the same metrics lines; its memory
is spread over the Ray workers and is not reported. Pointing that backend at a multi-machine Ray cluster
is Flower's ``[tool.flwr.federations]`` / ``--federation-config`` business (docs/cross-device.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.config import PRECISIONS
from common.cores import available_cores
from common.device import resolve_device
from common.errors import FedloraError
from common.flower_processes import flower_env, flower_executable, toml_pairs
from common.lazy import load_component
from common.models.registry import RANDOM, SHAPES
from server.workers import resolve_workers

#: FLOPs of one client's local step, counted on the client's own code (named, as the ClientApp is)
CLIENT_FLOPS = "client.bench.flops:client_flops"

ROOT = Path(__file__).resolve().parents[2]  # the Flower app (pyproject.toml)

POPULATIONS = (10, 100, 1000)
#: the child runs the CLI, then reports its peak device memory (MiB, 0 without CUDA) and its own
#: peak RSS (KiB on Linux) on the last two stderr lines
_CHILD = (
    "import resource, sys; from common.cli import main; rc = main(sys.argv[1:]); import torch; "
    "cuda = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_initialized() else 0; "
    "print('peak-cuda-mib', cuda, file=sys.stderr); "
    "print('peak-rss-kib', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); sys.exit(rc)"
)
ENGINES = ("sequential", "batched")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", default="minilm-rt-xdev", help="base configuration (default minilm-rt-xdev)"
    )
    parser.add_argument(
        "--populations", default=",".join(map(str, POPULATIONS)), help="comma-separated node counts N"
    )
    parser.add_argument("--cohort", type=int, default=10, help="expected clients per round (default 10)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds per population (default 3; the first is warm-up)"
    )
    parser.add_argument(
        "--backend",
        default="inprocess",
        help="comma-separated: inprocess (fedlora simulate) and/or ray (flwr run . on Flower's Ray "
        "simulation); default inprocess",
    )
    parser.add_argument(
        "--precisions", default="fp32,bf16", help="frozen base precisions to compare (default fp32,bf16)"
    )
    parser.add_argument(
        "--workers", default="1,2", help="client worker process counts to compare (default 1,2; not ray)"
    )
    parser.add_argument(
        "--engine",
        default="sequential",
        help="comma-separated client engines to compare: sequential and/or batched (client/cohort.py); "
        "default sequential",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    parser.add_argument(
        "--shape",
        default="",
        choices=["", *SHAPES],
        help="time a random-weight Llama of this shape instead of the preset's model (no weights on disk; "
        "use with a language-modelling preset such as smollm2-shakespeare-xdev)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")


@dataclass(frozen=True)
class ScaleCase:
    """One federation the bench measures: ``preset`` with ``population`` nodes, about ``cohort``
    sampled per round (Poisson rate cohort / population), ``rounds`` rounds (the first is warm-up),
    run by ``backend`` (``inprocess`` or ``ray``) with the frozen base at ``precision``, ``workers``
    client worker processes (0: the preset's; in-process only), the client ``engine`` (sequential or
    batched), on ``device``, with the preset's model or a random-weight Llama of ``shape``."""

    preset: str
    population: int
    cohort: int
    rounds: int
    backend: str = "inprocess"
    precision: str = "auto"
    workers: int = 0
    engine: str = "sequential"
    device: str = "cpu"
    shape: str = ""

    def options(self) -> dict[str, object]:
        """The ``fedlora simulate`` options (or the Flower run config) of this federation."""
        return {
            "preset": self.preset,
            "precision": self.precision,
            **({"workers": self.workers} if self.workers else {}),
            "engine": self.engine,
            "device": self.device,
            **({"model": RANDOM + self.shape} if self.shape else {}),
            "mechanism": "fedavg",
            "num-clients": self.population,
            "sample-rate": min(1.0, self.cohort / self.population),
            "rounds": self.rounds,
            "local-steps": 1,
            "eval-examples": 50,
            "eval-every": self.rounds,
        }


def _inprocess(
    options: dict[str, object], out: Path
) -> tuple[subprocess.CompletedProcess, tuple[float, float] | None]:
    """``fedlora simulate`` in a fresh process: its result and (peak RSS MiB, peak device MiB)."""
    args = [x for k, v in options.items() for x in (f"--{k}", str(v))]
    cmd = [sys.executable, "-c", _CHILD, "simulate", *args, "--out", str(out)]
    done = subprocess.run(cmd, env={**os.environ, "TQDM_DISABLE": "1"}, capture_output=True, text=True)
    tail = done.stderr.strip().splitlines()
    if done.returncode != 0:
        return done, None
    return done, (int(tail[-1].split()[-1]) / 1024, float(tail[-2].split()[-1]))


def _ray(options: dict[str, object], out: Path) -> tuple[subprocess.CompletedProcess, tuple | None]:
    home = out.parent / f"{out.name}-flwr"
    run_config = toml_pairs({**options, "out-dir": str(out)})
    federation = (
        f"num-supernodes={options['num-clients']} client-resources-num-cpus=1 client-resources-num-gpus=0.0"
    )
    cmd = [flower_executable("flwr"), "run", str(ROOT), "--stream", "--run-config", run_config]
    env = {
        **flower_env(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FEDLORA_NODE_STATE_ROOT": str(out.parent / f"{out.name}-nodes"),  # not ~/.fedlora
    }
    try:
        done = subprocess.run(
            [*cmd, "--federation-config", federation], env=env, capture_output=True, text=True
        )
    finally:  # `flwr run` leaves a detached SuperLink behind: stop the one with our FLWR_HOME
        subprocess.run(["pkill", "-f", str(home)], capture_output=True)
    return done, None


def measure(case: ScaleCase, work: Path) -> dict:
    """``case`` in a fresh process under ``work``; ``client_s`` and ``round_s`` over rounds 2..``rounds``."""
    population, backend, precision, workers = case.population, case.backend, case.precision, case.workers
    out = work / f"{backend}-n{population}-{precision}-w{workers}-{case.engine}"
    start = time.monotonic()
    runner = _ray if backend == "ray" else _inprocess
    done, peaks = runner(case.options(), out)
    peak, device_peak = peaks or (None, None)
    if done.returncode != 0 or not (out / "metrics.jsonl").exists():
        lines = [x for x in (done.stderr + done.stdout).strip().splitlines() if "peak-rss-kib" not in x]
        raise FedloraError(f"population {population} ({backend}): {(lines or ['failed'])[-1][:300]}")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in lines if r.get("phase") == "train" and r["round"] > 1 and r["replied"]]
    if not timed:
        raise FedloraError(f"population {population}: no sampled round after the first; raise --rounds")
    seconds, replies = sum(r["seconds"] for r in timed), sum(r["replied"] for r in timed)
    return {
        "population": population,
        "rounds_timed": len(timed),
        "replies": replies,
        "round_s": round(seconds / len(timed), 3),
        "client_s": round(seconds / replies, 4),
        "clients_per_s": round(replies / seconds, 2),
        "backend": backend,
        "engine": case.engine,
        "precision": precision,
        "workers": workers if backend == "inprocess" else available_cores(),
        "peak_rss_mb": None if peak is None else round(peak, 1),
        "peak_device_mb": None if not device_peak else round(device_peak, 1),
        "wall_s": round(time.monotonic() - start, 1),
    }


def matmul_peak(precision: str, device: str = "cpu", seconds: float = 0.5) -> float:
    """GFLOP/s of ``linear`` at ``precision``: on the CPU single-threaded at a MiniLM feed-forward
    shape, (400×384)·(384×1536); on CUDA the whole device at (8192×8192)·(8192×8192)."""
    import torch

    from common.models.precision import DTYPES

    cuda = device.startswith("cuda")
    m, k, n = (8192, 8192, 8192) if cuda else (400, 384, 1536)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dtype = DTYPES[precision]
        x = torch.randn(m, k, dtype=dtype, device=device)
        w = torch.randn(n, k, dtype=dtype, device=device)
        torch.nn.functional.linear(x, w)  # warm-up
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            torch.nn.functional.linear(x, w)
            count += 1
            if cuda:
                torch.cuda.synchronize()
                elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return 2 * m * k * n * count / elapsed / 1e9


def run(args: argparse.Namespace) -> int:
    populations = [int(x) for x in args.populations.split(",") if x.strip()]
    if not populations or min(populations) < 1 or args.cohort < 1 or args.rounds < 2:
        raise FedloraError("--populations must be positive counts, --cohort >= 1 and --rounds >= 2")
    device = str(resolve_device(getattr(args, "device", "cpu")))
    precisions = [x.strip() for x in getattr(args, "precisions", "auto").split(",") if x.strip()]
    workers = [
        resolve_workers(int(x), device) for x in str(getattr(args, "workers", "0")).split(",") if x.strip()
    ]
    if not precisions or any(p not in PRECISIONS for p in precisions) or min(workers, default=0) < 0:
        raise FedloraError(f"--precisions takes {', '.join(PRECISIONS)}; --workers counts >= 0")
    backends = [x.strip() for x in str(args.backend).split(",") if x.strip()]
    if not backends or not set(backends) <= {"inprocess", "ray"}:
        raise FedloraError("--backend takes inprocess, ray or both (comma-separated)")
    engines = [x.strip() for x in str(getattr(args, "engine", "sequential")).split(",") if x.strip()]
    if not engines or not set(engines) <= set(ENGINES):
        raise FedloraError(f"--engine takes {', '.join(ENGINES)} (comma-separated)")
    shape = getattr(args, "shape", "")
    combos = [
        (b, p, w, e)
        for b in backends
        for p in precisions
        for w in (workers if b == "inprocess" else [0])
        for e in (engines if b == "inprocess" else ["sequential"])
    ]
    with tempfile.TemporaryDirectory() as work:
        rows = []
        for n in populations:  # each in its own process: its own peak RSS
            for backend, precision, count, engine in combos:
                case = ScaleCase(
                    args.preset, n, args.cohort, args.rounds, backend, precision, count, engine, device, shape
                )
                rows.append(measure(case, Path(work)))
                print(
                    f"N = {n}, {backend}, {engine}, {precision}, workers {count}: {rows[-1]}", file=sys.stderr
                )
    peaks = {p: round(matmul_peak(resolve(p, device), device), 1) for p in precisions}
    flops = load_component(CLIENT_FLOPS)(args.preset, device, shape)
    cuda = device.startswith("cuda")
    base = rows[0]
    for row in rows:
        row["client_s_ratio"] = round(row["client_s"] / base["client_s"], 3)
        row["speedup"] = speedup(row, rows)
        row["gflops"] = round(flops / row["client_s"] / 1e9, 1)
        row["peak_fraction"] = round(row["gflops"] / (peaks[row["precision"]] * max(1, row["workers"])), 3)
        if row["peak_rss_mb"] is not None and base["peak_rss_mb"] is not None:
            row["peak_rss_ratio"] = round(row["peak_rss_mb"] / base["peak_rss_mb"], 3)
    _versus_ray(rows)
    result = {
        "preset": args.preset,
        "model": RANDOM + shape if shape else None,
        "cohort": args.cohort,
        "rounds": args.rounds,
        "device": device_name(device),
        "cores": available_cores(),
        ("matmul_peak_gflops_per_device" if cuda else "matmul_peak_gflops_per_core"): peaks,
        "client_gflop": round(flops / 1e9, 2),
        "rows": rows,
    }
    if args.json:
        print(json.dumps(result))
    else:
        per = "device" if cuda else "core"
        print(
            f"{result['device']}; matmul peak per {per} (GFLOP/s): {peaks}; one client's update: {flops / 1e9:.2f} GFLOP"
        )
        print(
            f"{'N':>6} {'backend':>9} {'engine':>10} {'precision':>9} {'workers':>7} {'round s':>8} {'client s':>9} "
            f"{'clients/s':>9} {'speedup':>7} {'GFLOP/s':>8} {'of peak':>7} {'peak RSS MB':>12} {'device MB':>10} "
            f"{'vs ray':>7}"
        )
        for r in rows:
            print(
                f"{r['population']:>6} {r['backend']:>9} {r['engine']:>10} {r['precision']:>9} {r['workers']:>7} "
                f"{r['round_s']:>8} {r['client_s']:>9} {r['clients_per_s']:>9} {r['speedup'] or 'n/a':>7} "
                f"{r['gflops']:>8} {r['peak_fraction']:>7} {r['peak_rss_mb'] or 'n/a':>12} "
                f"{r['peak_device_mb'] or 'n/a':>10} {r.get('vs_ray', ''):>7}"
            )
    return 0


def device_name(device: str) -> str:
    """The device in words: the GPU's name, or the CPU with its core count."""
    if device.startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))} ({torch.cuda.device_count()} GPU)"
    return f"cpu ({available_cores()} cores)"


def speedup(row: dict, rows: list[dict]) -> float | None:
    """``row``'s per-client speedup over the sequential reference of its own population: the
    in-process, sequential-engine, fp32, one-worker row of the same N (None when that row was not measured). A ratio
    across populations would mix the engine's gain with the population's own per-client cost."""
    reference = next(
        (
            r
            for r in rows
            if (r["backend"], r["engine"], r["precision"], r["workers"], r["population"])
            == ("inprocess", "sequential", "fp32", 1, row["population"])
        ),
        None,
    )
    return round(reference["client_s"] / row["client_s"], 2) if reference else None


def _versus_ray(rows: list[dict]) -> None:
    """Each Ray row gets ``vs_ray``: its per-client time over the fastest in-process row's at the same
    population and precision (> 1: the in-process engine is faster per client)."""
    for ray in (r for r in rows if r["backend"] == "ray"):
        same = [
            r["client_s"]
            for r in rows
            if r["backend"] == "inprocess"
            and (r["population"], r["precision"]) == (ray["population"], ray["precision"])
        ]
        if same:
            ray["vs_ray"] = round(ray["client_s"] / min(same), 2)


def resolve(precision: str, device: str = "cpu") -> str:
    """``auto`` as ``device`` resolves it."""
    from common.models.precision import resolve_precision

    return resolve_precision(precision, device)
