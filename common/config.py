"""Run configuration: one dataclass, named presets, and the flat key/value form Flower uses.

Flower's ``run_config`` is flat (``num-clients = 4``); :func:`from_flat` / :func:`to_flat` map it to
:class:`RunConfig` (dashes <-> underscores). Every value is validated once, in :meth:`RunConfig.check`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields

from common.errors import FedloraError

#: mechanism preset -> (local optimizer, client-level release); DESIGN §3
MECHANISMS: dict[str, tuple[str, str]] = {
    "fedavg": ("none", "none"),
    "dp-fedavg": ("none", "gaussian"),
    "prism": ("prism", "none"),
    "dp-adamw": ("dp-adamw", "none"),
    "ffa": ("ffa", "none"),
    "dr-encoder": ("none", "dr-encoder"),
}
#: sample-level local optimizers (client/optimizers registers the DP ones under these names)
LOCAL_OPTIMIZERS = ("none", "prism", "dp-adamw", "ffa")
RELEASES = ("none", "gaussian", "dr-encoder")
#: DR-Encoder options (autoencoder/ holds the implementations; tests check these lists agree)
CODECS = ("ae", "identity", "constant-mean", "random-projection")
AE_SIZES = ("tiny", "paper", "paper-best")
AE_NORMALISATIONS = ("none", "image", "factor")
AE_LATENTS = ("raw", "homogeneous")
STATS_GRANULARITIES = ("matrix", "column")  # per-row or per-entry statistics exceed the 1 % payload bound
DECODE_ORDERS = ("aggregate-first", "decode-first")
INCREMENT_FORMS = ("raw", "horizontal")  # client/increment.py implements them
LORA_INITS = ("balanced", "peft")  # common/models/lora_init.py
PRISM_FLOORS = ("clamp", "ridge")
THREAT_MODELS = ("local", "distributed", "central")
PARTITIONS = ("dirichlet", "iid")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a federation. Units: ``lr`` per local step, ``sample_rate`` per round."""

    model: str = "smollm2-135m"
    dataset: str = "rotten-tomatoes"
    mechanism: str = "fedavg"
    local_optimizer: str = ""  # sample-level local optimizer; "" = the mechanism's
    release: str = ""  # client-level release; "" = the mechanism's
    clip: float = 1.0  # client-level clip C: L2 bound on a client's whole increment
    noise_multiplier: float = 0.0  # client-level σ; 0 with a target epsilon = calibrate for `rounds`
    threat_model: str = "local"
    target_epsilon: float = 0.0  # client-level budget (0 = none); stop before exceeding it
    delta: float = 1e-5  # of both the client-level and the sample-level guarantees
    sample_epsilon: float = 0.0  # sample-level budget per client over all its planned local steps
    sample_noise_multiplier: float = 0.0  # sample-level σ (0 = calibrate for sample_epsilon)
    sample_clip: float = 1.0  # per-example clip of the DP local optimizers
    microbatch: int = 16  # examples per forward/backward inside one DP step
    lora_init: str = ""  # balanced or peft; "" = balanced with a DP local optimizer, else peft
    prism_floor: str = "clamp"  # how PRISM's DP floor enters its preconditioner
    num_clients: int = 4
    rounds: int = 3
    sample_rate: float = 1.0
    local_steps: int = 8
    batch_size: int = 8
    lr: float = 5e-4
    server_lr: float = 1.0
    rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    targets: str = ""  # comma-separated module names; "" = the model's default targets
    partition: str = "dirichlet"
    dirichlet_alpha: float = 1.0
    max_train_examples: int = 2000  # cap on the training split (0 = all)
    eval_examples: int = 300
    test_fraction: float = 0.2
    max_length: int = 64
    seed: int = 0
    device: str = "auto"
    round_timeout: float = 600.0
    min_nodes: int = 0  # nodes to wait for before round 1 (0 = num_clients)
    min_replies: int = 1  # usable replies a round needs for its aggregate to be applied
    codec: str = "ae"  # what a dr-encoder release encodes with
    ae_size: str = "tiny"
    ae_steps: int = 300  # autoencoder training steps on synthetic gradients
    ae_normalise: str = "image"
    ae_latent: str = "raw"  # raw (the paper) or homogeneous (rescaled; decode(c z) = c decode(z))
    stats_granularity: str = "matrix"
    stats_floor: float = 1e-5  # Algorithm 1's h1 (the paper's): floor of each entry's squared deviation
    stats_noise_multiplier: float = 0.0  # 0 = statistics in the clear (the paper); > 0 = clipped + noised
    stats_clip: float = 1.0  # L2 bound on one client's statistics vector when they are noised
    decode_order: str = "aggregate-first"
    increment_form: str = "raw"  # what a client sends: raw factor change or its horizontal (gauge-fixed) lift
    out_dir: str = ""  # "" = runs/<time>-<model>-<dataset>
    resume: bool = False  # continue the run in out_dir from its checkpoint and ledger

    @property
    def release_kind(self) -> str:
        return self.release or MECHANISMS[self.mechanism][1]

    @property
    def optimizer_kind(self) -> str:
        return self.local_optimizer or MECHANISMS[self.mechanism][0]

    @property
    def private(self) -> bool:
        """Whether the run has any DP mechanism (sample-level local optimizer or client-level
        release); a private run sends no clear counts or metrics and averages uniformly."""
        return self.optimizer_kind != "none" or self.release_kind != "none"

    @property
    def init_kind(self) -> str:
        return self.lora_init or ("peft" if self.optimizer_kind == "none" else "balanced")

    @property
    def target_modules(self) -> list[str] | None:
        names = [t.strip() for t in self.targets.split(",") if t.strip()]
        return names or None

    def replace(self, **changes: object) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def check(self) -> RunConfig:
        """Validate values that do not need the model or data; raise FedloraError on the first problem."""
        if not 0.0 < self.sample_rate <= 1.0:
            raise FedloraError(f"sample rate p must be in (0, 1], got {self.sample_rate}")
        if self.rank < 1:
            raise FedloraError(f"LoRA rank must be >= 1, got {self.rank}")
        positive_ints = ("num_clients", "rounds", "local_steps", "batch_size", "max_length")
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise FedloraError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.eval_examples < 1:
            raise FedloraError(f"eval-examples must be >= 1, got {self.eval_examples}")
        if self.lr <= 0 or self.server_lr <= 0:
            raise FedloraError("learning rates must be > 0")
        if self.lora_alpha <= 0:
            raise FedloraError(f"lora-alpha must be > 0, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise FedloraError(f"lora-dropout must be in [0, 1), got {self.lora_dropout}")
        if self.partition not in PARTITIONS:
            raise FedloraError(f"unknown partition '{self.partition}'; choose {', '.join(PARTITIONS)}")
        if self.dirichlet_alpha <= 0:
            raise FedloraError(f"dirichlet-alpha must be > 0, got {self.dirichlet_alpha}")
        if not 0.0 < self.test_fraction < 1.0:
            raise FedloraError(f"test-fraction must be in (0, 1), got {self.test_fraction}")
        if self.mechanism not in MECHANISMS:
            raise FedloraError(f"unknown mechanism '{self.mechanism}'; available: {', '.join(MECHANISMS)}")
        for key, value, allowed in (
            ("local-optimizer", self.local_optimizer, LOCAL_OPTIMIZERS),
            ("lora-init", self.lora_init, LORA_INITS),
            ("prism-floor", self.prism_floor, PRISM_FLOORS),
            ("codec", self.codec, CODECS),
            ("ae-size", self.ae_size, AE_SIZES),
            ("ae-normalise", self.ae_normalise, AE_NORMALISATIONS),
            ("ae-latent", self.ae_latent, AE_LATENTS),
            ("stats-granularity", self.stats_granularity, STATS_GRANULARITIES),
            ("decode-order", self.decode_order, DECODE_ORDERS),
            ("increment-form", self.increment_form, INCREMENT_FORMS),
        ):
            if value and value not in allowed:
                raise FedloraError(f"unknown {key} '{value}'; choose {', '.join(allowed)}")
        if self.optimizer_kind == "prism" and self.init_kind == "peft":
            raise FedloraError("PRISM needs full-rank LoRA factors: use --lora-init balanced")
        dp_budgets = (self.sample_epsilon > 0) + (self.sample_noise_multiplier > 0)
        if self.optimizer_kind != "none" and dp_budgets != 1:
            raise FedloraError(
                f"local optimizer {self.optimizer_kind} needs exactly one of --sample-epsilon and "
                "--sample-noise-multiplier (> 0)"
            )
        if min(self.sample_epsilon, self.sample_noise_multiplier) < 0 or not self.sample_clip > 0:
            raise FedloraError("sample-epsilon and sample-noise-multiplier must be >= 0, sample-clip > 0")
        if self.microbatch < 1:
            raise FedloraError(f"microbatch must be >= 1, got {self.microbatch}")
        if self.release and self.release not in RELEASES:
            raise FedloraError(f"unknown release '{self.release}'; choose {', '.join(RELEASES)}")
        if self.threat_model not in THREAT_MODELS:
            raise FedloraError(
                f"unknown threat model '{self.threat_model}'; choose {', '.join(THREAT_MODELS)}"
            )
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise FedloraError(f"clip must be > 0, got {self.clip}")
        if not (self.noise_multiplier >= 0 and math.isfinite(self.noise_multiplier)):
            raise FedloraError(f"noise multiplier must be finite and >= 0, got {self.noise_multiplier}")
        if not (self.target_epsilon >= 0 and math.isfinite(self.target_epsilon)):
            raise FedloraError(f"target epsilon must be >= 0 (0 = no budget), got {self.target_epsilon}")
        if not 0 < self.delta < 1:
            raise FedloraError(f"delta must be in (0, 1), got {self.delta}")
        if self.release_kind != "none" and not (self.noise_multiplier or self.target_epsilon):
            raise FedloraError(f"a {self.release_kind} release needs --noise-multiplier or --target-epsilon")
        if self.release_kind == "dr-encoder":
            self._check_dr_encoder()
        if self.max_train_examples < 0 or self.round_timeout <= 0 or self.min_nodes < 0:
            raise FedloraError("max-train-examples and min-nodes must be >= 0, round-timeout > 0")
        if self.min_replies < 1:
            raise FedloraError(f"min-replies must be >= 1, got {self.min_replies}")
        return self

    def _check_dr_encoder(self) -> None:
        if self.optimizer_kind != "none":
            raise FedloraError(
                f"the dr-encoder release runs its statistics round with non-private local steps; "
                f"it cannot be combined with the sample-level optimizer {self.optimizer_kind}"
            )
        if self.decode_order == "decode-first" and self.threat_model != "local":
            raise FedloraError(
                "--decode-order decode-first needs --threat-model local: under distributed or central "
                "noise a single client's latent is not a private release"
            )
        if self.ae_steps < 0 or not (self.stats_noise_multiplier >= 0 and self.stats_clip > 0):
            raise FedloraError("ae-steps and stats-noise-multiplier must be >= 0, stats-clip > 0")
        if not 0 < self.stats_floor <= 1e-3:  # h2 = 1e-3 caps it (autoencoder/synthetic.py)
            raise FedloraError(f"stats-floor (h1) must be in (0, 1e-3], got {self.stats_floor}")


HELP: dict[str, str] = {
    "model": "smollm2-135m, minilm-l6, a Hugging Face id or a local model directory",
    "dataset": "rotten-tomatoes, bbc-news, news-articles (LM) or boolq",
    "mechanism": "local optimizer / release preset: fedavg (no DP), dp-fedavg (client-level Gaussian), "
    "dr-encoder (client-level Gaussian on an autoencoder latent), prism, dp-adamw, ffa (sample-level DP)",
    "local_optimizer": "sample-level local optimizer: none, prism, dp-adamw or ffa (default: the mechanism's)",
    "sample_epsilon": "sample-level epsilon per client over all its planned local steps (PLD-calibrated)",
    "sample_noise_multiplier": "sample-level noise multiplier (instead of --sample-epsilon)",
    "sample_clip": "per-example clip C of the DP local optimizers",
    "microbatch": "examples per forward/backward within one DP step (memory)",
    "lora_init": "LoRA init: balanced (full rank; default with a DP local optimizer) or peft",
    "prism_floor": "PRISM preconditioner floor: clamp (official code) or ridge (paper Eq. 25)",
    "release": "client-level release: none, gaussian or dr-encoder (default: the mechanism's)",
    "clip": "client-level clip C on the L2 norm of a client's increment",
    "noise_multiplier": "client-level noise multiplier sigma (0 + target epsilon = calibrate)",
    "threat_model": "who adds the client-level noise: local, distributed or central",
    "target_epsilon": "client-level budget; rounds that would exceed it are not run (0 = none)",
    "delta": "delta of the client-level (epsilon, delta) guarantee",
    "num_clients": "number of nodes (data partitions)",
    "rounds": "federated rounds",
    "sample_rate": "Poisson client sampling rate p in (0, 1], each node independently",
    "local_steps": "optimizer steps per client per round",
    "batch_size": "examples per local step",
    "lr": "client learning rate (AdamW)",
    "server_lr": "server learning rate applied to the mean increment",
    "rank": "LoRA rank r >= 1",
    "lora_alpha": "LoRA alpha (scaling alpha / r)",
    "lora_dropout": "LoRA dropout",
    "targets": "comma-separated LoRA target modules (default: the model's)",
    "partition": "dirichlet (label skew) or iid",
    "dirichlet_alpha": "Dirichlet concentration: small = strong label skew",
    "max_train_examples": "cap on the training pool before partitioning (0 = all)",
    "eval_examples": "held-out examples for server evaluation",
    "test_fraction": "fraction of the corpus held out for evaluation",
    "max_length": "maximum tokens per example",
    "seed": "seed for splits, sampling, init and local batches",
    "device": "auto, cpu or cuda",
    "round_timeout": "seconds to wait for replies (and for nodes to connect)",
    "min_nodes": "nodes to wait for before round 1 (0 = num-clients)",
    "min_replies": "usable replies a round needs to be applied (fewer: withheld, its privacy charge stands)",
    "codec": "dr-encoder codec: ae (trained Uformer), identity, constant-mean or random-projection",
    "ae_size": "autoencoder configuration: tiny (CPU), paper or paper-best (GPU)",
    "ae_steps": "autoencoder training steps on synthetic gradients",
    "ae_normalise": "autoencoder input scaling from the statistics: none, image or factor",
    "ae_latent": "autoencoder latent: raw (the encoder's output, the paper) or homogeneous (rescaled to the "
    "increment's norm and decoded so that a clip or an average scales the decoded increment)",
    "stats_granularity": "statistics sent per factor: matrix (2 numbers, the paper's) or column (2 per rank)",
    "stats_floor": "Algorithm 1's h1, the floor of each entry's squared deviation (1e-5, the paper's; "
    "lower it when increments are smaller than sqrt(h1))",
    "stats_noise_multiplier": "noise on the clipped statistics (0 = sent in the clear, as in the paper)",
    "stats_clip": "L2 bound on a client's statistics vector when they are noised",
    "decode_order": "aggregate-first (average latents, decode once; secure aggregation allows it) "
    "or decode-first (decode each client's latent; local noise only)",
    "increment_form": "what a client sends: raw (A' - A, B' - B) or horizontal (PRISM's gauge-fixed lift of "
    "the same first-order change of A B^T; the statistics round uses the same form)",
    "resume": "continue the run in --out from its checkpoint and ledger",
}

PRESETS: dict[str, dict[str, object]] = {
    # `make run`: fast on a 2-core CPU; the encoder starts from an untrained classification head.
    "default": {
        "model": "minilm-l6",
        "dataset": "rotten-tomatoes",
        "partition": "iid",
        "num_clients": 4,
        "sample_rate": 0.5,
        "rounds": 5,
        "local_steps": 20,
        "batch_size": 16,
        "lr": 1e-3,
        "eval_examples": 500,
    },
    # The causal LM through a verbalizer (zero-shot is already ~0.78, so it needs more steps).
    "smollm2-rt": {
        "model": "smollm2-135m",
        "dataset": "rotten-tomatoes",
        "partition": "iid",
        "num_clients": 2,
        "rounds": 5,
        "local_steps": 20,
        "lr": 3e-4,
        "eval_examples": 500,
    },
    "minilm-rt": {
        "model": "minilm-l6",
        "dataset": "rotten-tomatoes",
        "rounds": 5,
        "local_steps": 20,
        "batch_size": 16,
        "lr": 1e-3,
        "eval_examples": 500,
    },
    "minilm-bbc": {
        "model": "minilm-l6",
        "dataset": "bbc-news",
        "rounds": 5,
        "local_steps": 20,
        "batch_size": 16,
        "lr": 1e-3,
        "max_length": 128,
    },
    "smollm2-news": {"model": "smollm2-135m", "dataset": "news-articles", "eval_examples": 50},
    "smollm2-boolq": {"model": "smollm2-135m", "dataset": "boolq", "max_length": 128},
}


def preset(name: str, **overrides: object) -> RunConfig:
    """The named preset with ``overrides`` applied (``None`` values are ignored)."""
    if name not in PRESETS:
        raise FedloraError(f"unknown preset '{name}'; available: {', '.join(PRESETS)}")
    values = {**PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}}
    return RunConfig(**values)


def to_flat(cfg: RunConfig) -> dict[str, object]:
    """Flower-style flat mapping with dashed keys."""
    return {f.name.replace("_", "-"): getattr(cfg, f.name) for f in fields(cfg)}


def from_flat(flat: dict[str, object]) -> RunConfig:
    """Inverse of :func:`to_flat`; a ``preset`` key selects the base, unknown keys are an error.

    An empty string means "the preset's value" (pyproject.toml must list every key for Flower's
    ``--run-config`` overrides, and lists them as "")."""
    flat = dict(flat)
    base = str(flat.pop("preset", "default"))
    known = {f.name: f.type for f in fields(RunConfig)}
    values: dict[str, object] = {}
    for key, value in flat.items():
        name = key.replace("-", "_")
        if name not in known:
            raise FedloraError(f"unknown config key '{key}'")
        if value == "":
            continue
        kind = type(getattr(RunConfig, name))
        try:
            values[name] = _parse_bool(value) if kind is bool else kind(value)
        except (TypeError, ValueError):
            raise FedloraError(f"config key '{key}' expects {kind.__name__}, got {value!r}") from None
    return preset(base, **values)


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(value)


__all__ = ["PRESETS", "RunConfig", "field", "from_flat", "preset", "to_flat"]
