"""Run configuration: one dataclass and the flat key/value form Flower uses (named presets:
:mod:`common.presets`).

Flower's ``run_config`` is flat (``num-clients = 4``); :func:`common.presets.from_flat` / :func:`to_flat` map it to
:class:`RunConfig` (dashes <-> underscores). Every value is validated once, in :meth:`RunConfig.check`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

from common.codec_specs import CODEC_SPECS, CodecSpec, find_codec
from common.errors import FedloraError
from common.lazy import load_component
from common.local_optimizers import LOCAL_OPTIMIZERS, LocalOptimizerSpec, find_local_optimizer
from common.privacy.participation.threat import THREATS
from common.privacy.registry import RELEASE_KINDS, carried_kind
from common.sparta import kept_rows, selection_steps

#: mechanism preset -> (local optimizer, client-level release)
MECHANISMS: dict[str, tuple[str, str]] = {
    "fedavg": ("none", "none"),
    "dp-fedavg": ("none", "gaussian"),
    # each built-in DP local optimizer, without a release (common/local_optimizers.py)
    **{name: (name, "none") for name, spec in LOCAL_OPTIMIZERS.items() if spec.private},
    "dr-encoder": ("none", "dr-encoder"),
    "dp-ftrl": ("none", "dp-ftrl"),
}
#: the participation rules correlated noise rests on (common/privacy/planning/ftrl_plan.py RULES)
PARTICIPATIONS = ("min-sep", "cyclic-poisson")
#: how a simulation trains a round's clients (client/cohort.py)
ENGINES = ("auto", "sequential", "batched")
#: what a simulated node whose hidden-participation coin did not come up does (client/app.py)
IDLE_TRAINING = ("train", "skip")
#: the frozen base model's precision (common/models/precision.py)
PRECISIONS = ("auto", "fp32", "bf16")
#: DR-Encoder options (autoencoder/ holds the implementations; tests check these lists agree)
CODECS = tuple(CODEC_SPECS)  # common/codec_specs.py
AE_SIZES = ("tiny", "tiny-64", "paper", "paper-best")
AE_NORMALISATIONS = ("none", "image", "factor")
AE_LATENTS = ("raw", "homogeneous")
AE_PRIORS = ("gaussian", "public")
STATS_GRANULARITIES = ("matrix", "column")  # per-row or per-entry statistics exceed the 1 % payload bound
DECODE_ORDERS = ("aggregate-first", "decode-first")
ENCODE_SITES = ("client", "server")
INCREMENT_FORMS = ("raw", "horizontal")  # client/increment.py implements them
LORA_INITS = ("balanced", "peft")  # common/models/lora_init.py
PRISM_FLOORS = ("clamp", "ridge")
THREAT_MODELS = THREATS  # the live registry: a registered threat model (register_threat) is a choice too
PARTITIONS = ("dirichlet", "iid", "natural")
SERVER_OPTIMIZERS = ("sgd", "momentum", "adam", "yogi")  # server/optimizers.py
CLIENT_OPTIMIZERS = ("adamw", "sgd")  # client/local_update.py
HEAD_INITS = ("random", "zero-shot")  # common/models/head_init.py
POOLINGS = ("cls", "mean")  # common/models/pooling.py
#: how a data owner's instruction data is recognised (common/data/instructions.py CHOICES)
INSTRUCTION_FORMATS = ("auto", "chat", "alpaca", "prompt-completion", "none")


# Validity rules an option may declare: (test, what a valid value is).
POSITIVE = (lambda v: v > 0 and math.isfinite(v), "> 0")
AT_LEAST_ONE = (lambda v: v >= 1, ">= 1")
NON_NEGATIVE = (lambda v: v >= 0 and math.isfinite(v), ">= 0 (and finite)")
PROBABILITY = (lambda v: 0 < v < 1, "in (0, 1)")
RATE = (lambda v: 0 < v <= 1, "in (0, 1]")
FRACTION = (lambda v: 0 <= v < 1, "in [0, 1)")


def option(
    default: object,
    help: str,
    group: str,
    *,
    choices: tuple[str, ...] = (),
    rule: tuple | None = None,
) -> object:
    """A :class:`RunConfig` field declared once: its default, its ``--help`` text, its group in the
    help, and its check (``choices``, or a ``rule`` from above). ``""`` in a choice option means
    "derived from another option" and is always allowed."""
    return field(default=default, metadata={"help": help, "group": group, "choices": choices, "rule": rule})


MODEL, FEDERATION, SERVER_OPT, LOCAL, SAMPLE_DP, CLIENT_DP, PUBLIC, DR_ENCODER, RUN = (
    "model and data",
    "federation",
    "server optimizer",
    "local training",
    "sample-level DP (local optimizer)",
    "client-level DP (release)",
    "public prior (server-side public data, no privacy cost)",
    "DR-Encoder release",
    "run",
)


def _lora_init_help() -> str:
    """``--lora-init``'s help, naming each local optimizer's own init from its descriptor."""
    own: dict[str, list[str]] = {}
    for spec in LOCAL_OPTIMIZERS.values():
        own.setdefault(spec.lora_init, []).append(spec.name)
    defaults = "; ".join(f"{init} for {', '.join(names)}" for init, names in own.items())
    return f"LoRA init: balanced (full-rank factors) or peft (PEFT's: B = 0); default the local optimizer's own: {defaults}"


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a federation, each option declared once. Units: ``lr`` per local
    step, ``sample_rate`` per round."""

    # -- model and data
    model: str = option(
        "smollm2-135m", "smollm2-135m, minilm-l6, a Hugging Face id or a local model directory", MODEL
    )
    dataset: str = option(
        "rotten-tomatoes",
        "rotten-tomatoes, bbc-news, news-articles (LM), boolq, shakespeare (LM), or your own "
        "file.csv / .jsonl / .parquet (see --text-column, --label-column, --instruction-format), or a "
        "directory with train.<ext> and test.<ext> files",
        MODEL,
    )
    text_column: str = option("text", "your own --dataset file's text column", MODEL)
    label_column: str = option(
        "label",
        "your own --dataset file's label column (classes read from the data); a column you name must "
        "exist, while a file without the default 'label' column is language modelling",
        MODEL,
    )
    instruction_format: str = option(
        "auto",
        "your own --dataset file as instruction data (conversations, trained on the responses): "
        "chat (a 'messages' column of {role, content} lists), alpaca (instruction, optional input "
        "and system, output), prompt-completion (prompt, completion), auto (by the file's columns, "
        "else as before) or none (a classification or language-modelling file)",
        MODEL,
        choices=INSTRUCTION_FORMATS,
    )
    prompt_column: str = option(
        "",
        "your own --dataset file's prompt column (default 'prompt'): implies "
        "--instruction-format prompt-completion",
        MODEL,
    )
    response_column: str = option(
        "",
        "your own --dataset file's response column (default 'completion'): implies "
        "--instruction-format prompt-completion",
        MODEL,
    )
    labels: str = option(
        "",
        "your own --dataset file's declared label set, comma-separated: a row with another label is "
        "refused (or skipped with --skip-bad-rows); the classes are still the values read, sorted",
        MODEL,
    )
    skip_bad_rows: bool = option(
        False,
        "your own --dataset file: skip (and count) bad rows (a CSV row with the wrong number of fields "
        "or broken quoting, no label, a label outside --labels) instead of refusing the file",
        MODEL,
    )
    partition_by: str = option(
        "",
        "your own --dataset file's user column, or a packaged dataset's unit (shakespeare: play): "
        "--partition natural makes one client per user (per unit)",
        MODEL,
    )
    users_per_client: int = option(
        1,
        "--partition natural: whole users (units) each client holds, a seeded choice of num-clients x "
        "this many (a silo of several plays)",
        MODEL,
        rule=AT_LEAST_ONE,
    )
    rank: int = option(8, "LoRA rank r", MODEL, rule=AT_LEAST_ONE)
    lora_alpha: float = option(16.0, "LoRA alpha (scaling alpha / r)", MODEL, rule=POSITIVE)
    lora_dropout: float = option(0.0, "LoRA dropout", MODEL, rule=FRACTION)
    targets: str = option("", "comma-separated LoRA target modules (default: the model's)", MODEL)
    lora_init: str = option(
        "",
        _lora_init_help(),
        MODEL,
        choices=LORA_INITS,
    )
    pooling: str = option(
        "cls",
        "what an encoder classifier's head reads: cls (BERT's [CLS] pooler) or mean (the mean token "
        "state, what sentence-transformers encoders such as minilm-l6 were trained for)",
        MODEL,
        choices=POOLINGS,
    )
    head_init: str = option(
        "random",
        "classification head of an encoder: random (the model's init) or zero-shot (prototypes of the "
        "label descriptions from the frozen encoder: public text, no privacy cost)",
        MODEL,
        choices=HEAD_INITS,
    )
    partition: str = option(
        "dirichlet",
        "dirichlet (label skew), iid, or natural (one client per text: a user's data, e.g. a shakespeare role)",
        MODEL,
        choices=PARTITIONS,
    )
    dirichlet_alpha: float = option(
        1.0, "Dirichlet concentration: small = strong label skew", MODEL, rule=POSITIVE
    )
    max_train_examples: int = option(
        2000, "cap on the training pool before partitioning (0 = all)", MODEL, rule=NON_NEGATIVE
    )
    eval_examples: int = option(300, "held-out examples for evaluation", MODEL, rule=AT_LEAST_ONE)
    eval_every: int = option(
        1,
        "evaluate on the held-out set every this many rounds (and after the last)",
        MODEL,
        rule=AT_LEAST_ONE,
    )
    test_fraction: float = option(
        0.2,
        "fraction of the corpus held out for evaluation (not with a --dataset directory: its test "
        "file is the test set)",
        MODEL,
        rule=PROBABILITY,
    )
    public_fraction: float = option(
        0.0,
        "fraction of the training pool split off as the server's public data before partitioning "
        "(never given to a client; 0 = none)",
        MODEL,
        rule=(lambda v: v == 0 or 0 < v <= 0.5, "0 or in (0, 0.5]"),
    )
    max_length: int = option(64, "maximum tokens per example", MODEL, rule=AT_LEAST_ONE)
    lm_blocks: int = option(
        4,
        "language-modelling datasets: examples (blocks of --max-length tokens) taken from each text, "
        "training and evaluation alike (0: every block)",
        MODEL,
        rule=NON_NEGATIVE,
    )
    # -- federation
    mechanism: str = option(
        "fedavg",
        "local optimizer / release preset: fedavg (no DP), dp-fedavg (client-level Gaussian), "
        "dr-encoder (client-level Gaussian on an autoencoder latent), dp-ftrl (client-level, banded "
        "correlated noise by the server), prism, dp-adamw, ffa, sparta (sample-level DP)",
        FEDERATION,
        choices=tuple(MECHANISMS),
    )
    num_clients: int = option(4, "number of nodes (data partitions)", FEDERATION, rule=AT_LEAST_ONE)
    rounds: int = option(3, "federated rounds", FEDERATION, rule=AT_LEAST_ONE)
    sample_rate: float = option(
        1.0, "Poisson client sampling rate p, each node independently", FEDERATION, rule=RATE
    )
    server_optimizer: str = option(
        "sgd",
        "server optimizer on the (noised) mean increment, post-processing: sgd (FedAvg), momentum "
        "(FedAvgM), adam or yogi (FedAdam / FedYogi, Reddi et al. 2021)",
        SERVER_OPT,
        choices=SERVER_OPTIMIZERS,
    )
    server_lr: float = option(1.0, "server learning rate eta", SERVER_OPT, rule=POSITIVE)
    server_momentum: float = option(
        0.9,
        "server momentum (momentum) or first-moment decay beta1 (adam, yogi)",
        SERVER_OPT,
        rule=FRACTION,
    )
    server_beta2: float = option(0.99, "second-moment decay beta2 (adam, yogi)", SERVER_OPT, rule=FRACTION)
    server_tau: float = option(1e-3, "adaptivity tau (adam, yogi)", SERVER_OPT, rule=POSITIVE)
    min_nodes: int = option(
        0, "nodes to wait for before round 1 (0 = num-clients)", FEDERATION, rule=NON_NEGATIVE
    )
    min_replies: int = option(
        1,
        "usable replies a round needs to be applied (fewer: withheld, its privacy charge stands); "
        "distributed noise shares are sized for it",
        FEDERATION,
        rule=AT_LEAST_ONE,
    )
    round_timeout: float = option(
        600.0, "seconds to wait for replies (and for nodes to connect)", FEDERATION, rule=POSITIVE
    )
    increment_form: str = option(
        "raw",
        "what a client sends: raw (A' - A, B' - B) or horizontal (PRISM's gauge-fixed lift of the same "
        "first-order change of A B^T; the statistics round uses the same form)",
        FEDERATION,
        choices=INCREMENT_FORMS,
    )
    # -- local training
    local_steps: int = option(8, "optimizer steps per client per round", LOCAL, rule=AT_LEAST_ONE)
    batch_size: int = option(
        8, "examples per local step (expected Poisson batch under DP)", LOCAL, rule=AT_LEAST_ONE
    )
    lr: float = option(5e-4, "client learning rate", LOCAL, rule=POSITIVE)
    client_optimizer: str = option(
        "adamw",
        "local update rule, non-private or of dp-adamw / ffa's noisy gradients (and the head's): adamw "
        "(fresh state each round) or sgd (the increment is a sum of gradient steps: the FedAvg / FedOpt "
        "recipe, a server optimizer adapts it); prism and sparta have their own",
        LOCAL,
        choices=CLIENT_OPTIMIZERS,
    )
    seed: int = option(0, "seed for splits, init and local batches (never for DP noise or sampling)", LOCAL)
    device: str = option("auto", "auto, cpu or cuda", LOCAL)
    workers: int = option(
        0,
        "client worker processes of fedlora simulate, each with its own model: 0 = one per available "
        "core, 1 = in the server's process (a simulation setting: results do not depend on it)",
        LOCAL,
        rule=NON_NEGATIVE,
    )
    engine: str = option(
        "auto",
        "how fedlora simulate trains a round's clients: sequential (one after another), batched (a "
        "cohort in one forward/backward, client/cohort.py; clients with a sample-level DP optimizer "
        "still run one by one) or auto (batched on CUDA, sequential on the CPU: docs/cohort-engine.md); "
        "a simulation setting",
        LOCAL,
        choices=ENGINES,
    )
    idle_training: str = option(
        "train",
        "hidden participation in fedlora simulate: whether a node whose coin did not come up still "
        "trains (train: constant work, as every deployed node does, so that a reply's timing does not "
        "show the coin) or skips its local steps (skip: its reply is the same zero update, so the "
        "released sum is unchanged, and a simulation of 1,000 nodes trains ~p of them; a simulation "
        "setting, never read from a deployed run's config)",
        LOCAL,
        choices=IDLE_TRAINING,
    )
    cohort_tokens: int = option(
        0,
        "padded tokens in one forward of the batched engine: what bounds its memory (a language model's "
        "logits above all); 0 = 16384 on CUDA, on the CPU 2048 and at most 2^25 logits (larger tensors "
        "there are paged in afresh on every allocation)",
        LOCAL,
        rule=NON_NEGATIVE,
    )
    precision: str = option(
        "auto",
        "the frozen base model's precision: auto (bf16 where the device multiplies bf16 natively, else "
        "fp32), fp32 or bf16; LoRA factors, head, increments, clipping, noise and accounting stay fp32",
        LOCAL,
        choices=PRECISIONS,
    )
    # -- sample-level DP
    local_optimizer: str = option(
        "",
        "sample-level local optimizer: none, prism, dp-adamw, ffa or sparta (default: the mechanism's)",
        SAMPLE_DP,
        choices=LOCAL_OPTIMIZERS,
    )
    sample_epsilon: float = option(
        0.0,
        "sample-level epsilon per client over all its planned local steps (PLD-calibrated)",
        SAMPLE_DP,
        rule=NON_NEGATIVE,
    )
    sample_noise_multiplier: float = option(
        0.0, "sample-level noise multiplier (instead of --sample-epsilon)", SAMPLE_DP, rule=NON_NEGATIVE
    )
    sample_clip: float = option(
        1.0, "per-example clip C of the DP local optimizers", SAMPLE_DP, rule=POSITIVE
    )
    microbatch: int = option(
        0,
        "examples per forward/backward within one local step (memory; 0 = 16 for DP steps, or the "
        "batch if smaller, raised on CUDA to what free memory holds; and 32 for non-private ones)",
        SAMPLE_DP,
        rule=NON_NEGATIVE,
    )
    prism_floor: str = option(
        "clamp",
        "PRISM preconditioner floor: clamp (official code) or ridge (paper Eq. 25)",
        SAMPLE_DP,
        choices=PRISM_FLOORS,
    )
    sparta_keep: float = option(
        0.2,
        "SPARTA: rows kept trainable per LoRA factor of each module, a fraction (< 1) or a count (>= 1)",
        SAMPLE_DP,
        rule=POSITIVE,
    )
    sparta_selection: float = option(
        0.1,
        "SPARTA: fraction of each client's local steps spent selecting rows (no update; same noise plan)",
        SAMPLE_DP,
        rule=(lambda v: 0 < v < 1, "in (0, 1)"),
    )
    delta: float = option(
        1e-5, "delta of the client-level and the sample-level guarantees", SAMPLE_DP, rule=PROBABILITY
    )
    # -- client-level DP
    release: str = option(
        "",
        "client-level release: none, gaussian, skellam (secure aggregation's integers, which gaussian "
        "becomes there), dr-encoder or dp-ftrl (default: the mechanism's)",
        CLIENT_DP,
        choices=RELEASE_KINDS,  # common/privacy/registry.py (``register_release`` adds one)
    )
    clip: float = option(
        1.0, "client-level clip C on the L2 norm of a client's increment", CLIENT_DP, rule=POSITIVE
    )
    noise_multiplier: float = option(
        0.0,
        "client-level noise multiplier sigma (0 + target epsilon = calibrate)",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    threat_model: str = option(
        "local",
        "who adds the client-level noise: local, distributed, secure-aggregation (distributed "
        "discrete noise summed by SecAgg+: the server sees only the sum), secure-aggregation-hidden "
        "(also hides who contributed: every client takes part each round, contributing by its own "
        "coin at the sample rate) or central",
        CLIENT_DP,
        choices=THREAT_MODELS,
    )
    target_epsilon: float = option(
        0.0,
        "client-level budget; rounds that would exceed it are not run (0 = none)",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    participation: str = option(
        "min-sep",
        "dp-ftrl: the participation rule its epsilon rests on: min-sep (no client in two rounds less than "
        "--bands apart, enforced by the server and by every node; no amplification claimed) or "
        "cyclic-poisson (each client in a fixed group, eligible every --bands-th round, sampled at "
        "bands x sample rate)",
        CLIENT_DP,
        choices=PARTICIPATIONS,
    )
    bands: int = option(
        0,
        "dp-ftrl: bands of the Toeplitz strategy, and the rounds between one client's participations "
        "(0 = 1 / sample rate)",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    min_separation: int = option(
        0,
        "dp-ftrl under min-sep: rounds between one client's participations, at least --bands (0 = the "
        "bands; --bands 1 --min-separation b is DP-FedAvg held to the same rule)",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    max_participations: int = option(
        0,
        "secure aggregation: the most rounds a client takes part in, each charged at p = 1 (the server "
        "sees who takes part); a client at the cap is not sampled again (0 = the run's mean, "
        "ceil(rounds x cohort / clients))",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    max_cohort: int = option(
        0,
        "secure aggregation: the cohort, drawn at random each round from the clients under the cap "
        "(fewer only when fewer are left); it fixes the bits per coordinate (0 = sample rate x clients)",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    secagg_neighbours: int = option(
        10, "secure aggregation: SecAgg+ neighbours k of each client", CLIENT_DP, rule=AT_LEAST_ONE
    )
    secagg_threshold: int = option(
        0,
        "secure aggregation: shares t that reconstruct a client's mask secrets, k/2 < t <= k "
        "(0 = floor(k/2) + 1); --min-replies must be at least t",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    secagg_bits: int = option(
        0,
        "secure aggregation: bits b per coordinate of the modular sum (0 = the fewest that hold the "
        "largest cohort's sum and noise)",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    adaptive_clip: bool = option(
        False,
        "adaptive clipping (Andrew et al. 2021): C moves toward the target quantile of the update norms "
        "from a noised count of unclipped clients; --clip is the initial C",
        CLIENT_DP,
    )
    target_quantile: float = option(
        0.5, "adaptive clipping: fraction of clients left unclipped", CLIENT_DP, rule=PROBABILITY
    )
    clip_lr: float = option(0.2, "adaptive clipping: geometric learning rate of C", CLIENT_DP, rule=POSITIVE)
    clip_count_std: float = option(
        0.0,
        "adaptive clipping: noise std of the unclipped count (0 = expected clients per round / 20)",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    clip_only: bool = option(
        False,
        "diagnostic, NOT PRIVATE: clip every increment as the release would, add no noise (sigma 0)",
        CLIENT_DP,
    )
    noise_cohort: int = option(
        0,
        "what-if: add the noise a cohort of this many clients per round would need (sigma calibrated for "
        "it, scaled to this simulation's cohort); the epsilon is valid for that cohort, not this run",
        CLIENT_DP,
        rule=NON_NEGATIVE,
    )
    # -- public prior (server/public_prior.py)
    public_subspace: int = option(
        0,
        "project each round's released mean factor increment onto this many directions fitted on "
        "public increments (post-processing; needs --public-fraction; 0 = off); with --codec pca, "
        "the codec's latent size",
        PUBLIC,
        rule=NON_NEGATIVE,
    )
    public_increments: int = option(
        256, "increments the server computes on its public data per fit", PUBLIC, rule=AT_LEAST_ONE
    )
    prior_refresh: int = option(
        10, "refit the public subspace every this many rounds", PUBLIC, rule=AT_LEAST_ONE
    )
    # -- DR-Encoder
    codec: str = option(
        "ae",
        "dr-encoder codec: ae (trained Uformer), identity, constant-mean, random-projection, or pca "
        "(--public-subspace K directions fitted on the server's public increments: a public prior)",
        DR_ENCODER,
        choices=CODECS,
    )
    ae_size: str = option(
        "tiny",
        "autoencoder configuration: tiny (CPU, latent 1/16 of the padded entries), tiny-64 (CPU, 1/64), "
        "paper (1/64) or paper-best (GPU)",
        DR_ENCODER,
        choices=AE_SIZES,
    )
    ae_steps: int = option(
        300, "autoencoder training steps (on its prior: --ae-prior)", DR_ENCODER, rule=NON_NEGATIVE
    )
    ae_normalise: str = option(
        "image",
        "autoencoder input scaling from the statistics: none, image or factor",
        DR_ENCODER,
        choices=AE_NORMALISATIONS,
    )
    ae_latent: str = option(
        "raw",
        "autoencoder latent: raw (the encoder's output, the paper) or homogeneous (rescaled to the "
        "increment's norm and decoded so that a clip or an average scales the decoded increment)",
        DR_ENCODER,
        choices=AE_LATENTS,
    )
    ae_prior: str = option(
        "gaussian",
        "what the autoencoder trains on: gaussian (the paper: synthetic gradients from the clients' "
        "statistics) or public (--public-increments real increments the server computes on its public "
        "data, refitted every --prior-refresh rounds; no statistics round, no privacy cost)",
        DR_ENCODER,
        choices=AE_PRIORS,
    )
    stats_granularity: str = option(
        "matrix",
        "statistics sent per factor: matrix (2 numbers, the paper's) or column (2 per rank)",
        DR_ENCODER,
        choices=STATS_GRANULARITIES,
    )
    stats_floor: float = option(
        1e-5,
        "Algorithm 1's h1, the floor of each entry's squared deviation (1e-5, the paper's; lower it when "
        "increments are smaller than sqrt(h1))",
        DR_ENCODER,
        rule=(lambda v: 0 < v <= 1e-3, "in (0, 1e-3] (h2 = 1e-3 caps it)"),
    )
    stats_noise_multiplier: float = option(
        0.0,
        "noise on the clipped statistics (0 = sent in the clear, as in the paper)",
        DR_ENCODER,
        rule=NON_NEGATIVE,
    )
    stats_clip: float = option(
        1.0, "L2 bound on a client's statistics vector when they are noised", DR_ENCODER, rule=POSITIVE
    )
    decode_order: str = option(
        "aggregate-first",
        "aggregate-first (average latents, decode once; secure aggregation allows it) or decode-first "
        "(decode each client's latent; local noise only)",
        DR_ENCODER,
        choices=DECODE_ORDERS,
    )
    encode_at: str = option(
        "client",
        "where dr-encoder encodes: client (the paper: the encoder or basis is sent to every node, replies "
        "are latents) or server (--threat-model central only: replies are raw increments, the trusted "
        "server encodes, clips and noises them; nothing is broadcast)",
        DR_ENCODER,
        choices=ENCODE_SITES,
    )
    # -- run
    out_dir: str = option("", "run directory (default runs/<time>-<model>-<dataset>)", RUN)
    resume: bool = option(False, "continue the run in --out from its checkpoint and ledger", RUN)
    eval_cache: str = option(
        "",
        "a directory of held-out evaluations by content (adapter state, held-out examples, model, task): "
        "an evaluation already there is read, not recomputed (round 0 of every arm of a seed is the same); "
        "empty: none",
        RUN,
    )
    tensorboard: bool = option(
        False,
        "also log each round's metrics, loss and epsilon as TensorBoard event files in <out>/tensorboard "
        "(tensorboard --logdir runs; needs the tensorboard package: pip install 'fedlora-dp[tensorboard]')",
        RUN,
    )

    @property
    def release_kind(self) -> str:
        """The registered release kind the run runs: ``--release`` or the mechanism's, in the form its
        transport carries (the Gaussian release through secure aggregation is the Skellam one)."""
        return carried_kind(
            self.release or MECHANISMS[self.mechanism][1], THREATS[self.threat_model].transport.integers_only
        )

    @property
    def public_prior(self) -> bool:
        """Whether the dr-encoder codec is fitted on the server's public increments (pca, or ae on the
        public prior) rather than on the clients' statistics."""
        spec = self.codec_spec
        return spec.fitted_on_public or (spec.trains_autoencoder and self.ae_prior == "public")

    @property
    def codec_spec(self) -> CodecSpec:
        """What the rules and the server ask about ``codec`` (common/codec_specs.py)."""
        return find_codec(self.codec)

    @property
    def optimizer_kind(self) -> str:
        return self.local_optimizer or MECHANISMS[self.mechanism][0]

    @property
    def optimizer_spec(self) -> LocalOptimizerSpec:
        """What the rules and the client ask about :attr:`optimizer_kind` (common/local_optimizers.py)."""
        return find_local_optimizer(self.optimizer_kind)

    @property
    def private(self) -> bool:
        """Whether the run has any DP mechanism (sample-level local optimizer or client-level
        release); a private run sends no clear counts or metrics and averages uniformly."""
        return self.optimizer_kind != "none" or self.release_kind != "none"

    @property
    def stats_noise_std(self) -> float:
        """Noise std each client adds to its clipped DR-Encoder statistics (0: sent in the clear)."""
        return self.stats_noise_multiplier * self.stats_clip

    @property
    def microbatch_size(self) -> int:
        """Examples per forward/backward of a DP step (``--microbatch``, else at most 16)."""
        return self.microbatch or min(16, self.batch_size)

    @property
    def init_kind(self) -> str:
        return self.lora_init or self.optimizer_spec.lora_init

    @property
    def target_modules(self) -> list[str] | None:
        names = [t.strip() for t in self.targets.split(",") if t.strip()]
        return names or None

    def check_federated(self) -> RunConfig:
        """:meth:`check`, and refuse what cannot run in a federation (one line)."""
        self.check()
        if self.optimizer_spec.merges_base:
            raise FedloraError(
                f"{self.optimizer_kind} merges a dense update into the base weights at every step; "
                "federations exchange LoRA factors: run it with fedlora train-local"
            )
        return self

    def replace(self, **changes: object) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def check(self) -> RunConfig:
        """Validate every option by its declaration, then the rules between options; raise
        FedloraError on the first problem (one line)."""
        for f in fields(self):
            value, key, meta = getattr(self, f.name), f.name.replace("_", "-"), f.metadata
            if meta["choices"] and value and value not in meta["choices"]:
                raise FedloraError(f"unknown {key} '{value}'; choose {', '.join(meta['choices'])}")
            if meta["rule"] and not meta["rule"][0](value):
                raise FedloraError(f"{key} must be {meta['rule'][1]}, got {value}")
        self._check_relations()
        return self

    def _check_public_subspace(self) -> None:
        if self.public_fraction <= 0:
            raise FedloraError("--public-subspace needs public data: set --public-fraction in (0, 0.5]")
        if self.public_subspace > self.public_increments:
            raise FedloraError(
                f"--public-subspace {self.public_subspace} exceeds --public-increments "
                f"{self.public_increments} (the basis has at most one direction per public increment)"
            )

    def _check_relations(self) -> None:
        if self.partition_by and self.partition != "natural":
            raise FedloraError("--partition-by needs --partition natural (one client per user)")
        if self.users_per_client > 1 and self.partition != "natural":
            raise FedloraError("--users-per-client needs --partition natural (clients of whole users)")
        local = self.optimizer_spec
        if local.full_rank and self.init_kind == "peft":
            raise FedloraError(f"{local.label} needs full-rank LoRA factors: use --lora-init balanced")
        if local.merges_base and self.precision == "bf16":
            raise FedloraError(
                f"{self.optimizer_kind} merges a dense update into the base weights: it needs --precision "
                "fp32 (auto picks it)"
            )
        if local.merges_base and (self.init_kind != "peft" or self.lora_dropout > 0):
            raise FedloraError(
                f"{self.optimizer_kind} taps the gradient through B = 0 on the undropped input: "
                "use --lora-init peft, --lora-dropout 0"
            )
        if self.client_optimizer == "sgd" and not local.update_rule:
            raise FedloraError(
                f"--client-optimizer sgd is an update rule for non-private steps, dp-adamw and ffa; "
                f"{self.optimizer_kind} has its own: use --client-optimizer adamw"
            )
        dp_budgets = (self.sample_epsilon > 0) + (self.sample_noise_multiplier > 0)
        if self.optimizer_kind != "none" and dp_budgets != 1:
            raise FedloraError(
                f"local optimizer {self.optimizer_kind} needs exactly one of --sample-epsilon and "
                "--sample-noise-multiplier (> 0)"
            )
        if local.row_selection:
            if self.sparta_keep >= 1:
                kept_rows(
                    self.sparta_keep, int(self.sparta_keep)
                )  # whole; the model's rows are checked later
            selection_steps(self.sparta_selection, self.local_steps)
        if self.optimizer_kind != "none" and self.microbatch > self.batch_size:
            raise FedloraError(
                f"--microbatch {self.microbatch} exceeds the logical batch --batch-size {self.batch_size}"
            )
        if self.idle_training == "skip" and not THREATS[self.threat_model].hides_participation:
            raise FedloraError(
                f"--idle-training skip is for hidden participation; under --threat-model {self.threat_model} "
                "every sampled node contributes"
            )
        self._check_client_level()
        if self.public_subspace:
            self._check_public_subspace()
        if check := RELEASE_KINDS[self.release_kind].check:  # the release kind's own rules
            load_component(check)(self)

    @property
    def expected_cohort(self) -> float:
        """p·N, the expected number of clients per round."""
        return self.sample_rate * self.num_clients

    def _check_client_level(self) -> None:
        release = self.release_kind
        for flag, on in (
            ("--adaptive-clip", self.adaptive_clip),
            ("--clip-only", self.clip_only),
            ("--noise-cohort", self.noise_cohort > 0),
        ):
            if on and release == "none":
                raise FedloraError(
                    f"{flag} needs a client-level release (--mechanism dp-fedavg or dr-encoder)"
                )
        transport = THREATS[self.threat_model].transport
        if why := transport.refuses(release, self.adaptive_clip):
            raise FedloraError(f"--threat-model {self.threat_model}: {why}")
        if transport.check:  # the transport's own rules
            load_component(transport.check)(self)
        budget = self.noise_multiplier > 0 or self.target_epsilon > 0
        if self.clip_only and budget:
            raise FedloraError("--clip-only adds no noise: drop --noise-multiplier and --target-epsilon")
        if release != "none" and not (budget or self.clip_only):
            raise FedloraError(f"a {release} release needs --noise-multiplier or --target-epsilon")
        if self.adaptive_clip and release != "gaussian":
            raise FedloraError("--adaptive-clip supports the gaussian release (--mechanism dp-fedavg)")
        if self.adaptive_clip and THREATS[self.threat_model].each_reply_private:
            raise FedloraError(
                "--adaptive-clip needs --threat-model central or distributed (a noised count over the cohort)"
            )
        if self.noise_cohort and self.noise_cohort < self.expected_cohort:
            raise FedloraError(
                f"--noise-cohort {self.noise_cohort} is below the simulated cohort "
                f"(sample rate x clients = {self.expected_cohort:g})"
            )
        if self.noise_cohort and self.clip_only:
            raise FedloraError("--noise-cohort needs noise: it cannot be combined with --clip-only")


def plans_for_target(cfg: RunConfig, flag: str, adaptive_clip: bool) -> None:
    """``flag`` (a mechanism or threat model) plans its own noise for ``--target-epsilon``: the
    options that set the noise or the clip otherwise are refused (``--adaptive-clip`` too when
    ``adaptive_clip``), and a target is required."""
    for option_flag, on in (
        ("--adaptive-clip", adaptive_clip and cfg.adaptive_clip),
        ("--noise-cohort", cfg.noise_cohort > 0),
        ("--clip-only", cfg.clip_only),
        ("--noise-multiplier", cfg.noise_multiplier > 0),
    ):
        if on:
            raise FedloraError(f"{flag} plans its noise for --target-epsilon; drop {option_flag}")
    if cfg.target_epsilon <= 0:
        raise FedloraError(f"{flag} needs --target-epsilon")


def check_dr_encoder(cfg: RunConfig) -> None:
    """What a dr-encoder run must also hold (its release kind's check, common/privacy/registry.py)."""
    if cfg.optimizer_kind != "none":
        raise FedloraError(
            f"the dr-encoder release runs its statistics round with non-private local steps; "
            f"it cannot be combined with the sample-level optimizer {cfg.optimizer_kind}"
        )
    if cfg.ae_prior == "public" and not cfg.codec_spec.trains_autoencoder:
        raise FedloraError(f"--ae-prior public trains the ae codec; --codec {cfg.codec} has no autoencoder")
    if cfg.ae_prior == "public" and cfg.public_fraction <= 0:
        raise FedloraError("--ae-prior public needs public data: set --public-fraction in (0, 0.5]")
    if cfg.codec_spec.needs_public_subspace and not cfg.public_subspace:
        raise FedloraError(
            f"--codec {cfg.codec} needs --public-subspace K (its latent size) and --public-fraction "
            "(its public data)"
        )
    if cfg.encode_at == "server" and not THREATS[cfg.threat_model].clear_replies:
        raise FedloraError(
            "--encode-at server needs --threat-model central: only a trusted server may see a "
            "client's raw increment"
        )
    if cfg.decode_order == "decode-first" and not THREATS[cfg.threat_model].each_reply_private:
        raise FedloraError(
            "--decode-order decode-first needs --threat-model local: under distributed or central "
            "noise a single client's latent is not a private release"
        )


#: ``--help`` text of every option (from the declarations)

HELP: dict[str, str] = {f.name: f.metadata["help"] for f in fields(RunConfig)}


def to_flat(cfg: RunConfig) -> dict[str, object]:
    """Flower-style flat mapping with dashed keys."""
    return {f.name.replace("_", "-"): getattr(cfg, f.name) for f in fields(cfg)}


__all__ = [
    "PRECISIONS",
    "RunConfig",
    "check_dr_encoder",
    "field",
    "plans_for_target",
    "to_flat",
]
