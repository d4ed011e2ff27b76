"""DR-Encoder on the server (docs/design.md §4, §6): statistics round, autoencoder training and
versioning, the codec each train round names, and decode + aggregate of the clients' latents.

Phases, before round 1 of a ``dr-encoder`` run:
1. ``query.gradstats`` to every connected node (no sampling: p = 1). Statistics sent in the clear are
   the paper's setting: the ledger records them as a release its ε does not cover (round 0), before
   the query goes out. With ``stats_noise_multiplier > 0`` every client clips and noises them (local
   noise, zero-out adjacency) and the server charges one event (σ_s, p = 1) to the client-level
   ledger as round 0, before the query goes out; the noise plan calibrates σ with it included.
2. Synthetic Gaussian gradients from the statistics train the autoencoder (codec ``ae`` only); the
   checkpoint ``autoencoder.safetensors`` in the run directory names its version, and the statistics are
   kept in ``gradstats.safetensors`` so a resumed run rebuilds the same codec without a new query.
   With a public prior (``--codec pca``, or ``--codec ae --ae-prior public``) there is no statistics
   round: the codec is fitted on increments the server computes on its public data
   (server/public_prior.py) before round 1 and refitted every ``--prior-refresh`` rounds; each fit is
   kept (``pca-codec.safetensors``, ``autoencoder-public-r<round>.safetensors``) for a resume.
3. Every train round names the codec (``ae-version``) and carries the encoder; replies are coded updates
   (autoencoder/coded.py), aggregated then decoded (``aggregate-first``: the mean latent is decoded
   once, which secure aggregation allows) or decoded then aggregated (``decode-first``, local noise only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from safetensors.torch import load_file, save_file
from torch import Tensor

from autoencoder.broadcast import encoder_payload, pca_payload
from autoencoder.checkpoint import load_checkpoint, save_checkpoint
from autoencoder.codecs import Codec, make_codec
from autoencoder.coded import coded_shapes, decode_update, encode_update
from autoencoder.layout import Layout, is_factor
from autoencoder.synthetic import Stats, empirical_stats, prior_moments, unpack_stats
from autoencoder.train import TrainConfig, TrainedAe, loss_ends, train_autoencoder
from autoencoder.uformer import AeConfig
from common.atomic import replacing
from common.config import RunConfig
from common.device import resolve_device
from common.errors import FedloraError
from common.models import AdapterState
from common.privacy.accounting.ledger import Charge
from common.privacy.mechanisms.mechanism import GaussianMechanism, RoundSum
from common.privacy.planning.plan import STATS_ROUND, NoisePlan, uncovered
from common.wire import InvalidReply, StatsQuery, parse_stats_reply
from server.exchange import exchange
from server.public_prior import fit_public_basis, load_basis, public_increments, refit_round

if TYPE_CHECKING:  # server/releases imports this module (its dr-encoder release): annotations only
    from server.releases.base import RunHandles

log = logging.getLogger("fedlora.server")

AE_FILE = "autoencoder.safetensors"
PCA_FILE = "pca-codec.safetensors"
PUBLIC_AE_FILE = "autoencoder-public-r{round}.safetensors"
STATS_FILE = "gradstats.safetensors"
AE_CONFIGS: dict[str, Callable[[], AeConfig]] = {
    "tiny": AeConfig.tiny,
    "tiny-64": AeConfig.tiny64,
    "paper": AeConfig.paper,
    "paper-best": AeConfig.paper_best,
}


class ServerCodec:
    """The run's codec (it decodes, and encodes too when ``encode_at`` is ``server``) and what each
    train round tells clients about it."""

    def __init__(
        self, codec: Codec, version: str, seed: int, encoder: tuple | None, encode_at: str = "client"
    ) -> None:
        self.codec, self.version, self.encode_at = codec, version, encode_at
        self.round_config = {
            "codec": codec.name,
            "ae-version": version,
            "latent-size": codec.latent_size,
            "codec-seed": seed,
            "layout": codec.layout.to_json(),
            "encode-at": encode_at,
        }
        self.records = {}
        if encoder is not None and encode_at == "client":
            tensors, meta = encoder
            self.records = {
                "encoder": ArrayRecord.from_torch_state_dict(tensors),
                "encoder-meta": ConfigRecord(meta),
            }
        self.holders: set[int] = set()  # nodes that answered a round with this encoder

    def records_for(self, node: int) -> dict:
        """The encoder broadcast for ``node`` until it has used it (then nothing: it keeps a copy)."""
        return {} if node in self.holders else self.records

    def replied(self, node: int, ok: bool) -> None:
        """Record whether ``node`` answered with a usable coded update (else it gets the encoder again)."""
        (self.holders.add if ok else self.holders.discard)(node)

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return dict(shapes) if self.encode_at == "server" else coded_shapes(self.codec, shapes)

    def round_sum(self, inner: RoundSum, order: str) -> CodedRound:
        """The round's aggregate of coded replies around the mechanism's ``inner`` sum (see :class:`CodedRound`)."""
        return CodedRound(self, inner, order)

    def aggregate(
        self, replies: Sequence[AdapterState], order: str, plan: NoisePlan, expected: float
    ) -> AdapterState:
        """The round's decoded mean increment from the clients' (clipped, noised) coded updates, or
        from their raw increments when the server encodes (central noise: the mean clips each coded
        update to C, as a client would, before it adds the noise)."""
        total = self.round_sum(_sum_of(plan, expected), order)
        for reply in replies:
            total.add(reply)
        return total.release()[0]


def _sum_of(plan: NoisePlan, expected: float) -> RoundSum:
    """The Gaussian mechanism's round sum for ``plan`` (sampled count unused: σ is not reported here)."""
    return GaussianMechanism(plan, expected).round_sum(0)


class CodedRound:
    """A round's aggregate of coded replies: each reply is encoded on arrival when the server encodes
    (``--encode-at server``), decoded on arrival when the order is ``decode-first``; the mechanism's
    sum runs on what results, and an ``aggregate-first`` mean is decoded once at the end."""

    def __init__(self, coder: ServerCodec, inner: RoundSum, order: str) -> None:
        self.coder, self.inner, self.order = coder, inner, order

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        coded = encode_update(self.coder.codec, reply) if self.coder.encode_at == "server" else reply
        self.inner.add(decode_update(self.coder.codec, coded) if self.order == "decode-first" else coded)

    def release(self) -> tuple[AdapterState, float | None]:
        mean, sigma = self.inner.release()
        return (mean if self.order == "decode-first" else decode_update(self.coder.codec, mean)), sigma


def ae_latent_size(config: AeConfig, layout: Layout) -> int:
    """Numbers in the autoencoder's latent: ``num_images · c_k · (H / 2^k) · (W / 2^k)``."""
    f = config.downsample
    return layout.num_images * config.channels[-1] * (layout.height // f) * (layout.width // f)


def prepare_codec(
    grid: Grid, cfg: RunConfig, nodes: Sequence[int], state: AdapterState, run: RunHandles
) -> tuple[ServerCodec, dict]:
    """Statistics, autoencoder and codec of the run (reused from ``run.run_dir`` on resume; the
    statistics round charged to ``run.ledger``, the phases logged through ``run.log``); returns the
    codec and a summary (payload bytes, AE version, latent size, compression). ``pca``: no statistics
    round; the basis is fitted on the server's public increments (``run.evaluator``: the server's
    model and public split) before round 1 and broadcast like an encoder."""
    run_dir, ledger, echo = run.run_dir, run.ledger, run.echo
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    factors = {k: s for k, s in shapes.items() if is_factor(k)}
    if cfg.codec_spec.fitted_on_public:  # pca: a basis of public increments
        codec, info = _public_codec(cfg, Layout.from_shapes(factors, 1), state, run)
        return _announce(cfg, codec, codec.version, shapes, info, pca_payload(codec), echo)
    ae_config = AE_CONFIGS[cfg.ae_size]()
    layout = Layout.from_shapes(factors, ae_config.downsample)
    if cfg.public_prior:  # the autoencoder on the public prior
        fitted = latest_public_ae(run_dir)
        if fitted is not None:
            trained, version = _load_ae(fitted[1], cfg, ae_config, layout)
            echo(f"autoencoder {version} (public prior): reused from {fitted[1]}")
            info = {"prior": f"public (reused from {fitted[1]})"}
        else:
            trained, version, info = fit_public_ae(cfg, ae_config, layout, state, 1, run)
            run.log({"round": STATS_ROUND, "phase": "autoencoder", **info})
        codec = make_codec(cfg.codec, trained=trained)
        return _announce(cfg, codec, version, shapes, info, encoder_payload(trained, version), echo)
    stats_path = run_dir / STATS_FILE
    if stats_path.exists():
        stats_list, info = load_stats(stats_path, factors), {"stats": "reused from " + str(stats_path)}
    else:
        stats_list, info = _stats_round(grid, cfg, nodes, state, factors, run)
        save_stats(stats_path, stats_list)
        if ledger and cfg.stats_noise_multiplier > 0:
            ledger.settle(run.run_id, STATS_ROUND, "applied", replied=len(stats_list))
        run.log({"round": STATS_ROUND, "phase": "stats", **info})
    encoder = None
    if cfg.codec_spec.trains_autoencoder:
        trained, version = _autoencoder(cfg, ae_config, layout, stats_list, run)
        codec = make_codec(cfg.codec, trained=trained)
        encoder = encoder_payload(trained, version)
    else:
        mean, _ = prior_moments(stats_list, layout.shapes)
        latent = ae_latent_size(ae_config, layout)
        codec = make_codec(cfg.codec, layout=layout, mean=mean, latent_size=latent, seed=cfg.seed)
        version = cfg.codec
    return _announce(cfg, codec, version, shapes, info, encoder, echo)


def _announce(
    cfg: RunConfig,
    codec: Codec,
    version: str,
    shapes: Mapping[str, tuple[int, ...]],
    info: dict,
    encoder: tuple | None,
    echo: Callable[[str], None],
) -> tuple[ServerCodec, dict]:
    """Print and record the codec's payload sizes; the :class:`ServerCodec` of the run."""
    raw = 4 * sum(int(np.prod(s)) for s in shapes.values())
    coded = 4 * sum(int(np.prod(s)) for s in coded_shapes(codec, shapes).values())
    info.update(
        codec=cfg.codec,
        ae_version=version,
        latent_size=codec.latent_size,
        increment_bytes=raw,
        coded_bytes=coded,
        compression=raw / coded if coded else None,
        encode_at=cfg.encode_at,
    )
    if cfg.encode_at == "server":
        echo(
            f"codec {cfg.codec} ({version}): latent {codec.latent_size:,} numbers, encoded on the server "
            f"(central noise): each client sends its raw increment ({raw / 1e3:.1f} kB) and receives no encoder"
        )
    else:
        ratio = f"{raw / coded:.1f}x fewer" if coded else "nothing sent"
        echo(
            f"codec {cfg.codec} ({version}): latent {codec.latent_size:,} numbers; {coded / 1e3:.1f} kB per "
            f"client per round (latent + dense entries) instead of {raw / 1e3:.1f} kB ({ratio})"
        )
    return ServerCodec(codec, version, cfg.seed, encoder, cfg.encode_at), info


def _public_codec(cfg: RunConfig, layout: Layout, state: AdapterState, run: RunHandles) -> tuple[Codec, dict]:
    """The ``pca`` codec fitted on public increments from ``state`` (reused from ``run.run_dir`` on resume)."""
    evaluator, echo = run.evaluator, run.echo
    path = run.run_dir / PCA_FILE
    if path.exists():
        codec, _ = load_basis(path, layout)
        echo(f"codec pca {codec.version}: reused from {path}")
        return codec, {"prior": f"public (reused from {path})"}
    if evaluator is None:
        raise FedloraError("codec pca needs the server's public data (an evaluator)")
    t0 = time.monotonic()
    codec = fit_public_basis(evaluator, cfg, state, layout, path, 1)
    prior = public_prior_text(cfg)
    echo(
        f"codec pca {codec.version}: k = {codec.latent_size} fitted in {time.monotonic() - t0:.0f} s ({prior})"
    )
    return codec, {"prior": prior, "stats": "none (the prior is public)"}


def refresh_public_codec(
    coder: ServerCodec, fitted: int | None, cfg: RunConfig, rnd: int, state: AdapterState, run: RunHandles
) -> tuple[ServerCodec, int]:
    """``(coder, fitted)`` unchanged, or the public-prior codec (``pca``, or ``ae`` on the public prior)
    refitted from ``state`` when round ``rnd`` is due one (every ``prior-refresh`` rounds from round 1,
    as the public subspace). ``fitted``: the round the current codec was fitted for (None: read it from
    the run directory, ``run.run_dir``)."""
    run_dir, evaluator, echo = run.run_dir, run.evaluator, run.echo
    layout = coder.codec.layout
    path = run_dir / PCA_FILE
    if fitted is None:
        public_basis = cfg.codec_spec.fitted_on_public
        fitted = load_basis(path, layout)[1] if public_basis else latest_public_ae(run_dir)[0]
    due = refit_round(cfg, rnd)
    if fitted >= due:
        return coder, fitted
    if cfg.codec_spec.fitted_on_public:
        codec = fit_public_basis(evaluator, cfg, state, layout, path, rnd)
        version, payload = codec.version, pca_payload(codec)
    else:
        ae_config = AE_CONFIGS[cfg.ae_size]()
        trained, version, _ = fit_public_ae(cfg, ae_config, layout, state, rnd, run)
        codec, payload = make_codec(cfg.codec, trained=trained), encoder_payload(trained, version)
    echo(f"round {rnd}: codec {cfg.codec} refitted on {cfg.public_increments} public increments ({version})")
    return ServerCodec(codec, version, cfg.seed, payload, cfg.encode_at), rnd


def fit_public_ae(
    cfg: RunConfig, ae_config: AeConfig, layout: Layout, state: AdapterState, rnd: int, run: RunHandles
) -> tuple[TrainedAe, str, dict]:
    """The autoencoder trained on ``cfg.public_increments`` public increments from ``state`` (the
    ``public`` prior, on ``run.evaluator``'s public split), saved in ``run.run_dir`` as
    ``autoencoder-public-r<rnd>.safetensors``; ``(trained, version, record)``."""
    evaluator, echo = run.evaluator, run.echo
    if evaluator is None:
        raise FedloraError("--ae-prior public needs the server's public data (an evaluator)")
    device = resolve_device(cfg.device)  # before the public increments: a bad --device fails first
    t0 = time.monotonic()
    samples = public_increments(evaluator, cfg, state, cfg.public_increments, layout)
    t1 = time.monotonic()
    trained = train_autoencoder(
        ae_config, layout, [empirical_stats(layout, samples)], ae_train_config(cfg), device, samples
    )
    version = save_checkpoint(run.run_dir / PUBLIC_AE_FILE.format(round=rnd), trained)
    prior = public_prior_text(cfg)
    record = _training_record(cfg, trained, version, time.monotonic() - t0)
    echo(
        f"autoencoder {version}: {cfg.ae_size}, {cfg.public_increments} public increments in "
        f"{t1 - t0:.0f} s, {cfg.ae_steps} steps in {time.monotonic() - t1:.0f} s, loss "
        f"{record['final_loss']:.4g} ({prior})"
    )
    return trained, version, {"prior": prior, "stats": "none (the prior is public)", **record}


def public_prior_text(cfg: RunConfig) -> str:
    """What a public-prior codec was fitted on, as the summary and the log say it."""
    return (
        f"public: {cfg.public_increments} increments on the server's public split (--public-fraction "
        f"{cfg.public_fraction:g}, never given to a client); no privacy cost"
    )


def latest_public_ae(run_dir: Path) -> tuple[int, Path] | None:
    """``(round, path)`` of the run's last public-prior autoencoder, or None if it has none."""
    fits = []
    for path in run_dir.glob(PUBLIC_AE_FILE.format(round="*")):
        tail = path.name.removeprefix("autoencoder-public-r").removesuffix(".safetensors")
        if tail.isdigit():
            fits.append((int(tail), path))
    return max(fits) if fits else None


def _stats_round(
    grid: Grid,
    cfg: RunConfig,
    nodes: Sequence[int],
    state: AdapterState,
    factors: Mapping[str, tuple[int, ...]],
    run: RunHandles,
) -> tuple[list[Stats], dict]:
    """The ``query.gradstats`` round to ``nodes`` (its release noted or charged to ``run.ledger``
    first); the usable statistics and the phase's record."""
    ledger, run_id, echo = run.ledger, run.run_id, run.echo
    t0 = time.monotonic()
    noise_std = cfg.stats_noise_std
    for rnd, what in uncovered(cfg) if ledger else []:  # recorded before the query, like a charge
        ledger.note_uncovered(run_id, rnd, what)
    if ledger and noise_std > 0:  # committed before the query (and so any release) goes out
        if ledger.row(run_id, STATS_ROUND) is not None:
            raise FedloraError(
                "the statistics round was charged but its statistics were never saved (a crash); "
                "start a new run"
            )
        ledger.charge(
            Charge(
                run=run_id,
                round=STATS_ROUND,
                sigma=cfg.stats_noise_multiplier,
                p=1.0,
                count=1,
                sample_rate=1.0,
                sampled=len(nodes),
                clip=cfg.stats_clip,
                threat_model="local",
                mechanism=f"{cfg.mechanism}:statistics",
            )
        )
    messages = [
        Message(
            StatsQuery(state).to_record(), dst_node_id=n, message_type="query.gradstats", group_id="stats"
        )
        for n in nodes
    ]
    expected = {"granularity": cfg.stats_granularity, "noise-std": noise_std}
    stats_list, sizes, rejected = [], [], []
    for node, reply, _ in exchange(grid, messages, cfg.round_timeout):
        try:
            if reply.metadata.group_id != "stats":
                raise InvalidReply(f"reply to {reply.metadata.group_id!r}, not to the statistics query")
            moments, size = parse_stats_reply(reply, factors, expected)
            stats = unpack_stats(moments, sorted(factors))
        except InvalidReply as exc:
            rejected.append(str(exc))
            log.warning("statistics: rejected reply from node %s: %s", node, exc)
            continue
        stats_list.append(stats)
        sizes.append(size)
    if not stats_list:
        raise FedloraError(
            f"no usable statistics from {len(nodes)} nodes: {'; '.join(rejected) or 'no replies'}"
        )
    raw = 4 * sum(int(np.prod(s)) for s in factors.values())
    per_client = float(np.mean(sizes))
    privacy = (
        f"clipped to {cfg.stats_clip:g} + local noise sigma {cfg.stats_noise_multiplier:g} (charged as round 0)"
        if noise_std > 0
        else "in the clear (as in the paper; not covered by the client-level guarantee)"
    )
    echo(
        f"statistics: {len(stats_list)}/{len(nodes)} clients, {per_client:,.0f} B per client "
        f"({100 * per_client / raw:.3f} % of one round's raw factor increment, {raw / 1e6:.2f} MB), {privacy}"
    )
    info = {
        "replied": len(stats_list),
        "sampled": len(nodes),
        "rejected": rejected,
        "stats_bytes_per_client": per_client,
        "stats_fraction_of_increment": per_client / raw,
        "stats_granularity": cfg.stats_granularity,
        "stats_privacy": privacy,
        "seconds": round(time.monotonic() - t0, 3),
    }
    return stats_list, info


def _autoencoder(
    cfg: RunConfig, ae_config: AeConfig, layout: Layout, stats_list: Sequence[Stats], run: RunHandles
) -> tuple[TrainedAe, str]:
    """Load the run's autoencoder, or train and save it; ``(trained, version)``."""
    echo, path = run.echo, run.run_dir / AE_FILE
    if path.exists():
        trained, version = _load_ae(path, cfg, ae_config, layout)
        echo(f"autoencoder {version}: reused from {path}")
        return trained, version
    device = resolve_device(cfg.device)
    t0 = time.monotonic()
    trained = train_autoencoder(ae_config, layout, stats_list, ae_train_config(cfg), device)
    version = save_checkpoint(path, trained)
    record = _training_record(cfg, trained, version, time.monotonic() - t0)
    run.log({"round": STATS_ROUND, "phase": "autoencoder", **record})
    echo(
        f"autoencoder {version}: {cfg.ae_size}, {cfg.ae_steps} steps in {record['seconds']:.0f} s, "
        f"loss {record['final_loss']:.4g}"
    )
    return trained, version


def _load_ae(path: Path, cfg: RunConfig, ae_config: AeConfig, layout: Layout) -> tuple[TrainedAe, str]:
    """The run's saved autoencoder, checked against this run's model, size and latent mode."""
    trained, version = load_checkpoint(path, resolve_device(cfg.device))
    if trained.layout != layout or trained.config != ae_config:
        raise FedloraError(f"{path} was trained for another model or autoencoder size")
    if (trained.latent_norm > 0) != (cfg.ae_latent == "homogeneous"):
        raise FedloraError(f"{path} has another latent mode than --ae-latent {cfg.ae_latent}")
    return trained, version


def _training_record(cfg: RunConfig, trained: TrainedAe, version: str, seconds: float) -> dict:
    """What the run's log says of a trained autoencoder: its version, size, steps and loss ends."""
    first, final = loss_ends(trained)
    return {
        "ae_version": version,
        "ae_size": cfg.ae_size,
        "steps": cfg.ae_steps,
        "first_loss": first,
        "final_loss": float("nan") if final is None else final,
        "seconds": round(seconds, 3),
    }


def ae_train_config(cfg: RunConfig) -> TrainConfig:
    """The autoencoder's training options of ``cfg``."""
    return TrainConfig(steps=cfg.ae_steps, normalise=cfg.ae_normalise, seed=cfg.seed, latent=cfg.ae_latent)


def save_stats(path: Path, stats_list: Sequence[Stats]) -> None:
    """Statistics as ``<client>|<factor>|mean`` / ``|std`` tensors; atomic, never overwrites."""
    if path.exists():
        raise FedloraError(f"'{path}' exists; refusing to overwrite it")
    tensors = {
        f"{i}|{name}|{part}": t.contiguous()
        for i, stats in enumerate(stats_list)
        for name, pair in stats.items()
        for part, t in zip(("mean", "std"), pair, strict=True)
    }
    with replacing(path) as tmp:
        save_file(tensors, tmp)


def load_stats(path: Path, factors: Mapping[str, tuple[int, ...]]) -> list[dict[str, tuple[Tensor, Tensor]]]:
    """Inverse of :func:`save_stats`, checked against ``factors``."""
    tensors = load_file(path)
    count = 1 + max((int(k.split("|")[0]) for k in tensors), default=-1)
    try:
        out = [
            {n: (tensors[f"{i}|{n}|mean"], tensors[f"{i}|{n}|std"]) for n in factors} for i in range(count)
        ]
    except KeyError as exc:
        raise FedloraError(f"{path} does not match the model's factors: missing {exc}") from None
    if not out:
        raise FedloraError(f"{path} holds no statistics")
    return out


__all__ = ["AE_CONFIGS", "ServerCodec", "ae_latent_size", "prepare_codec"]
