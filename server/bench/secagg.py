"""``fedlora bench secagg``: what secure aggregation costs, measured side by side in one invocation.

1. **Round time.** The same federation (``--preset``; ``minilm-rt-xdev`` samples about 100 clients a
   round) runs three times in this process with the same seed and workers: plain dp-fedavg (central
   noise), dp-fedavg under secure aggregation, and under secure aggregation with hidden participation
   (every client in the protocol, about 100 contributing), all at ``--epsilon``. Reported: the mean seconds of the
   rounds that were not evaluated (the last one is), for each, their ratio, and the ratio per sampled
   client (each arm draws its own Poisson cohorts).
2. **A client's protocol cost as a function of its neighbours k.** The SecAgg+ stages
   (common/secagg/protocol.py) for k + 1 nodes, each the others' neighbour, on vectors of the
   preset's padded adapter size D at the plan's bits: a client's key pairs and their signature
   (stage 0), its k signature checks, 2k key agreements and 2k Shamir shares sealed into k
   ciphertexts (stage 1), its k + 1 mask expansions of D words (stage 2), its signature of the
   survivor set (stage 3) and its unmask answer after checking a majority's signatures (stage 4),
   in seconds per client; and the server's unmasking per client.
3. **The active-server check as a function of the round's nodes n.** Each survivor checks the
   signatures of a majority of n (Ed25519), whatever k is: its cost per client, without the
   process-wide cache a simulation shares between its nodes.

Times are of this machine's CPU (one thread), never a GPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common.errors import FedloraError
from common.presets import preset
from common.privacy.participation.threat import THREATS
from common.secagg import identity, protocol
from common.secagg.protocol import Params

#: the two arms of the round-time comparison: label -> run config overrides
ARMS: dict[str, dict[str, object]] = {
    "plain dp-fedavg (central noise)": {"threat_model": "central"},
    "secure aggregation": {"threat_model": "secure-aggregation", "min_replies": 90, "max_participations": 3},
    # every client every round (about 10x the protocol's nodes), about p·N of them contributing
    "secure aggregation, hidden participation": {"threat_model": "secure-aggregation-hidden"},
}


#: why the hidden arm cannot come near the plain one in a simulation (printed with the ratios)
CONSTANT_WORK = (
    "hidden participation trains every online client every round whatever its coin (constant work, "
    "so that reply timing does not show the coin): about 1/p times the plain arm's client compute in "
    "a simulation, where one machine runs every node; in a deployment each node trains on its own "
    "device and the round's wall time is one client's"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="minilm-rt-xdev", help="the federation both arms run")
    parser.add_argument(
        "--rounds", type=int, default=4, help="rounds per arm (the last is evaluated, not timed)"
    )
    parser.add_argument("--epsilon", type=float, default=8.0, help="client-level target epsilon of both arms")
    parser.add_argument("--neighbours", default="5,10,20", help="comma-separated k for the protocol's cost")
    parser.add_argument("--bits", type=int, default=20, help="bits per coordinate of the protocol timing")
    parser.add_argument(
        "--round-nodes", default="100,1000", help="comma-separated n for the active-server check's cost"
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="client worker processes of both arms (0: cores)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def round_seconds(args: argparse.Namespace, work: Path) -> dict[str, dict]:
    """Each arm's federation: mean and per-round seconds of its unevaluated rounds."""
    from server.simulate import simulate  # the federation stack, only when measured

    if args.rounds < 2:
        raise FedloraError("--rounds must be >= 2 (the last round is evaluated, not timed)")
    out = {}
    for k, (label, change) in enumerate(ARMS.items()):
        cfg = preset(
            args.preset,
            mechanism="dp-fedavg",
            clip=0.5,
            target_epsilon=args.epsilon,
            rounds=args.rounds,
            eval_every=args.rounds,
            workers=args.workers,
            **change,
        )
        if THREATS[cfg.threat_model].hides_participation:  # shares sized for 9/10 of everyone
            cfg = cfg.replace(min_replies=int(0.9 * cfg.num_clients))
        cfg = cfg.check()
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):  # stdout: the JSON only
            run_dir = simulate(cfg.replace(out_dir=str(work / f"arm-{k}")), work / f"arm-{k}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        timed = [r for r in rows if r.get("phase") == "train" and r["round"] < args.rounds]
        seconds = [r["seconds"] for r in timed]
        out[label] = {
            "seconds_per_round": statistics.fmean(seconds),
            "rounds": seconds,
            "clients_per_round": statistics.fmean(r["sampled"] for r in timed),
            "bytes_per_round": statistics.fmean(r["bytes_down"] + r["bytes_up"] for r in timed),
        }
    return out


def _ratios(arm: dict, plain: dict) -> dict[str, float]:
    """An arm's round time over the plain arm's, raw and per sampled client (the cohorts differ)."""
    per = arm["seconds_per_round"] / arm["clients_per_round"]
    return {
        "round": arm["seconds_per_round"] / plain["seconds_per_round"],
        "per_client": per / (plain["seconds_per_round"] / plain["clients_per_round"]),
    }


def protocol_cost(k: int, length: int, bits: int) -> dict[str, float]:
    """Seconds per client of each SecAgg+ stage for k + 1 nodes (every node the others' neighbour,
    t = ⌊k/2⌋ + 1, nobody dropped), and the server's routing and unmasking per client."""
    nodes = tuple(range(1, k + 2))
    params = Params(1, nodes, k, k // 2 + 1, bits, length, os.urandom(32)).validate()
    rng = np.random.default_rng(0)
    inputs = {u: rng.integers(0, 1 << bits, length, dtype=np.int64) for u in nodes}
    clock = {"setup": 0.0, "share": 0.0, "mask": 0.0, "check": 0.0, "unmask": 0.0, "server": 0.0}
    ids = {u: identity.new_identity() for u in nodes}
    roster = frozenset(i.public for i in ids.values())
    identity.forget_checks()  # every client checks every signature itself, as on its own device

    def timed(stage: str, fn, *a):
        t0 = time.perf_counter()
        result = fn(*a)
        clock[stage] += time.perf_counter() - t0
        return result

    clients, advertised = {}, {}
    for u in nodes:
        clients[u], advertised[u] = timed("setup", protocol.setup, params, u, ids[u])
    routed = timed("server", protocol.route_keys, params, advertised)
    entries = timed("server", protocol.transcript, advertised)
    outboxes = {}
    for u in nodes:
        clients[u], outboxes[u] = timed(
            "share", protocol.share_keys, clients[u], routed[u], roster, entries, ids[u]
        )
        identity.forget_checks()
    inboxes = timed("server", protocol.route_shares, params, outboxes)
    masked = {}
    for u in nodes:
        clients[u], masked[u] = timed(
            "mask", protocol.masked_input, clients[u], inboxes.get(u, {}), inputs[u]
        )
    survivors, signatures = frozenset(masked), {}
    for u in nodes:
        clients[u], signed = timed("check", protocol.check_survivors, clients[u], survivors, ids[u])
        signatures[u] = (advertised[u], signed)
    request = timed("server", protocol.unmask_request, survivors, signatures)
    replies = []
    for u in nodes:
        replies.append(timed("unmask", protocol.unmask, clients[u], request, roster))
        identity.forget_checks()
    shared = {u: set(out) for u, out in outboxes.items()}
    total = timed("server", protocol.unmask_sum, params, advertised, shared, masked, replies)
    if not np.array_equal(total.astype(np.int64), sum(inputs.values()) % (1 << bits)):
        raise RuntimeError("the protocol's sum is wrong")  # never expected: the benchmark checks itself
    return {stage: seconds / len(nodes) for stage, seconds in clock.items()}


def consistency_cost(nodes: int, clients: int = 3) -> float:
    """Seconds one client spends checking a majority of ``nodes`` survivors' Ed25519 signatures of
    the survivor set, each against the identity the round's transcript names for its signer (the
    active-server check, :func:`protocol.count_signers`, without the simulation's shared cache),
    the mean over ``clients`` clients."""
    signers = identity.majority(nodes)
    ids = {v: identity.new_identity() for v in range(signers)}
    keys = {v: protocol.PublicKeys(v, os.urandom(32), os.urandom(32), i.public) for v, i in ids.items()}
    params = Params(1, tuple(range(max(nodes, 3))), 2, 2, 8, 1, os.urandom(32))
    client = protocol.Client(params, 0, None, None, b"", transcript=protocol.transcript(keys))
    survivors = frozenset(range(nodes))
    transcript, set_digest = client.transcript_digest, identity.survivors_digest(survivors)
    request = protocol.unmask_request(
        survivors,
        {
            v: (keys[v], i.sign(identity.survivors_statement(transcript, v, set_digest)))
            for v, i in ids.items()
        },
    )
    roster = frozenset(i.public for i in ids.values())
    t0 = time.perf_counter()
    for _ in range(clients):
        identity.forget_checks()
        if protocol.count_signers(client, request, roster, signers) != signers:
            raise RuntimeError("a valid signature did not verify")  # the benchmark checks itself
    return (time.perf_counter() - t0) / clients


def run(args: argparse.Namespace) -> int:
    from common.models import adapter_shapes, adapter_size
    from common.privacy.mechanisms.discrete import padded_dim
    from server.evaluation import Evaluator

    ks = [int(k) for k in args.neighbours.split(",") if k.strip()]
    if not ks or min(ks) < 1:
        raise FedloraError(f"--neighbours must be positive integers, got {args.neighbours!r}")
    ns = [int(n) for n in args.round_nodes.split(",") if n.strip()]
    if not ns or min(ns) < 1:
        raise FedloraError(f"--round-nodes must be positive integers, got {args.round_nodes!r}")
    cfg = preset(args.preset, mechanism="dp-fedavg", target_epsilon=args.epsilon).check()
    length = padded_dim(adapter_size(adapter_shapes(Evaluator(cfg).bundle.model)))
    with tempfile.TemporaryDirectory(prefix="fedlora-bench-secagg-") as tmp:
        rounds = round_seconds(args, Path(tmp))
    plain, *secure = ARMS
    result = {
        "preset": args.preset,
        "epsilon": args.epsilon,
        "round_time": rounds,
        "ratios": {label: _ratios(rounds[label], rounds[plain]) for label in secure},
        "protocol": {
            "length": length,
            "bits": args.bits,
            **{str(k): protocol_cost(k, length, args.bits) for k in ks},
        },
        "consistency_check": {str(n): consistency_cost(n) for n in ns},
        "constant_work": CONSTANT_WORK,
        "cpu": os.cpu_count(),
        "command": "fedlora bench secagg "
        + " ".join(
            f"--{k} {v}"
            for k, v in (("preset", args.preset), ("rounds", args.rounds), ("neighbours", args.neighbours))
        ),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    for label, row in rounds.items():
        print(
            f"{label}: {row['seconds_per_round']:.1f} s a round ({row['clients_per_round']:.0f} clients, "
            f"{row['bytes_per_round'] / 1e6:.1f} MB)"
        )
    for label, ratio in result["ratios"].items():
        print(
            f"{label} / plain round time: {ratio['round']:.2f}x ({ratio['per_client']:.2f}x per sampled "
            "client: the arms' cohorts differ)"
        )
    print(CONSTANT_WORK)
    print(f"a client's protocol cost, D = {length} words of {args.bits} bits (ms per client, one thread):")
    for k in ks:
        c = {stage: 1e3 * v for stage, v in result["protocol"][str(k)].items()}
        print(
            f"  k = {k:>2}: setup {c['setup']:.1f}, share {c['share']:.1f}, mask {c['mask']:.1f}, "
            f"check {c['check']:.1f}, unmask {c['unmask']:.1f}; server {c['server']:.1f}"
        )
    print("the active-server check, a majority of n signatures verified by one client (ms, one thread):")
    for n in ns:
        print(f"  n = {n}: {1e3 * result['consistency_check'][str(n)]:.1f}")
    return 0
