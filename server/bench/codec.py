"""``fedlora bench codec``: how well each DR-Encoder codec reconstructs REAL client increments.

A short federation on :class:`server.inprocess.InProcessGrid` with the real ClientApp: the server's
statistics round (``server/drencoder.py``: one ``query.gradstats`` to every node), the autoencoder trained
on those statistics, then ONE train round (release ``none``) from the initial global adapter, whose
replies (validated by ``common.wire.parse_train_reply``) are every client's true increment.

With ``--public-fraction`` the server also computes ``--public-increments`` increments on its public split
(server/public_prior.py) and fits two public-prior codecs on them: ``pca`` (``--public-subspace`` directions,
default as many as the ``ae`` latent, at most one per increment) and ``ae-public`` (the ``ae`` architecture
trained on them instead of on the Gaussian prior). ``--ae-size tiny`` compresses 16x, ``tiny-64`` 64x.

Each codec (``ae``, ``identity``, ``constant-mean``, ``random-projection`` at the ``ae`` latent size) encodes
every increment into a coded update ``{"latent": (k,), **dense}`` (autoencoder/coded.py), which is decoded in
three orders and compared with the true increments:

- ``client``: each client's decoded increment vs its own (the mean of the per-client metrics);
- ``decode-then-aggregate``: the mean of the decoded increments vs the mean true increment (the server's
  ``decode-first``);
- ``aggregate-then-decode``: the decoded mean coded update vs the mean true increment (``aggregate-first``).

Means are unweighted over clients (as the server's ``local`` release averages). Noise settings: ``none``
(the codec alone, no clipping), ``clip=<C>`` (each coded update clipped to C, no noise: what the clip alone
does to a nonlinear decoder) and ``eps=<ε>`` for each ``--epsilon``: client-level DP, each coded update
(latent and dense entries together) clipped to L2 norm ``C = --clip``, σ calibrated so that ``--rounds``
such rounds at ``--sample-rate`` meet (ε, δ) under both the gdp and pld accountants (the larger σ,
:func:`common.privacy.planning.plan.plan_noise`), the noise placed as ``--threat-model`` says: ``local`` (the
default) N(0, σ²C²) on every client's numbers; ``distributed`` a share of it from each client;
``central`` N(0, σ²C²) on the sum only, so a mean over ~100 clients shows what a cross-device round
releases (the ``client`` order then carries no noise: the server adds it to the sum). The noise is
OS-seeded as in a real release, so noisy records vary between runs. Errors are always against the TRUE
(unclipped) increment.

Metrics over the LoRA factor entries only (dense entries such as a classification head are sent as they
are by every codec and are not compared): ``cosine`` and ``rel_l2 = ‖x̂ − x‖ / ‖x‖``. ``bytes``: float32
latent bytes per client per round, ``4 · k`` (the coded factors only); ``compression``: raw factor bytes
``4 · D`` over ``bytes`` (JSON ``null``, table ``inf``, for ``constant-mean``, which sends nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from flwr.app import Message
from flwr.serverapp import Grid

from autoencoder.codecs import CODEC_REGISTRY, CODECS, AeCodec, RandomProjectionCodec, fit_pca
from autoencoder.coded import decode_update, encode_update
from autoencoder.layout import Layout
from autoencoder.synthetic import empirical_stats, prior_moments
from autoencoder.train import loss_ends, train_autoencoder
from common.config import RunConfig, to_flat
from common.errors import FedloraError
from common.lazy import load_component
from common.models import AdapterState, adapter_shapes
from common.privacy.mechanisms.mechanism import private_mean
from common.privacy.mechanisms.release import clip_and_noise, global_norm
from common.privacy.planning.plan import BUDGET_ACCOUNTANTS, NoisePlan, plan_noise
from common.wire import InvalidReply, TrainInstruction, parse_train_reply
from server.aggregate import weighted_mean
from server.checkpoint import CHECKPOINT_FILE
from server.checkpoint import load as load_checkpoint
from server.drencoder import STATS_FILE, ServerCodec, ae_train_config, load_stats, prepare_codec
from server.evaluation import Evaluator
from server.exchange import exchange
from server.inprocess import InProcessGrid
from server.public_prior import public_increments
from server.releases import RunHandles
from server.simulate import CLIENT_APP
from server.simulate_cli import add_config_arguments, config_from_args

ORDERS = ("client", "decode-then-aggregate", "aggregate-then-decode")
#: RunConfig options the bench sets itself (it runs every codec and order, noise from --epsilon)
FIXED = (
    "mechanism",
    "release",
    "target_epsilon",
    "noise_multiplier",
    "codec",
    "decode_order",
    "out_dir",
    "resume",
)
TRAIN_ROUND = 1


def epsilons(text: str) -> tuple[float, ...]:
    """``--epsilon``: one or more comma-separated client-level ε, each finite and > 0."""
    try:
        values = tuple(float(part) for part in str(text).split(","))
    except ValueError:
        raise FedloraError(f"--epsilon must be numbers separated by commas, got {text!r}") from None
    for value in values:
        if not (value > 0 and math.isfinite(value)):
            raise FedloraError(f"--epsilon must be finite and > 0, got {value:g}")
    return values


def bench_config(args: argparse.Namespace) -> RunConfig:
    """The options as a checked ``dr-encoder`` config at the first ``--epsilon`` (σ calibrated) under
    ``--threat-model`` (default local)."""
    given = [f"--{name.replace('_', '-')}" for name in FIXED if getattr(args, name, None) is not None]
    if given:
        raise FedloraError(
            f"{', '.join(given)}: set by the bench (every codec and order, noise at --epsilon)"
        )
    cfg = config_from_args(args)
    return cfg.replace(
        mechanism="dr-encoder",
        release="",
        threat_model=args.threat_model or "local",
        target_epsilon=epsilons(args.epsilon)[0],
        noise_multiplier=0.0,
    ).check()


def noise_settings(cfg: RunConfig, eps: Sequence[float]) -> dict[str, tuple[NoisePlan, float | None]]:
    """``label -> (plan, std)``: the codec alone (``none``: no clip), ``clip=C`` (each coded update
    clipped, no noise) and ``eps=ε`` for each ε (the run's threat model; ``std``: what each client
    adds, 0 under central noise, where the plan's server noise goes on the sum). The noiseless settings
    aggregate with a local-threat plan: an unweighted mean with no server noise."""
    plans = [plan_noise(cfg.replace(target_epsilon=e)) for e in eps]
    quiet = replace(plans[0], threat_model="local")
    settings: dict[str, tuple[NoisePlan, float | None]] = {
        "none": (quiet, None),
        f"clip={quiet.clip:g}": (quiet, 0.0),
    }
    for e, plan in zip(eps, plans, strict=True):
        settings[f"eps={e:g}"] = (plan, plan.client_std(cfg.num_clients))
    return settings


def collection_config(cfg: RunConfig) -> RunConfig:
    """The run config the bench's nodes hold: ``cfg`` without its release, so that a train round
    returns each client's true increment (the bench applies codecs and noise itself)."""
    return cfg.replace(release="none")


def collect_increments(
    grid: Grid, cfg: RunConfig, nodes: Sequence[int], state: AdapterState
) -> list[AdapterState]:
    """One train round from ``state`` to every node of ``grid``, whose run config is ``cfg`` with
    release ``none`` (:func:`collection_config`); each client's true increment (same names and
    shapes as ``state``), validated as the server validates it."""
    expected = {"mechanism": cfg.mechanism, "release": "none", "noise-std": 0.0}
    counts = not collection_config(cfg).private
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    messages = [
        Message(
            TrainInstruction(TRAIN_ROUND, state).to_record(),
            dst_node_id=node,
            message_type="train",
            group_id=str(TRAIN_ROUND),
        )
        for node in nodes
    ]
    increments = []
    for node, reply, _ in exchange(grid, messages, cfg.round_timeout):
        try:
            increments.append(parse_train_reply(reply, TRAIN_ROUND, shapes, expected, counts)[0])
        except InvalidReply as exc:
            raise FedloraError(f"node {node}: invalid train reply: {exc}") from None
    if len(increments) != len(nodes):
        raise FedloraError(f"only {len(increments)} of {len(nodes)} nodes replied to the train round")
    return increments


def build_coders(
    grid: Grid,
    cfg: RunConfig,
    run_dir: Path,
    nodes: Sequence[int],
    state: AdapterState,
    echo: Callable[[str], None],
    evaluator: Evaluator | None = None,
) -> tuple[dict[str, ServerCodec], list[dict]]:
    """Every codec as the server builds it (``ae`` first: its call runs the statistics round and trains
    the autoencoder; the others reuse the statistics saved in ``run_dir``); with the phase records."""
    records: list[dict] = []
    handles = RunHandles(run_dir, None, "bench", records.append, echo, evaluator)  # no ledger: no charge
    coders = {
        name: prepare_codec(grid, cfg.replace(codec=name), nodes, state, handles)[0]
        for name in sorted(CODECS, key=lambda n: not CODEC_REGISTRY[n].spec.trains_autoencoder)
        if not CODEC_REGISTRY[name].spec.fitted_on_public
    }
    coders["random-projection"] = cached_projection(coders["random-projection"])
    if cfg.public_fraction > 0 and evaluator is not None:
        coders.update(public_coders(cfg, evaluator, state, coders["ae"].codec, records.append, echo))
    return coders, records


def public_coders(
    cfg: RunConfig,
    evaluator: Evaluator,
    state: AdapterState,
    ae: AeCodec,
    log_record: Callable[[dict], None],
    echo: Callable[[str], None],
) -> dict[str, ServerCodec]:
    """``pca`` and ``ae-public``, fitted on the same ``cfg.public_increments`` increments the server
    computes on its public split from ``state``: the pca basis keeps ``--public-subspace`` directions
    (default: as many as the ``ae`` latent, at most one per increment); ``ae-public`` is the ``ae``
    architecture trained on them (``--ae-prior public``) instead of on the Gaussian prior."""
    layout = ae.layout
    t0 = time.monotonic()
    samples = public_increments(evaluator, cfg, state, cfg.public_increments, layout)
    t1 = time.monotonic()
    k = cfg.public_subspace or min(ae.latent_size, len(samples))
    pca = fit_pca(Layout.from_shapes(layout.shapes, 1), samples, k)
    stats = [empirical_stats(layout, samples)]
    trained = train_autoencoder(
        ae.trained.config, layout, stats, ae_train_config(cfg), ae.trained.device, samples
    )
    first, final = loss_ends(trained)
    log_record(
        {
            "phase": "public",
            "public_increments": len(samples),
            "increments_seconds": round(t1 - t0, 1),
            "pca_k": k,
            "ae_public_first_loss": first,
            "ae_public_final_loss": final,
            "seconds": round(time.monotonic() - t0, 1),
        }
    )
    echo(
        f"public prior: {len(samples)} public increments in {t1 - t0:.0f} s; pca k = {k}; autoencoder "
        f"trained on them in {time.monotonic() - t1:.0f} s"
    )
    return {
        "pca": ServerCodec(pca, "pca", cfg.seed, None),
        "ae-public": ServerCodec(AeCodec(trained), "ae-public", cfg.seed, None),
    }


def cached_projection(coder: ServerCodec) -> ServerCodec:
    """The same random projection (same layout, size and seed, so the same bases) with every basis kept
    in memory: above 2^24 floats :class:`RandomProjectionCodec` rebuilds its ~D/4096 QR bases on every
    encode and decode (MiniLM r = 8: 18 QRs of 4096 x 256, 10-30 s per call on 2 busy cores)."""
    codec = coder.codec
    size = codec.layout.num_coords * codec.latent_size  # an upper bound on the floats it keeps
    same = RandomProjectionCodec(codec.layout, codec.latent_size, codec.seed, cache_floats=size)
    return ServerCodec(same, coder.version, codec.seed, None)


def errors(layout: Layout, estimate: Mapping[str, torch.Tensor], truth: Mapping[str, torch.Tensor]) -> dict:
    """``cosine`` and ``rel_l2 = ‖x̂ − x‖ / ‖x‖`` over the factor entries of ``layout`` (float64);
    the cosine is 0 when either vector is 0."""
    x, xh = layout.to_vector(truth).double(), layout.to_vector(estimate).double()
    denominator = float(x.norm() * xh.norm())
    return {
        "cosine": float(x @ xh) / denominator if denominator > 0 else 0.0,
        "rel_l2": float((xh - x).norm() / x.norm()),
    }


def order_errors(
    coder: ServerCodec, coded: Sequence[AdapterState], truths: Sequence[AdapterState], plan: NoisePlan
) -> dict[str, dict[str, float]]:
    """``{order: {"cosine", "rel_l2"}}`` of the clients' coded updates against their true increments.

    Each coded update is decoded once: ``decode-then-aggregate`` is the server's ``private_mean`` of those
    decodes (what ``ServerCodec.aggregate`` does for ``decode-first``, without decoding again), under
    ``plan``'s threat model (``local``: the unweighted mean)."""
    layout, n = coder.codec.layout, len(coded)
    decoded = [decode_update(coder.codec, c) for c in coded]
    per_client = [errors(layout, d, t) for d, t in zip(decoded, truths, strict=True)]
    mean = weighted_mean(truths, [1.0] * n)
    first = private_mean(decoded, plan.threat, plan.sigma, plan.clip, float(n))
    return {
        "client": {k: sum(e[k] for e in per_client) / n for k in ("cosine", "rel_l2")},
        "decode-then-aggregate": errors(layout, first, mean),
        "aggregate-then-decode": errors(
            layout, coder.aggregate(coded, "aggregate-first", plan, float(n)), mean
        ),
    }


def codec_records(
    name: str,
    coder: ServerCodec,
    coded: Sequence[AdapterState],
    increments: Sequence[AdapterState],
    plan: NoisePlan,
    noise: str,
    std: float | None,
) -> list[dict]:
    """One record per order for codec ``name`` from the clients' noiseless coded updates ``coded``, labelled
    ``noise``; ``std``: ``None`` = the codec alone (no clip), else each coded update is clipped to
    ``plan.clip`` and gets N(0, std²) per number (``0``: clipped only)."""
    if std is not None:
        coded = [clip_and_noise(c, plan.clip, std) for c in coded]
    size, raw = 4 * coder.codec.latent_size, 4 * coder.codec.layout.num_coords
    cost = {"bytes": size, "compression": raw / size if size else None}
    return [
        {"codec": name, "order": order, "noise": noise, **errs, **cost}
        for order, errs in order_errors(coder, coded, increments, plan).items()
    ]


def scales(layout: Layout, run_dir: Path, increments: Sequence[AdapterState]) -> dict[str, dict[str, float]]:
    """Per-coordinate RMS over all factor entries, the ``A`` and the ``B`` factors: the statistics' prior
    (``sqrt(mean E[X²])``; ``prior_mean``: of ``E[X]``, what ``constant-mean`` decodes to), the clients'
    true increments (``increment``) and their mean (``mean_increment``)."""
    first, second = prior_moments(load_stats(run_dir / STATS_FILE, layout.shapes), layout.shapes)
    n = len(increments)
    squares = {
        "prior": second,
        "prior_mean": {k: v.pow(2) for k, v in first.items()},
        "increment": {k: sum(inc[k].double().pow(2) for inc in increments) / n for k in layout.names},
        "mean_increment": {k: (sum(inc[k].double() for inc in increments) / n).pow(2) for k in layout.names},
    }
    groups = {
        "all": layout.names,
        **{kind: [k for k in layout.names if k.endswith("." + kind)] for kind in "AB"},
    }
    return {what: {group: _rms(sq, names) for group, names in groups.items()} for what, sq in squares.items()}


def _rms(squares: Mapping[str, torch.Tensor], names: Sequence[str]) -> float:
    """``sqrt`` of the mean of ``squares`` over every entry of ``names``."""
    total = sum(float(squares[k].double().sum()) for k in names)
    return math.sqrt(total / max(sum(squares[k].numel() for k in names), 1))


def norms(layout: Layout, increments: Sequence[AdapterState], coded: Mapping[str, list]) -> dict:
    """Mean L2 norms over clients: factor entries, dense entries, and each codec's coded update (latent +
    dense: what the noisy release clips)."""
    n = len(increments)
    dense = [{k: v for k, v in inc.items() if k not in layout.shapes} for inc in increments]
    return {
        "factors": sum(float(layout.to_vector(inc).norm()) for inc in increments) / n,
        "dense": sum(global_norm(d) for d in dense) / n,
        "coded": {name: sum(global_norm(c) for c in updates) / n for name, updates in coded.items()},
    }


def setup(cfg: RunConfig, plan: NoisePlan, coders: Mapping[str, ServerCodec], phases: Sequence[dict]) -> dict:
    """What the records were measured on (JSON-serialisable)."""
    layout = coders["identity"].codec.layout
    ae = next(p for p in phases if p.get("phase") == "autoencoder")
    stats = next(p for p in phases if p.get("phase") == "stats")
    public = next((p for p in phases if p.get("phase") == "public"), None)
    prior = {"public_fraction": cfg.public_fraction, **public} if public else {}
    prior.pop("phase", None)
    return {
        **prior,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "clients": cfg.num_clients,
        "local_steps": cfg.local_steps,
        "lr": cfg.lr,
        "factor_coords": layout.num_coords,
        "latent_size": coders["ae"].codec.latent_size,
        "raw_factor_bytes": 4 * layout.num_coords,
        "increment_form": cfg.increment_form,
        "stats_granularity": cfg.stats_granularity,
        "stats_floor": cfg.stats_floor,
        "stats_bytes_per_client": stats["stats_bytes_per_client"],
        "ae_size": cfg.ae_size,
        "ae_steps": cfg.ae_steps,
        "ae_normalise": cfg.ae_normalise,
        "ae_latent": cfg.ae_latent,
        "ae_first_loss": ae["first_loss"],
        "ae_final_loss": ae["final_loss"],
        "stats_seconds": stats["seconds"],
        "ae_seconds": ae["seconds"],
        "unit": "client-level",
        "threat_model": plan.threat_model,
        "epsilon": plan.target_epsilon,
        "delta": plan.delta,
        "rounds": cfg.rounds,
        "sample_rate": cfg.sample_rate,
        "accountant": "max sigma of " + ", ".join(BUDGET_ACCOUNTANTS),
        "sigma": plan.sigma,
        "clip": plan.clip,
        "noise_std": plan.sigma * plan.clip,
        "compared": "LoRA factor entries only (dense entries, e.g. a classifier head, are not coded)",
        "mean": "unweighted over clients",
    }


def start_state(evaluator: Evaluator, start_from: str | None) -> tuple[AdapterState, str]:
    """The bench round's global adapter and where it came from: round 0's, or a run's checkpoint
    (``start_from``: its ``checkpoint.safetensors`` or the run directory; same model and LoRA config)."""
    if not start_from:
        return evaluator.initial_state(), "round 0 (initial adapter)"
    path = Path(start_from)
    path = path / CHECKPOINT_FILE if path.is_dir() else path
    state, loop, _ = load_checkpoint(path, adapter_shapes(evaluator.bundle.model))
    return state, f"{path} (after round {loop.round})"


def bench_codecs(
    cfg: RunConfig,
    echo: Callable[[str], None],
    start_from: str | None = None,
    eps: Sequence[float] = (),
) -> dict:
    """The setup and one record per (codec, order, noise); see the module docstring. ``eps``: the
    client-level ε of the noisy settings (default: ``cfg.target_epsilon``)."""
    start = time.monotonic()
    eps = tuple(eps) or (cfg.target_epsilon,)
    settings = noise_settings(cfg, eps)
    plan = settings[f"eps={eps[0]:g}"][0]  # the first epsilon's plan describes the setup
    evaluator = Evaluator(cfg)
    state, origin = start_state(evaluator, start_from)
    with tempfile.TemporaryDirectory(prefix="fedlora-bench-codec-") as tmp:
        run_dir = Path(tmp)
        grid = InProcessGrid(
            load_component(CLIENT_APP),
            cfg.num_clients,
            to_flat(collection_config(cfg)),
            state_root=run_dir / "nodes",
        )
        nodes = sorted(grid.get_node_ids())
        coders, phases = build_coders(grid, cfg, run_dir, nodes, state, echo, evaluator)
        t0 = time.monotonic()
        increments = collect_increments(grid, cfg, nodes, state)
        train_seconds = time.monotonic() - t0
        echo(f"train round: {len(increments)} increments in {train_seconds:.0f} s")
        layout = coders["identity"].codec.layout
        info = {
            **setup(cfg, plan, coders, phases),
            "start": origin,
            "rms": scales(layout, run_dir, increments),
        }
    t0 = time.monotonic()
    coded = {name: [encode_update(c.codec, inc) for inc in increments] for name, c in coders.items()}
    info["norms"] = norms(layout, increments, coded)
    records = [
        rec
        for name, coder in coders.items()
        for noise, (setting_plan, std) in settings.items()
        for rec in codec_records(name, coder, coded[name], increments, setting_plan, noise, std)
    ]
    info["noise"] = [
        {"label": label, "epsilon": p.target_epsilon, "sigma": p.sigma, "client_std": std}
        for label, (p, std) in settings.items()
        if label.startswith("eps=")
    ]
    info["train_seconds"] = round(train_seconds, 1)
    info["codec_seconds"] = round(time.monotonic() - t0, 1)
    info["seconds"] = round(time.monotonic() - start, 1)
    return {**info, "records": records}


def format_table(result: Mapping) -> str:
    """The setup in a few lines, then one row per record."""
    norms_ = result["norms"]
    coded = ", ".join(f"{k} {v:.3g}" for k, v in norms_["coded"].items())
    lines = [
        f"codecs on real increments: {result['model']} / {result['dataset']}, {result['clients']} clients, "
        f"one round of {result['local_steps']} local steps at lr {result['lr']:g} from {result['start']}; {result['seconds']:.0f} s "
        f"(statistics round {result['stats_seconds']:.0f}, autoencoder {result['ae_seconds']:.0f}, train round "
        f"{result['train_seconds']:.0f}, codecs {result['codec_seconds']:.0f})",
        f"factors: D = {result['factor_coords']:,} coordinates ({result['raw_factor_bytes']:,} B), "
        f"latent k = {result['latent_size']:,}; compared on {result['compared']}",
        f"increments: {result['increment_form']}; statistics: {result['stats_granularity']} (h1 {result['stats_floor']:g}), {result['stats_bytes_per_client']:,.0f} B per client; "
        f"autoencoder {result['ae_size']}, {result['ae_steps']} steps ({result['ae_normalise']} scaling, {result['ae_latent']} latent), "
        f"loss {_g(result['ae_first_loss'])} -> {_g(result['ae_final_loss'])}",
        *(
            [
                f"public prior: {result['public_increments']} increments on the server's public split "
                f"(fraction {result['public_fraction']:g}, no client's data) in {result['increments_seconds']:.0f} s; "
                f"pca k = {result['pca_k']}; ae-public loss {_g(result['ae_public_first_loss'])} -> "
                f"{_g(result['ae_public_final_loss'])}"
            ]
            if "pca_k" in result
            else []
        ),
        "per-coordinate RMS (all / A / B factors): "
        + "; ".join(f"{k} {v['all']:.3g} / {v['A']:.3g} / {v['B']:.3g}" for k, v in result["rms"].items()),
        f"mean norms: factor increment {norms_['factors']:.3g}, dense {norms_['dense']:.3g}; "
        f"coded update {coded}",
        f"noise: {result['unit']}, {result['threat_model']} threat model, delta {result['delta']:g}, "
        f"{result['rounds']} rounds at p = {result['sample_rate']:g}, "
        + ", ".join(f"eps {n['epsilon']:g}: sigma {n['sigma']:.4g}" for n in result["noise"])
        + f" ({result['accountant']}); each coded update (latent + dense) clipped to C = {result['clip']:g}",
        f"means {result['mean']}; rel_l2 = |x_hat - x| / |x| against the true (unclipped) increment",
        "",
        f"{'codec':18s} {'order':22s} {'noise':8s} {'cosine':>8s} {'rel_l2':>10s} {'bytes':>9s} {'compression':>11s}",
    ]
    for r in result["records"]:
        ratio = "inf" if r["compression"] is None else f"{r['compression']:.1f}x"
        lines.append(
            f"{r['codec']:18s} {r['order']:22s} {r['noise']:8s} {r['cosine']:8.4f} {r['rel_l2']:10.4g} "
            f"{r['bytes']:9,d} {ratio:>11s}"
        )
    return "\n".join(lines)


def _g(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser)
    parser.set_defaults(preset="minilm-rt")
    parser.add_argument(
        "--epsilon",
        default="8",
        help="client-level epsilon of the noisy setting, or several separated by commas (delta: "
        "--delta; sigma calibrated for --sample-rate and --rounds, noise as --threat-model puts it)",
    )
    parser.add_argument(
        "--start-from",
        metavar="RUN",
        help="start the round from a run's global adapter (its directory or checkpoint.safetensors; "
        "same model and LoRA options) instead of round 0's",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object: the setup and its records")


def run(args: argparse.Namespace) -> int:
    echo = lambda line: print(line, file=sys.stderr)  # noqa: E731
    result = bench_codecs(bench_config(args), echo, args.start_from, epsilons(args.epsilon))
    print(json.dumps(result) if args.json else format_table(result))
    return 0
