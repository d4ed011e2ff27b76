"""``fedlora bench subspace``: how much of the clients' REAL increments a subspace fitted on public
data keeps, against a random subspace of the same size.

The server holds ``--public-fraction`` of the training pool (split off before partitioning: no client
has it) and computes ``--public-increments`` increments itself with the clients' local recipe (the
same steps, batch size, learning rate and optimizer, each from its own seed and batches) from the
global adapter. :func:`autoencoder.codecs.fit_pca` fits a ``k``-number basis on them. ``--clients``
nodes then run one real train round (the real ClientApp, release ``none``) from the same adapter,
and each codec's ``decode∘encode`` of their increments is compared with the truth:

- ``energy``: ``‖x̂‖² / ‖x‖²`` (the share of the increment's energy kept; every codec here is an
  orthogonal projection, so this is ``cosine²``); ``cosine``; both the mean over clients and for the
  clients' mean increment (what the server aggregates).

``k = D / c`` for each ``--compression c``; a ``pca`` basis has at most as many directions as public
increments, so its ``k`` is capped there (the row says so), and ``random-projection`` is measured at
the ``k`` that ``pca`` actually used. ``identity`` keeps everything (the check). Zero privacy cost:
public data only on the server; the clients' increments never leave the bench.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from autoencoder.codecs import Codec, IdentityCodec, RandomProjectionCodec, fit_pca
from autoencoder.layout import Layout
from common.config import RunConfig, to_flat
from common.errors import FedloraError
from common.lazy import load_component
from common.models import AdapterState
from server.bench.codec import collect_increments, collection_config, errors, start_state
from server.evaluation import Evaluator
from server.inprocess import InProcessGrid
from server.public_prior import public_increments
from server.simulate import CLIENT_APP
from server.simulate_cli import add_config_arguments, config_from_args


def kept(codec: Codec, layout: Layout, truths: Sequence[AdapterState]) -> dict[str, float]:
    """Energy kept and cosine, mean over ``truths`` and of their mean (see the module docstring)."""

    def one(x: AdapterState) -> dict[str, float]:
        e = errors(layout, codec.decode(codec.encode(x)), x)
        return {"energy": e["cosine"] ** 2, "cosine": e["cosine"]}

    per = [one(x) for x in truths]
    mean = {k: sum(x[k] for x in truths) / len(truths) for k in layout.names}
    agg = one(mean)
    return {
        "energy": sum(p["energy"] for p in per) / len(per),
        "cosine": sum(p["cosine"] for p in per) / len(per),
        "mean_energy": agg["energy"],
        "mean_cosine": agg["cosine"],
    }


def bench_subspace(
    cfg: RunConfig,
    clients: int,
    count: int,
    compressions: Sequence[int],
    echo: Callable[[str], None],
    start_from: str | None = None,
) -> dict:
    if cfg.public_fraction <= 0:
        raise FedloraError("bench subspace needs --public-fraction > 0 (the server's public data)")
    if not 1 <= clients <= cfg.num_clients:
        raise FedloraError(f"--clients must be in [1, {cfg.num_clients}] (--num-clients), got {clients}")
    if count < 1 or any(c < 1 for c in compressions):
        raise FedloraError("--public-increments and every --compression must be >= 1")
    started = time.monotonic()
    evaluator = Evaluator(cfg)
    state, origin = start_state(evaluator, start_from)
    layout = Layout.from_shapes({k: tuple(v.shape) for k, v in state.items()}, 1)
    t0 = time.monotonic()
    samples = public_increments(evaluator, cfg, state, count, layout)
    public_seconds = time.monotonic() - t0
    echo(f"{count} public increments in {public_seconds:.0f} s")
    grid = InProcessGrid(load_component(CLIENT_APP), cfg.num_clients, to_flat(collection_config(cfg)))
    nodes = sorted(grid.get_node_ids())[:clients]
    t0 = time.monotonic()
    truths = [{k: inc[k] for k in layout.names} for inc in collect_increments(grid, cfg, nodes, state)]
    private_seconds = time.monotonic() - t0
    echo(f"{len(truths)} client increments in {private_seconds:.0f} s")
    D = layout.num_coords
    records = [
        {"codec": "identity", "k": D, "compression": 1.0, **kept(IdentityCodec(layout), layout, truths)}
    ]
    for c in compressions:
        k = max(1, D // c)
        k_pca = min(k, count)
        pca = fit_pca(layout, samples, k_pca)
        note = "" if k_pca == k else f"capped at the {count} public increments (asked {k})"
        records.append(
            {"codec": "pca", "k": k_pca, "compression": D / k_pca, "note": note, **kept(pca, layout, truths)}
        )
        for size in sorted({k_pca, k}):
            projection = RandomProjectionCodec(layout, size, seed=cfg.seed, cache_floats=D * size)
            records.append(
                {
                    "codec": "random-projection",
                    "k": size,
                    "compression": D / size,
                    **kept(projection, layout, truths),
                }
            )
    return {
        "model": cfg.model,
        "dataset": cfg.dataset,
        "start": origin,
        "factor_coords": D,
        "public_fraction": cfg.public_fraction,
        "public_examples": len(evaluator.split.public),
        "public_increments": count,
        "clients": len(truths),
        "recipe": f"{cfg.local_steps} {cfg.client_optimizer} step(s) of {cfg.batch_size} at lr {cfg.lr:g}",
        "privacy": "none spent: public data on the server; client increments stay in the bench",
        "public_seconds": round(public_seconds, 1),
        "private_seconds": round(private_seconds, 1),
        "seconds": round(time.monotonic() - started, 1),
        "records": records,
    }


def format_table(result: dict) -> str:
    lines = [
        f"subspaces on real increments: {result['model']} / {result['dataset']}, D = {result['factor_coords']:,}, "
        f"from {result['start']}; {result['clients']} clients and {result['public_increments']} public increments "
        f"({result['public_examples']} public examples, fraction {result['public_fraction']:g}), each "
        f"{result['recipe']}; {result['seconds']:.0f} s; {result['privacy']}",
        "",
        f"{'codec':18s} {'k':>7s} {'compression':>11s} {'energy':>7s} {'cosine':>7s} {'mean: energy':>12s} {'cosine':>7s}",
    ]
    for r in result["records"]:
        lines.append(
            f"{r['codec']:18s} {r['k']:7,d} {r['compression']:10.1f}x {r['energy']:7.3f} {r['cosine']:7.3f} "
            f"{r['mean_energy']:12.3f} {r['mean_cosine']:7.3f} {r.get('note', '')}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.set_defaults(preset="minilm-rt-xdev")
    add = parser.add_argument
    add("--clients", type=int, default=32, help="clients whose real increments are compared")
    add("--compression", default="16,64", help="comma-separated D/k ratios (default 16,64)")
    add("--start-from", metavar="RUN", help="a run's directory or checkpoint: start from its global adapter")
    add("--json", action="store_true", help="one JSON object")


def run(args: argparse.Namespace) -> int:
    try:
        compressions = [int(c) for c in args.compression.split(",") if c.strip()]
    except ValueError:
        raise FedloraError(
            f"--compression takes comma-separated integers, got '{args.compression}'"
        ) from None
    echo = lambda line: print(line, file=sys.stderr)  # noqa: E731
    cfg = config_from_args(args)
    result = bench_subspace(cfg, args.clients, cfg.public_increments, compressions, echo, args.start_from)
    print(json.dumps(result) if args.json else format_table(result))
    return 0
