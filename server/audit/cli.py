"""``fedlora audit client``: canary clients in a federation (Andrew et al., ICLR 2024), against the
client-level mechanisms: the arms, their federations and the command (the attack: server/audit/client.py;
a canary node's reply: client/audit/canary.py; what every audit shares: common/privacy/audit_cli.py)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from common.config import RunConfig
from common.presets import preset
from common.privacy.audit_cli import add_common, audit_arms, chosen_arms, out_dir
from common.privacy.participation.threat import THREATS

#: the audited arms: name -> RunConfig overrides (the no-noise arm must lose, the others must hold)
CLIENT_ARMS: dict[str, dict[str, object]] = {
    "no noise (clip only)": {"mechanism": "dp-fedavg", "clip_only": True},
    "dp-fedavg central ε=8": {"mechanism": "dp-fedavg", "threat_model": "central", "target_epsilon": 8.0},
    "dp-fedavg distributed ε=8": {
        "mechanism": "dp-fedavg",
        "threat_model": "distributed",
        "target_epsilon": 8.0,
    },
    # per client, against the server too; min-replies 9/10 of the cohort, canaries included (_client_configs)
    "dp-fedavg secure aggregation ε=8": {
        "mechanism": "dp-fedavg",
        "threat_model": "secure-aggregation",
        "target_epsilon": 8.0,
    },
    # every client every round, each contributing by its own coin: amplified against the server
    "dp-fedavg secure aggregation hidden ε=8": {
        "mechanism": "dp-fedavg",
        "threat_model": "secure-aggregation-hidden",
        "target_epsilon": 8.0,
    },
}
#: --quick: 20 real clients (+ the canaries), every client every round, 3 rounds (≈ 2 minutes, 2 cores)
QUICK = {
    "num_clients": 20,
    "sample_rate": 1.0,
    "rounds": 3,
    "max_train_examples": 600,
    "eval_examples": 50,
    "eval_every": 3,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="minilm-rt-xdev", help="federation the canaries join")
    p.add_argument("--quick", action="store_true", help="a small federation (20 clients, 3 rounds)")
    p.add_argument("--clients", type=int, default=0, help="real clients (0: the preset's, 20 with --quick)")
    p.add_argument("--rounds", type=int, default=0, help="rounds (0: the preset's, 3 with --quick)")
    p.add_argument("--clip", type=float, default=0.5, help="client-level clip C (the canaries' norm)")
    add_common(p, CLIENT_ARMS, "canary directions, inclusion and the run's seed")


def run(args: argparse.Namespace) -> int:
    arms = chosen_arms(args, CLIENT_ARMS)
    out = out_dir(args)
    from server.audit.client import audit_run  # loads the federation stack only when needed

    return audit_arms(args, out, arms, _client_configs(args, arms), audit_run)


def _secagg_min_replies(cfg: RunConfig, canaries: int) -> int:
    """SecAgg+'s min-replies m for an audit arm: its shares are sized for m, 9/10 of the cohort the
    plan counts over the federation (canaries included; under hidden participation all of its
    clients), so a full cohort carries 10/9 of the noise the plan needs."""
    from common.privacy.planning.secure_plan import cohort_bound
    from server.audit.client import federation

    cohort = cohort_bound(federation(cfg, canaries))
    return max(cfg.secagg_neighbours // 2 + 1, cohort * 9 // 10)


#: transport name -> an audit arm's min-replies through it (the others keep the preset's)
_MIN_REPLIES: dict[str, Callable[[RunConfig, int], int]] = {"secagg+": _secagg_min_replies}


def _client_configs(args: argparse.Namespace, arms: list[str]) -> list[RunConfig]:
    """Each arm's config (its real clients), checked first, all of them, as the federation it runs:
    the canary slots are clients of it like any other (server/audit/client.py ``federation``)."""
    from server.audit.client import federation

    base = {**(QUICK if args.quick else {}), "clip": args.clip, "seed": args.seed}
    base.update({k: v for k, v in (("num_clients", args.clients), ("rounds", args.rounds)) if v})
    configs = []
    for arm in arms:
        cfg = preset(args.preset, **{**base, **CLIENT_ARMS[arm]})
        if sized := _MIN_REPLIES.get(THREATS[cfg.threat_model].transport.name):
            cfg = cfg.replace(min_replies=sized(cfg, args.canaries))
        federation(cfg, args.canaries).check()
        configs.append(cfg)
    return configs
