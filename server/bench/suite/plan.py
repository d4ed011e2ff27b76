"""What ``fedlora bench suite`` runs: every command of every section, for one profile.

A profile fixes the settings; an *arm* is one configuration compared in a section (a mechanism at a
budget); every arm runs once per seed. Each run is a plain ``fedlora`` command line, recorded as it
is run, so any figure in the report can be reproduced by pasting its command.

- ``full``: the real presets (``minilm-rt-xdev``: 1,000 clients, 30 rounds; MiniLM ``train-local``:
  100 logical batches of 128 from the whole train split, each method at its own learning rate, the
  best of a validation grid: ``fedlora bench compare``, docs/prism.md), 3 seeds; ``fedlora audit``
  at its defaults; SmolLM2 on Shakespeare roles (``smollm2-shakespeare-xdev``, user-level ε 8 and
  2; ``smollm2-shakespeare-bigsilo``, 4 nodes of 7 plays, sample-level ε 3 per node, each method at
  its validated learning rate and init, the winner with the public prior and each of its nodes
  alone); banded MF DP-FTRL against DP-FedAvg under the same participation rule and amplified
  (``minilm-rt-xdev``, 300 rounds, server momentum: issue 51's declared runs,
  docs/correlated-noise.md); the DP track (issue 76: ``smollm2-instruct-xdev`` on the packaged
  multiple-choice sets, ``smollm2-chitchat-xdev`` on chat senders, docs/instruction-tuning.md). Hours on a 2-core CPU; a run directory that already holds a finished
  run with the same command is reused, so an interrupted suite picks up where it stopped.
- ``quick``: the same commands at miniature size (100 clients, 2 rounds, 200 held-out examples; 8
  local steps), 3 seeds, and ``audit ... --quick``: about 30 minutes on 2 cores. Its accuracies
  check the pipeline and the accounting; at that size nothing has time to learn, and the report
  says so.
- ``tiny``: one seed, one round, a handful of examples: the suite's own smoke test (``make test``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from common.presets import PRESETS

PROFILES = ("tiny", "quick", "full")


@dataclass(frozen=True)
class Arm:
    """One configuration of a section: ``label`` in tables, ``argv`` added to the section's base."""

    label: str
    argv: tuple[str, ...] = ()
    target_epsilon: float | None = None  # the budget the arm claims (None: not private)
    seeds: tuple[int, ...] | None = None  # None: the profile's seeds (a labelled side row may run fewer)


@dataclass(frozen=True)
class Run:
    """One command: ``fedlora <argv> [--seed S] --out <dir>`` (``output`` ``dir``) or
    ``fedlora <argv>`` printing one JSON object (``output`` ``json``)."""

    section: str
    key: str  # the run's directory name under the suite's runs/
    argv: tuple[str, ...]
    output: str = "dir"
    arm: Arm | None = None
    seed: int | None = None
    rescore: tuple[str, ...] = ()  # ``fedlora evaluate`` options its adapter is scored again with (none: not)

    @property
    def command(self) -> list[str]:
        seed = ["--seed", str(self.seed)] if self.seed is not None else []
        return ["fedlora", *self.argv, *seed]

    def rescore_command(self, base: bool) -> list[str]:
        """The command that scores the run's final adapter again (``base``: round 0's, the base
        model), ``RUN`` standing for the run's directory."""
        return ["fedlora", "evaluate", "--run", "RUN", *self.rescore, *(["--base"] if base else [])]


@dataclass(frozen=True)
class Profile:
    name: str
    seeds: tuple[int, ...]
    client_base: tuple[str, ...]
    client_arms: tuple[Arm, ...]
    sample_base: tuple[str, ...]
    sample_arms: tuple[Arm, ...]
    codec: tuple[str, ...]
    prism_step: tuple[str, ...]
    scale: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    audits: tuple[tuple[str, ...], ...] = ()  # ``fedlora audit ...`` commands (their own canaried runs)
    lm_base: tuple[str, ...] = ()  # generative federations (causal LM, natural users)
    lm_arms: tuple[Arm, ...] = ()
    silo_base: tuple[str, ...] = ()  # cross-silo federations (sample-level DP per node)
    silo_arms: tuple[Arm, ...] = ()
    alone_base: tuple[str, ...] = ()  # ``train-local`` of one silo on its own (an arm adds ``--node K``)
    alone_arms: tuple[Arm, ...] = ()
    ftrl_base: tuple[str, ...] = ()  # correlated noise against DP-FedAvg (long cross-device runs)
    ftrl_arms: tuple[Arm, ...] = ()
    mc_base: tuple[str, ...] = ()  # the DP track: instruction tuning on the multiple-choice sets
    mc_arms: tuple[Arm, ...] = ()
    mc_silo_base: tuple[str, ...] = ()  # the same benchmark cross-silo (sample-level DP per node)
    mc_silo_arms: tuple[Arm, ...] = ()
    chat_base: tuple[str, ...] = ()  # the DP track: chat with natural users (chitchat senders)
    chat_arms: tuple[Arm, ...] = ()
    #: ``fedlora evaluate`` options every instruction run's adapter, and the base model, are scored
    #: again with (every held-out item, the same for every seed and arm); none: each run's own subset
    rescore: tuple[str, ...] = ()


def _args(line: str) -> tuple[str, ...]:
    return tuple(shlex.split(line))


def _client_arms(min_replies: int, ae_steps: int, epsilons: tuple[float, ...]) -> tuple[Arm, ...]:
    """fedavg; dp-fedavg with central noise at each ε; distributed noise and dr-encoder at the first ε."""
    e0 = epsilons[0]
    return (
        Arm("fedavg (not private)", _args("--mechanism fedavg")),
        *(
            Arm(
                f"dp-fedavg central ε={e:g}", _args(f"{_DP} --threat-model central --target-epsilon {e:g}"), e
            )
            for e in epsilons
        ),
        Arm(
            f"dp-fedavg distributed ε={e0:g}",
            _args(f"{_DP} --threat-model distributed --target-epsilon {e0:g} --min-replies {min_replies}"),
            e0,
        ),
        Arm(
            f"dr-encoder central ε={e0:g}",
            _args(
                f"--mechanism dr-encoder --clip 0.5 --threat-model central --target-epsilon {e0:g} --ae-steps {ae_steps}"
            ),
            e0,
        ),
    )


def _public(k: int) -> str:
    """The public prior's options: 10 % of the data held out as public, ``k`` directions fitted on
    ``k`` public increments."""
    return f"--public-fraction 0.1 --public-subspace {k} --public-increments {k}"


def _public_arms(k: int, epsilons: tuple[float, ...]) -> tuple[Arm, ...]:
    """The public prior (issue 17) at each ε: dp-fedavg projected onto K public directions, and the
    dr-encoder release whose codec is that subspace."""
    arms = []
    for e in epsilons:
        budget = f"--clip 0.5 --threat-model central --target-epsilon {e:g} {_public(k)}"
        arms.append(
            Arm(f"dp-fedavg + public subspace central ε={e:g}", _args(f"--mechanism dp-fedavg {budget}"), e)
        )
        arms.append(
            Arm(f"dr-encoder pca central ε={e:g}", _args(f"--mechanism dr-encoder --codec pca {budget}"), e)
        )
    return tuple(arms)


def _secure_arms(min_replies: int, cap: int, epsilons: tuple[float, ...]) -> tuple[Arm, ...]:
    """dp-fedavg under secure aggregation (issue 34) at each ε: per client against the server, each of
    at most ``cap`` participations at p = 1, fixed cohorts of p·N (docs/secure-aggregation.md)."""
    return tuple(
        Arm(
            f"dp-fedavg secure aggregation ε={e:g} (per client, cap {cap})",
            _args(
                f"{_DP} --threat-model secure-aggregation --target-epsilon {e:g} --min-replies {min_replies} "
                f"--max-participations {cap}"
            ),
            e,
        )
        for e in epsilons
    )


def _hidden_arms(min_replies: int, epsilons: tuple[float, ...], extra: str = "") -> tuple[Arm, ...]:
    """dp-fedavg under secure aggregation with hidden participation (issue 34) at each ε: every client
    in every round, each contributing by its own coin at p, so sampling amplifies against the server.
    ``extra``: options added to each command."""
    return tuple(
        Arm(
            f"dp-fedavg secure aggregation ε={e:g} (hidden participation)",
            _args(
                f"{_DP} --threat-model secure-aggregation-hidden --target-epsilon {e:g} --min-replies {min_replies}"
                f"{extra}"
            ),
            e,
        )
        for e in epsilons
    )


def _ftrl_arms(
    epsilons: tuple[float, ...], separation: int, seeds: tuple[tuple[int, ...] | None, ...]
) -> tuple[Arm, ...]:
    """At each ε (with its seeds, None: the profile's): banded MF DP-FTRL at its default bands, b = 1/p
    for the base's sample rate p, under b-min-separation with no amplification claimed (``separation``
    is that b: the plan's test checks it); DP-FedAvg charged under the same rule (one band: the
    Gaussian mechanism, each participation at p = 1); DP-FedAvg with amplification by Poisson
    sampling credited (issue 51, docs/correlated-noise.md). The first arm of each ε is the one the
    section compares the others with."""
    budget = "--threat-model central --delta 1e-6 --clip 0.5 --target-epsilon"
    arms = []
    for e, s in zip(epsilons, seeds, strict=True):
        arms += [
            Arm(
                f"dp-ftrl banded MF ε={e:g} ({separation} bands, min-separation {separation})",
                _args(f"--mechanism dp-ftrl {budget} {e:g}"),
                e,
                s,
            ),
            Arm(
                f"dp-fedavg ε={e:g}, same rule (min-separation {separation}, no amplification)",
                _args(f"--mechanism dp-ftrl --bands 1 --min-separation {separation} {budget} {e:g}"),
                e,
                s,
            ),
            Arm(
                f"dp-fedavg ε={e:g}, amplified (Poisson sampling)",
                _args(f"--mechanism dp-fedavg {budget} {e:g}"),
                e,
                s,
            ),
        ]
    return tuple(arms)


SAMPLE_METHODS = ("fedavg", "prism", "dp-adamw", "ffa", "sparta")


def _sample_arm(method: str, epsilon: float, lr: str | None = None) -> Arm:
    """``method`` under sample-level ε (``fedavg``: non-private AdamW), at ``lr`` when given."""
    lr_args, lr_label = (f" --lr {lr}", f" lr {lr}") if lr else ("", "")
    if method == "fedavg":
        return Arm(f"non-private AdamW{lr_label}", _args(f"--mechanism fedavg{lr_args}"))
    argv = _args(f"--mechanism {method} --sample-epsilon {epsilon:g}{lr_args}")
    return Arm(f"{method} ε={epsilon:g}{lr_label}", argv, epsilon)


def _sample_arms(epsilon: float, lrs: dict[str, str] | None = None) -> tuple[Arm, ...]:
    """Every sample-level method; ``lrs``: each method's learning rate (else the base's)."""
    return tuple(_sample_arm(m, epsilon, (lrs or {}).get(m)) for m in SAMPLE_METHODS)


def _lm_arms(epsilons: tuple[float, ...]) -> tuple[Arm, ...]:
    """Non-private fedavg and user-level dp-fedavg (central noise, adaptive clipping) at each ε, and
    one seed of the first ε's what-if row: noise sized for 1,000 roles per round (a population of
    10,000 at p = 0.1), its ε valid for that deployment, not for the run (labelled)."""
    dp = "--mechanism dp-fedavg --threat-model central --clip 1.0 --adaptive-clip"
    e0 = epsilons[0]
    return (
        Arm("SmolLM2 fedavg (not private)", _args("--mechanism fedavg")),
        *(
            Arm(f"SmolLM2 dp-fedavg central ε={e:g}", _args(f"{dp} --target-epsilon {e:g}"), e)
            for e in epsilons
        ),
        Arm(
            f"SmolLM2 dp-fedavg central ε={e0:g}, WHAT-IF cohort 1000 (ε for 10,000 roles, not this run)",
            _args(f"{dp} --target-epsilon {e0:g} --noise-cohort 1000"),
            e0,
            seeds=(0,),
        ),
    )


def _tuned(method: str, tuned: dict[str, str] | None) -> tuple[str, str]:
    """(options, label suffix) of ``method``'s own settings in ``tuned`` (e.g. ``--lr 3e-2``); none:
    the preset's."""
    extra = (tuned or {}).get(method, "")
    return (f" {extra}", f" ({extra.replace('--', '').strip()})") if extra else ("", "")


def _silo_arms(
    epsilon: float, tuned: dict[str, str] | None = None, public: tuple[str, int] | None = None
) -> tuple[Arm, ...]:
    """Non-private FedAvg of local AdamW, and each sample-level local optimizer at ``epsilon`` per node;
    ``tuned``: each method's own options (its validated learning rate, its init), else the preset's;
    ``public`` (method, K): that method again with the server's public prior of K directions."""
    opts, label = _tuned("fedavg", tuned)
    arms = [Arm(f"fedavg (not private){label}", _args(f"--mechanism fedavg{opts}"))]
    private = [(m, 0) for m in ("prism", "dp-adamw", "ffa")] + ([public] if public else [])
    for m, k in private:  # (method, public directions; 0: no public prior)
        opts, label = _tuned(m, tuned)
        prior, prior_label = (f" {_public(k)}", f" + public subspace ({k} directions)") if k else ("", "")
        arms.append(
            Arm(
                f"{m} ε={epsilon:g}{label}{prior_label}",
                _args(f"--mechanism {m} --sample-epsilon {epsilon:g}{opts}{prior}"),
                epsilon,
            )
        )
    return tuple(arms)


def _alone(
    preset: str, method: str = "", tuned: dict[str, str] | None = None
) -> tuple[tuple[str, ...], tuple[Arm, ...]]:
    """The ``train-local`` base and arms (``--node K``) of each node of the cross-silo ``preset``
    trained alone: its split (the same shard options, so node K holds what it holds in the
    federation), ``method`` (default the preset's) with its ``tuned`` options, budget and batch, and as
    many local steps as a node takes in the federation (rounds x local steps), evaluated on the same
    held-out roles."""
    c = PRESETS[preset]
    method = method or str(c["mechanism"])
    opts, label = _tuned(method, tuned)
    users = int(c.get("users_per_client", 1))
    lr = "" if "--lr" in opts else f" --lr {c['lr']:g}"  # the preset's unless tuned
    base = _args(
        f"train-local --model {c['model']} --dataset {c['dataset']} --max-length {c['max_length']} "
        f"--lm-blocks {c['lm_blocks']} --partition {c['partition']} --partition-by {c['partition_by']} "
        f"--num-clients {c['num_clients']} --users-per-client {users} "
        f"--max-train-examples {c['max_train_examples']} --mechanism {method} "
        f"--sample-epsilon {c['sample_epsilon']:g} --delta {c['delta']:g} "
        f"--local-steps {c['rounds'] * c['local_steps']} --batch-size {c['batch_size']}{lr} "
        f"--eval-examples {c['eval_examples']}{opts}"
    )
    unit = "play {} alone" if users == 1 else f"node {{}} alone ({users} plays)"
    arms = tuple(
        Arm(
            f"{unit.format(k)}, {method} ε={c['sample_epsilon']:g}{label}",
            ("--node", str(k)),
            c["sample_epsilon"],
        )
        for k in range(c["num_clients"])
    )
    return base, arms


#: issue 52's big silo (docs/shakespeare.md, "Bigger silos, each method tuned"): each method's learning
#: rate (and dp-adamw's init), the best of its validation grid on node 0's 64 held-out examples
BIGSILO_TUNED = {
    "fedavg": "--lr 3e-3",
    "prism": "--lr 1e-2",
    "dp-adamw": "--lr 1e-2 --lora-init peft",
    "ffa": "--lr 1e-2",
}
#: the private method whose federation's mean log-perplexity drop over the 3 seeds is largest: its
#: nodes alone and its federation with the public prior are measured. dp-adamw: 0.204 nats against
#: PRISM's 0.191 and ffa's 0.135 (seeds 0-2, 2026-12-01; docs/shakespeare.md)
BIGSILO_WINNER: str | None = "dp-adamw"


def _bigsilo(
    winner: str | None,
) -> tuple[tuple[str, ...], tuple[Arm, ...], tuple[str, ...], tuple[Arm, ...]]:
    """The full profile's cross-silo section (base, arms, alone base, alone arms): every method federated
    at its validated settings on ``smollm2-shakespeare-bigsilo``, and once the ``winner`` is known, its
    federation with the public prior (128 directions) and each of its nodes alone."""
    preset = "smollm2-shakespeare-bigsilo"
    arms = _silo_arms(3.0, BIGSILO_TUNED, (winner, 128) if winner else None)
    alone_base, alone_arms = _alone(preset, winner, BIGSILO_TUNED) if winner else ((), ())
    return _args(f"simulate --preset {preset}"), arms, alone_base, alone_arms


_SILO_BASE, _SILO_ARMS, _ALONE_BASE, _ALONE_ARMS = _bigsilo(BIGSILO_WINNER)
_DP = "--mechanism dp-fedavg --clip 0.5"
_SAMPLE = "train-local --model minilm-l6 --dataset rotten-tomatoes --pooling mean --head-init zero-shot --delta 1e-5"
_QUICK_XDEV = "--preset minilm-rt-xdev --num-clients 100"
_FULL_SAMPLE = f"{_SAMPLE} --local-steps 100 --batch-size 128 --eval-examples 500 --max-train-examples 0"
#: each method's learning rate in the full profile: the best of the validation grid measured with
#: these settings, each method from its own init (docs/prism.md; ffa's from PEFT's init, issue 52;
#: sparta was not in that grid)
FULL_SAMPLE_LR = {"fedavg": "3e-3", "prism": "1e-2", "dp-adamw": "3e-3", "ffa": "1e-2", "sparta": "1e-2"}

_USER_DP = "--mechanism dp-fedavg --threat-model central --clip 1.0 --adaptive-clip"


def _mc_arms() -> tuple[Arm, ...]:
    """The DP track on the multiple-choice benchmark (issue 76): non-private; client-level dp-fedavg
    at ε 8 and 3 (central noise, adaptive clip, Shakespeare's recipe); banded MF DP-FTRL at ε 8
    under its participation rule; dp-fedavg under secure aggregation at ε 8 (fixed cohorts, each
    client at most 3 times)."""
    return (
        Arm("MC fedavg (not private)", _args("--mechanism fedavg")),
        *(
            Arm(f"MC dp-fedavg central ε={e:g}", _args(f"{_USER_DP} --target-epsilon {e:g}"), e)
            for e in (8.0, 3.0)
        ),
        Arm(
            "MC dp-ftrl banded MF ε=8",
            _args("--mechanism dp-ftrl --threat-model central --clip 1.0 --target-epsilon 8"),
            8.0,
        ),
        Arm(
            "MC dp-fedavg secure aggregation ε=8 (per client, cap 3)",
            _args(
                "--mechanism dp-fedavg --clip 1.0 --threat-model secure-aggregation --target-epsilon 8 "
                "--min-replies 30 --max-participations 3"
            ),
            8.0,
        ),
    )


def _mc_silo_arms() -> tuple[Arm, ...]:
    """The multiple-choice benchmark cross-silo (issue 76): 4 nodes of 3 whole sets each, FedAvg of
    local AdamW without privacy and dp-adamw at sample-level ε 3 per node (the preset's)."""
    return (
        Arm("MC silo fedavg (not private)", _args("--mechanism fedavg")),
        Arm(
            "MC silo dp-adamw ε=3 per node (sample-level)",
            _args("--mechanism dp-adamw --sample-epsilon 3"),
            3.0,
        ),
    )


def _chat_arms() -> tuple[Arm, ...]:
    """The DP track on chat (issue 76): non-private and user-level dp-fedavg at ε 8 (one sender a
    client; central noise, adaptive clip)."""
    return (
        Arm("chat fedavg (not private)", _args("--mechanism fedavg")),
        Arm("chat dp-fedavg central ε=8 (user-level)", _args(f"{_USER_DP} --target-epsilon 8"), 8.0),
    )


_PROFILES: dict[str, Profile] = {
    "full": Profile(
        "full",
        seeds=(0, 1, 2),
        client_base=_args("simulate --preset minilm-rt-xdev"),
        client_arms=(
            *_client_arms(min_replies=75, ae_steps=300, epsilons=(8.0, 3.0, 1.0)),
            *_public_arms(k=128, epsilons=(8.0, 3.0)),
            *_secure_arms(min_replies=90, cap=3, epsilons=(8.0, 3.0)),
            # issue 49's measured runs: fp32 like every run before them, idle nodes skipping the work
            # their coin zeroes (the same releases: docs/secure-aggregation.md)
            *_hidden_arms(
                min_replies=900, epsilons=(8.0, 3.0), extra=" --precision fp32 --idle-training skip"
            ),
        ),
        sample_base=_args(_FULL_SAMPLE),
        sample_arms=_sample_arms(3.0, FULL_SAMPLE_LR),
        codec=_args("bench codec --preset minilm-rt-xdev --sample-rate 0.032 --json"),
        prism_step=_args("bench prism-step --model smollm2-135m --json"),
        scale=_args("bench scale --json"),
        audits=(_args("audit client"), _args("audit mia")),
        lm_base=_args("simulate --preset smollm2-shakespeare-xdev"),
        lm_arms=_lm_arms(epsilons=(8.0, 2.0)),
        silo_base=_SILO_BASE,
        silo_arms=_SILO_ARMS,
        alone_base=_ALONE_BASE,
        alone_arms=_ALONE_ARMS,
        ftrl_base=_args(
            "simulate --preset minilm-rt-xdev --rounds 300 --server-optimizer momentum --server-lr 0.03 --eval-every 10"
        ),
        ftrl_arms=_ftrl_arms((3.0, 8.0), seeds=(None, (0,)), separation=10),
        mc_base=_args("simulate --preset smollm2-instruct-xdev"),
        mc_arms=_mc_arms(),
        mc_silo_base=_args("simulate --preset smollm2-instruct-silo"),
        mc_silo_arms=_mc_silo_arms(),
        rescore=_args("--eval-examples 100000 --precision fp32"),
        chat_base=_args("simulate --preset smollm2-chitchat-xdev"),
        chat_arms=_chat_arms(),
    ),
    "quick": Profile(
        "quick",
        seeds=(0, 1, 2),
        client_base=_args(f"simulate {_QUICK_XDEV} --rounds 2 --eval-every 2 --eval-examples 200"),
        client_arms=_client_arms(min_replies=5, ae_steps=50, epsilons=(8.0, 3.0)),
        sample_base=_args(f"{_SAMPLE} --local-steps 8 --batch-size 32 --lr 2e-3 --eval-examples 200"),
        sample_arms=_sample_arms(3.0),
        codec=_args(f"bench codec {_QUICK_XDEV} --sample-rate 0.1 --ae-steps 50 --json"),
        prism_step=_args("bench prism-step --model smollm2-135m --batch 4 --seq 64 --repeats 3 --json"),
        scale=_args("bench scale --populations 10,1000 --rounds 2 --json"),
        audits=(_args("audit client --quick"), _args("audit mia --quick")),
        notes=(
            "quick profile: miniature runs (2 rounds of about 10 clients; 8 local steps) that check the "
            "pipeline and the accounting, nothing more: accuracies at this size rank nothing. "
            "docs/RESULTS.md is the full profile's report (`fedlora bench suite`)",
        ),
    ),
    "tiny": Profile(
        "tiny",
        seeds=(0,),
        client_base=_args(
            "simulate --preset minilm-rt-xdev --num-clients 4 --sample-rate 1.0 --rounds 1 "
            "--max-train-examples 200 --eval-examples 16"
        ),
        client_arms=(
            Arm("fedavg (not private)", _args("--mechanism fedavg")),
            Arm("dp-fedavg central ε=8", _args(f"{_DP} --threat-model central --target-epsilon 8"), 8.0),
        ),
        sample_base=_args(
            f"{_SAMPLE} --local-steps 1 --batch-size 4 --max-train-examples 200 --eval-examples 16"
        ),
        sample_arms=(Arm("prism ε=3", _args("--mechanism prism --sample-epsilon 3"), 3.0),),
        ftrl_base=_args(
            "simulate --preset minilm-rt-xdev --num-clients 4 --sample-rate 0.5 --rounds 2 "
            "--max-train-examples 200 --eval-examples 16"
        ),
        ftrl_arms=_ftrl_arms((8.0,), seeds=(None,), separation=2)[:2],  # MF and the same rule: a pair
        codec=(),
        prism_step=_args("bench prism-step --model smollm2-135m --batch 2 --seq 16 --repeats 1 --json"),
        scale=(),
        notes=("tiny profile: the suite's smoke test; its numbers mean nothing",),
    ),
}


def profile(name: str) -> Profile:
    return _PROFILES[name]


def runs(p: Profile) -> list[Run]:
    """Every command of profile ``p``, section by section (privacy reads the utility runs)."""
    out: list[Run] = []
    for section, key, base, arms in (
        ("client-level", "client-level", p.client_base, p.client_arms),
        ("correlated-noise", "correlated-noise", p.ftrl_base, p.ftrl_arms),
        ("sample-level", "sample-level", p.sample_base, p.sample_arms),
        ("generative", "generative", p.lm_base, p.lm_arms),
        ("cross-silo", "cross-silo", p.silo_base, p.silo_arms),
        ("cross-silo", "cross-silo-alone", p.alone_base, p.alone_arms),
        ("instruction", "instruction", p.mc_base, p.mc_arms),
        ("instruction", "instruction-silo", p.mc_silo_base, p.mc_silo_arms),
        ("chat", "chat", p.chat_base, p.chat_arms),
    ):
        rescore = p.rescore if section == "instruction" else ()
        for i, arm in enumerate(arms):
            for seed in arm.seeds or p.seeds:
                argv = (*base, *arm.argv)
                out.append(Run(section, f"{key}-{i}-s{seed}", argv, arm=arm, seed=seed, rescore=rescore))
    for section, argv in (("communication", p.codec), ("speed", p.prism_step), ("scale", p.scale)):
        if argv:
            out.append(Run(section, section, argv, output="json"))
    out += [Run("audit", f"audit-{i}", argv) for i, argv in enumerate(p.audits)]
    return out
