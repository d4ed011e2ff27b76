"""From the suite's finished runs to its sections: tables (``columns`` + ``rows``), the commands that
produced them, wall times and notes. Everything here reads the runs' own outputs; nothing is typed in.

Every privacy figure says its unit, threat model, accountant and δ, as the runs' summaries do."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from common.timing import PHASES
from server.bench.suite.plan import Arm
from server.bench.suite.runner import SCORES

#: a rescored run's scores (runner.SCORES): its final adapter's, and the base model's
FINAL, BASE = SCORES

#: where the privacy section's readers find the empirical side
AUDIT_NOTE = (
    "empirical lower bounds: the audit section (`fedlora audit`, its own canaried runs at its own "
    "settings, not these runs)"
)


def mean_std(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.3f} (n = 1)"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _mean(values: Sequence[float | None], fmt: str = ".3f") -> str:
    present = [v for v in values if v is not None]
    return format(statistics.mean(present), fmt) if present else "n/a"


def _delta(privacy: Sequence[dict]) -> object:
    """The δ of an arm's runs (its first run's privacy record; ``n/a`` when not private)."""
    return privacy[0].get("delta", "n/a") if privacy and privacy[0] else "n/a"


def _client_guarantees(done: Sequence[dict], section: str) -> list[str]:
    """One note per distinct client-level guarantee the finished runs of ``section`` state."""
    outputs = [d["output"] for d in done if d["run"].section == section and d["output"]]
    return [f"guarantee: {g}" for g in sorted({s["privacy"] for s in outputs if s.get("client_privacy")})]


def _group(done: Sequence[dict], section: str) -> list[tuple[Arm, list[dict]]]:
    """Runs of ``section`` grouped by arm, in plan order."""
    arms: dict[str, tuple[Arm, list[dict]]] = {}
    for d in done:
        if d["run"].section == section:
            arms.setdefault(d["run"].arm.label, (d["run"].arm, []))[1].append(d)
    return list(arms.values())


def _command(runs: Sequence[dict]) -> str:
    """The arm's command with its first seed, and a comment naming every seed it ran."""
    first = runs[0]["run"]
    seeds = [str(d["run"].seed) for d in runs]
    return " ".join(first.command) + (f"  # seeds {', '.join(seeds)}" if len(seeds) > 1 else "")


def _base(section: str, title: str, runs: Sequence[dict]) -> dict:
    failed = [f"{d['run'].key}: {d['error']}" for d in runs if d["error"]]
    return {
        "name": section,
        "title": title,
        "wall_s": round(sum(d.get("wall_s") or 0 for d in runs), 1),
        "commands": [],
        "columns": [],
        "rows": [],
        "figures": [],
        "notes": [f"failed: {f}" for f in failed],
    }


#: the utility tables' columns; the last one is each section's own
UTILITY_COLUMNS = [
    "arm",
    "seeds",
    "accuracy before",
    "accuracy after (mean ± std)",
    "top-class share",
    "ε (tight: PLD, or RDP where marked)",
    "ε (CLT μ-GDP)",
    "δ",
]


def _rdp_mark(privacy: Sequence[dict]) -> str:
    """`` (RDP)`` when the runs' tight accountant was RDP (Skellam noise: secure aggregation), where
    the CLT μ-GDP beside it is no bound."""
    return " (RDP)" if any(p.get("tight_accountant") == "rdp" for p in privacy) else ""


def _utility(done: Sequence[dict], name: str, title: str, read: Callable[[dict], dict], extra: str) -> dict:
    """One row per arm; ``read`` maps a run's output to ``before``, ``after``, ``top``, ``privacy``
    (``eps_tight``, ``eps_gdp``, ``delta``; empty when not private) and the ``extra`` column's value."""
    sec = _base(name, title, [d for d in done if d["run"].section == name])
    sec["columns"] = [*UTILITY_COLUMNS, extra]
    for arm, group in _group(done, name):
        values = [read(d["output"]) for d in group if d["output"]]
        privacy = [v["privacy"] for v in values]
        sec["commands"].append(_command(group))
        sec["rows"].append(
            {
                "arm": arm.label,
                "seeds": len(values),
                "accuracy before": _mean([v["before"] for v in values]),
                "accuracy after (mean ± std)": mean_std([v["after"] for v in values]),
                "top-class share": _mean([v["top"] for v in values]),
                "ε (tight: PLD, or RDP where marked)": _mean([p.get("eps_tight") for p in privacy], ".2f")
                + _rdp_mark(privacy),
                "ε (CLT μ-GDP)": _mean([p.get("eps_gdp") for p in privacy], ".2f"),
                "δ": _delta(privacy),
                extra: _mean([v["extra"] for v in values], ".2f"),
                "_target": arm.target_epsilon,
                "_after": [v["after"] for v in values],
            }
        )
    return sec


def _federation(s: dict) -> dict:
    """A classification federation's ``simulate`` summary, as :func:`_utility` reads it."""
    return {
        "before": s["before"]["accuracy"],
        "after": s["after"]["accuracy"],
        "top": s["after"].get("top_class_share"),
        "privacy": s.get("client_privacy") or {},
        "extra": s.get("bytes_up_per_round", 0) / 1e6,
    }


def client_level(done: Sequence[dict]) -> dict:
    sec = _utility(
        done,
        "client-level",
        "Utility under client-level DP (cross-device federations)",
        _federation,
        "up per round (MB)",
    )
    sec["notes"] += _client_guarantees(done, "client-level")
    return sec


def _paired(rows: Sequence[dict], done: Sequence[dict], section: str) -> list[str]:
    """For each budget, the first arm at that ε against every other arm at it: the accuracy difference
    in points, seed by seed (the seeds both ran), its mean ± std and standard error."""
    by_arm = {
        arm.label: {d["run"].seed: d["output"]["after"]["accuracy"] for d in group if d["output"]}
        for arm, group in _group(done, section)
    }
    notes = []
    for eps in dict.fromkeys(r["_target"] for r in rows if r["_target"] is not None):
        first, *others = [r["arm"] for r in rows if r["_target"] == eps]
        for other in others:
            seeds = sorted(set(by_arm[first]) & set(by_arm[other]))
            diffs = [100 * (by_arm[first][s] - by_arm[other][s]) for s in seeds]
            if not diffs:
                continue
            each = ", ".join(f"{d:+.1f}" for d in diffs)
            spread = (
                f"; mean {statistics.mean(diffs):+.1f} ± {statistics.stdev(diffs):.1f}, "
                f"standard error {statistics.stdev(diffs) / math.sqrt(len(diffs)):.1f}"
                if len(diffs) > 1
                else ""
            )
            notes.append(f"{first} − {other}, points by seed ({', '.join(map(str, seeds))}): {each}{spread}")
    return notes


def _per_run(done: Sequence[dict], section: str) -> list[str]:
    """One line per finished run of ``section``, in plan order: its arm and seed, held-out accuracy
    after the last round, the frozen base's precision where recorded, its whole wall time (every
    session of a resumed run) and when and at which commit it was made: the runs behind each mean."""
    lines = []
    for arm, group in _group(done, section):
        for d in group:
            if not d["output"]:
                continue
            made = d.get("made") or {}
            precision = d["output"].get("precision")
            lines.append(
                f"run {d['run'].key} ({arm.label}, seed {d['run'].seed}): "
                f"{d['output']['after']['accuracy']:.3f} after the last round"
                + (f", {precision} base" if precision else "")
                + f", {d.get('wall_s') or 0:,.0f} s"
                + (f", made {made['date']} at {made['commit']}" if made else "")
            )
    return lines


def correlated_noise(done: Sequence[dict]) -> dict:
    """Banded matrix-factorization DP-FTRL against DP-FedAvg charged under the same participation rule
    and against amplified DP-FedAvg (issue 51): the accuracy table, and each budget's first arm
    against the others seed by seed (the claim is a paired one)."""
    sec = _utility(
        done,
        "correlated-noise",
        "Correlated noise: banded matrix-factorization DP-FTRL against DP-FedAvg (cross-device)",
        _federation,
        "up per round (MB)",
    )
    sec["notes"] += _paired(sec["rows"], done, "correlated-noise")
    sec["notes"] += _per_run(done, "correlated-noise")
    sec["notes"] += _client_guarantees(done, "correlated-noise")
    return sec


def sample_level(done: Sequence[dict]) -> dict:
    def read(r: dict) -> dict:
        p = r["privacy"]
        private = p.get("epsilon") is not None
        return {
            "before": r["before"],
            "after": r["accuracy"],
            "top": r.get("top_class_share"),
            "privacy": {"eps_tight": p["epsilon"], "eps_gdp": p["eps_gdp"], "delta": p["delta"]}
            if private
            else {},
            "extra": r.get("examples_per_second"),
        }

    sec = _utility(
        done, "sample-level", "Utility under sample-level DP (one node, `train-local`)", read, "examples / s"
    )
    outputs = [d["output"] for d in done if d["run"].section == "sample-level" and d["output"]]
    units = {
        f"{p['unit']}; {p['threat_model']}; {p['accountant']}"
        for r in outputs
        if (p := r["privacy"]).get("epsilon") is not None
    }
    sec["notes"] += [f"guarantee: {u}" for u in sorted(units)]
    return sec


#: the generative table's columns
GENERATIVE_COLUMNS = [
    "arm",
    "seeds",
    "perplexity before",
    "perplexity after (mean ± std)",
    "log-perplexity drop (mean ± std)",
    "share of the non-private drop (same seed)",
    "ε (PLD)",
    "δ",
    "communication (GB, total)",
    "min / round",
    "peak RSS (GB)",
]


def _log_drop(summary: dict) -> float:
    """ln(perplexity before) − ln(perplexity after): the drop of the mean next-token loss (nats)."""
    return summary["before"]["loss"] - summary["after"]["loss"]


def _baseline_drops(
    groups: Sequence[tuple[Arm, list[dict]]], drop: Callable[[dict], float]
) -> dict[int, float]:
    """seed -> ``drop`` (log-perplexity drop, nats) of that seed's run of the arm with no budget (the
    non-private baseline); an arm with ``--node`` (one node alone) is never the baseline."""
    return {
        d["run"].seed: drop(d["output"])
        for arm, group in groups
        if arm.target_epsilon is None and arm.argv[:1] != ("--node",)
        for d in group
        if d["output"]
    }


def _clear_gain(gains: Sequence[float]) -> bool:
    """Whether the non-private seeds' ``gains`` are clearly positive: their mean more than two
    standard errors above zero (one seed: above zero). Three seeds of +0.009, -0.026 and +0.020 have
    a mean of +0.001: a share of that would be a ratio to noise."""
    if len(gains) < 2:
        return bool(gains) and gains[0] > 0
    return statistics.mean(gains) > 2 * statistics.stdev(gains) / math.sqrt(len(gains))


def _shares(
    arm: Arm, finished: Sequence[dict], drop: Callable[[dict], float], baseline: dict[int, float]
) -> list[float]:
    """Each finished private seed's ``drop`` over the non-private ``baseline`` of the same seed."""
    if arm.target_epsilon is None:
        return []
    return [drop(d["output"]) / baseline[d["run"].seed] for d in finished if baseline.get(d["run"].seed)]


def _lm_section(done: Sequence[dict], name: str, title: str, unit: str) -> dict:
    """Causal-LM federations of section ``name``: held-out-user perplexity per arm, and each private
    seed's log-perplexity drop as a share of the non-private run's of the same seed (the arm with no
    budget); ``unit``: what a held-out user is."""
    sec = _base(name, title, [d for d in done if d["run"].section == name])
    sec["columns"] = GENERATIVE_COLUMNS
    groups = _group(done, name)
    baseline = _baseline_drops(groups, _log_drop)
    for arm, group in groups:
        finished = [d for d in group if d["output"]]
        outs = [d["output"] for d in finished]
        shares = _shares(arm, finished, _log_drop, baseline)
        privacy = [s.get("client_privacy") or {} for s in outs]
        sec["commands"].append(_command(group))
        sec["rows"].append(
            {
                "arm": arm.label,
                "seeds": len(outs),
                "perplexity before": _mean([s["before"]["perplexity"] for s in outs], ".2f"),
                "perplexity after (mean ± std)": mean_std([s["after"]["perplexity"] for s in outs]),
                "log-perplexity drop (mean ± std)": mean_std([_log_drop(s) for s in outs]),
                "share of the non-private drop (same seed)": mean_std(shares) if shares else "n/a",
                "ε (PLD)": _mean([p.get("eps_tight") for p in privacy], ".2f")
                + (" (what-if)" if any(p.get("what_if") for p in privacy) else ""),
                "δ": _delta(privacy),
                "communication (GB, total)": _mean([_total_gb(s) for s in outs], ".2f"),
                "min / round": _minutes_per_round(outs),
                "peak RSS (GB)": _mean(
                    [d["peak_rss_mb"] / 1024 if d.get("peak_rss_mb") else None for d in finished], ".1f"
                ),
            }
        )
    sec["notes"] += _client_guarantees(done, name)
    sec["notes"].append(
        f"perplexity of held-out {unit} (users never seen in training), before: the untrained adapter; "
        "a share is the private run's log-perplexity drop over the non-private run's of the same seed"
    )
    return sec


def _total_gb(summary: dict) -> float:
    """A federation's bytes, down and up, over all its rounds (GB: 10^9 bytes, as FlowerTune counts)."""
    per_round = summary.get("bytes_down_per_round", 0) + summary.get("bytes_up_per_round", 0)
    return per_round * summary.get("rounds_completed", 0) / 1e9


def _minutes_per_round(outs: Sequence[dict]) -> str:
    return _mean(
        [s["wall_time_s"] / 60 / s["rounds_completed"] for s in outs if s.get("rounds_completed")], ".1f"
    )


def generative(done: Sequence[dict]) -> dict:
    """SmolLM2 on Shakespeare roles (:func:`_lm_section`)."""
    title = "Generative fine-tuning under user-level DP (SmolLM2, Shakespeare roles)"
    return _lm_section(done, "generative", title, "roles")


def chat(done: Sequence[dict]) -> dict:
    """The DP track's chat half: SmolLM2-Instruct on chitchat senders (:func:`_lm_section`)."""
    title = "DP track, chat: SmolLM2-Instruct on chitchat, one client per sender (user-level DP)"
    return _lm_section(done, "chat", title, "senders, each on their side of their conversations,")


#: the DP track's multiple-choice table: FlowerTune's columns (score, communication) with the
#: privacy ones beside
INSTRUCTION_COLUMNS = [
    "arm",
    "seeds",
    "held-out items",
    "accuracy of the base model",
    "accuracy after (mean ± std)",
    "gain over the base (mean ± std)",
    "share of the non-private gain (same seed)",
    "exact match, generated (base → after)",
    "acc_norm after",
    "answers' perplexity (base → after)",
    "share of the non-private answer log-perplexity drop",
    "ε (PLD)",
    "δ",
    "communication (GB, total)",
    "up per client and round (MB)",
    "min / round",
]


def _gain(summary: dict) -> float:
    """Held-out mean accuracy after the run minus the untrained adapter's (the base model's)."""
    return summary["after"]["accuracy"] - summary["before"]["accuracy"]


def _per_set(outs: Sequence[dict], when: str) -> dict[str, float]:
    """Each set's held-out accuracy, ``when`` (``before`` or ``after``), averaged over ``outs``."""
    names = sorted({k for s in outs for k in s[when] if k.startswith("accuracy/")})
    return {k.split("/", 1)[1]: statistics.mean(s[when][k] for s in outs if k in s[when]) for k in names}


def instruction(done: Sequence[dict]) -> dict:
    """The DP track on the multiple-choice benchmark: per arm, held-out accuracy (log-likelihood of
    each option, every set weighing the same) of the base model and after the run, the gain and its
    share of the non-private run's gain of the same seed, exact match of generated answers, ε,
    communication; a note per arm with each set's accuracy."""
    name = "instruction"
    title = "DP track, instruction tuning: SmolLM2-Instruct on the packaged multiple-choice sets"
    sec = _base(name, title, [d for d in done if d["run"].section == name])
    sec["columns"] = INSTRUCTION_COLUMNS
    for family in _families(_group(done, name)):  # cross-device, then cross-silo: each its own baseline
        _instruction_rows(sec, family)
    sec["notes"] += _client_guarantees(done, name)
    sec["notes"] += _sample_guarantees(done, name)
    rescored = next((d["run"] for d in done if d["run"].section == name and d["run"].rescore), None)
    again = (
        f"an arm whose every seed was scored again (`{' '.join(rescored.rescore_command(False))}`, RUN: the "
        f"run's directory; the base model by the same command with --base) shows all of them, the same "
        f"for every seed and arm; otherwise "
        if rescored
        else ""
    )
    sec["notes"].append(
        "held-out items of each set only (fixed by a hash of the item, whatever the seed); "
        f"{again}a run's figures are its own, on a seeded subset of them, the same for every arm of a "
        "seed; base: the untrained adapter on the same items; a share is the private run's gain (or "
        "drop of the gold answers' log-perplexity) over the non-private run's of the same seed, the "
        "same federation (cross-device or silo) and the same items; ε: client-level, or for a silo the "
        "largest node's sample-level ε"
    )
    return sec


def _scored_again(groups: Sequence[tuple[Arm, list[dict]]]) -> list[tuple[Arm, list[dict]]]:
    """One federation's arms, an arm whose every finished run was scored again (runner.SCORES) with
    those scores as its runs' ``before`` (the federation's base-model score: the same items and model
    whatever the run) and ``after``; an arm with a seed not yet scored keeps its runs' own figures,
    so no row mixes the two."""
    base = next((d["scores"][BASE] for _, g in groups for d in g if BASE in (d.get("scores") or {})), None)
    out = []
    for arm, group in groups:
        finished = [d for d in group if d["output"]]
        if base is not None and finished and all(FINAL in (d.get("scores") or {}) for d in finished):
            group = [
                {**d, "output": _with_scores(d["output"], base, d["scores"][FINAL])} if d["output"] else d
                for d in group
            ]
        out.append((arm, group))
    return out


def _with_scores(summary: dict, base: dict, final: dict) -> dict:
    """``summary`` with its held-out figures those of ``fedlora evaluate`` (``base``: of the base model)."""
    return {
        **summary,
        "before": base["metrics"],
        "after": final["metrics"],
        "eval_examples": final["eval_examples"],
    }


def _families(groups: Sequence[tuple[Arm, list[dict]]]) -> list[list[tuple[Arm, list[dict]]]]:
    """``groups`` by the plan key of their runs (``instruction``, ``instruction-silo``), in order."""
    out: dict[str, list[tuple[Arm, list[dict]]]] = {}
    for arm, group in groups:
        out.setdefault(group[0]["run"].key.rsplit("-", 2)[0], []).append((arm, group))
    return list(out.values())


def _instruction_rows(sec: dict, groups: Sequence[tuple[Arm, list[dict]]]) -> None:
    """:func:`instruction`'s rows and per-set notes of one federation's arms."""
    # a share of a non-private gain that is not clearly positive means nothing: no share unless the
    # non-private arm's mean gain stands clear of its seeds' spread (:func:`_clear_gain`), and none
    # of a seed where it did not gain
    groups = _scored_again(groups)
    gains = _baseline_drops(groups, _gain)
    baseline = {seed: g for seed, g in gains.items() if g > 0} if _clear_gain(list(gains.values())) else {}
    answer_baseline = _baseline_drops(groups, _log_drop)
    baseline_items = sorted(
        {
            d["output"].get("eval_examples", 0)
            for arm, g in groups
            if arm.target_epsilon is None
            for d in g
            if d["output"]
        }
    )
    for arm, group in groups:
        finished = [d for d in group if d["output"]]
        outs = [d["output"] for d in finished]
        items = sorted({s.get("eval_examples", 0) for s in outs})
        comparable = items == baseline_items  # a share of a gain on other items is no share
        shares = _shares(arm, finished, _gain, baseline) if comparable else []
        answer_shares = _shares(arm, finished, _log_drop, answer_baseline) if comparable else []
        privacy = [s.get("client_privacy") or {} for s in outs]
        sec["commands"].append(_command(group))
        exact = [_mean([s[w].get("exact_match") for s in outs]) for w in ("before", "after")]
        answers = [_mean([s[w]["perplexity"] for s in outs], ".3f") for w in ("before", "after")]
        sec["rows"].append(
            {
                "arm": arm.label,
                "seeds": len(outs),
                "held-out items": ", ".join(str(n) for n in items if n) or "n/a",
                "accuracy of the base model": _mean([s["before"]["accuracy"] for s in outs]),
                "accuracy after (mean ± std)": mean_std([s["after"]["accuracy"] for s in outs]),
                "gain over the base (mean ± std)": mean_std([_gain(s) for s in outs]),
                "share of the non-private gain (same seed)": mean_std(shares)
                if shares
                else (_no_share(gains, comparable) if arm.target_epsilon is not None and outs else "n/a"),
                "exact match, generated (base → after)": " → ".join(exact),
                "acc_norm after": _mean([s["after"].get("acc_norm") for s in outs]),
                "answers' perplexity (base → after)": " → ".join(answers),
                "share of the non-private answer log-perplexity drop": mean_std(answer_shares)
                if answer_shares
                else "n/a",
                **_instruction_privacy(outs, privacy),
                "communication (GB, total)": _mean([_total_gb(s) for s in outs], ".2f"),
                "up per client and round (MB)": _mean([_mb_per_reply(d) for d in finished], ".2f"),
                "min / round": _minutes_per_round(outs),
            }
        )
        if outs:
            before, after = _per_set(outs, "before"), _per_set(outs, "after")
            sets = ", ".join(f"{k} {before.get(k, math.nan):.2f} → {v:.2f}" for k, v in after.items())
            sec["notes"].append(f"{arm.label}, accuracy per set (base → after, mean over seeds): {sets}")


def _instruction_privacy(outs: Sequence[dict], privacy: Sequence[dict]) -> dict[str, object]:
    """The ε and δ columns of an instruction row: client-level, or for a silo its largest node's
    sample-level ε (:func:`_lm_record`)."""
    if any(privacy):
        return {"ε (PLD)": _mean([p.get("eps_tight") for p in privacy], ".2f"), "δ": _delta(privacy)}
    records = [_lm_record(s) for s in outs]
    private = [r for r in records if r[2] is not None]
    return {"ε (PLD)": _mean([r[2] for r in records], ".2f"), "δ": private[0][3] if private else "n/a"}


def _no_share(gains: dict[int, float], comparable: bool) -> str:
    """Why a private arm has no share of the non-private gain: no non-private run of its federation
    yet, scored on other held-out items than it, or no clear gain (:func:`_clear_gain`)."""
    if not gains:
        return "n/a: no non-private run yet"
    return (
        "n/a: no clear non-private gain" if comparable else "n/a: not scored on the non-private arm's items"
    )


def _sample_guarantees(done: Sequence[dict], section: str) -> list[str]:
    """One note per distinct sample-level guarantee the finished runs of ``section`` state."""
    outputs = [d["output"] for d in done if d["run"].section == section and d["output"]]
    return [
        f"guarantee: {g}" for g in sorted({o["sample_privacy"] for o in outputs if o.get("node_privacy")})
    ]


#: the cross-silo table's columns
CROSS_SILO_COLUMNS = [
    "arm",
    "seeds",
    "perplexity before",
    "perplexity after (mean ± std)",
    "log-perplexity drop (mean ± std)",
    "share of the non-private drop (same seed)",
    "seeds below every node alone",
    "ε per node (PLD)",
    "δ",
    "min / run",
]


def _silo_drop(output: dict) -> float:
    """ln(perplexity before / after) of a ``simulate`` summary or a ``train-local`` result (nats)."""
    before, after, *_ = _lm_record(output)
    return math.log(before / after)


def _lm_record(output: dict) -> tuple[float, float, float | None, object]:
    """(perplexity before, after, sample-level ε, δ) of a ``simulate`` summary (ε: the largest node's)
    or a ``train-local`` result (``before`` / ``perplexity``, its ``privacy``); ε None: not private."""
    if isinstance(output.get("after"), dict):  # simulate: a non-private run has no node ledgers
        nodes = output.get("node_privacy") or []
        eps = max((n["eps_tight"] for n in nodes), default=None)
        return (
            output["before"]["perplexity"],
            output["after"]["perplexity"],
            eps,
            (nodes or [{}])[0].get("delta", "n/a"),
        )
    priv = output.get("privacy") or {}
    return output["before"], output["perplexity"], priv.get("epsilon"), priv.get("delta", "n/a")


def cross_silo(done: Sequence[dict]) -> dict:
    """Cross-silo federations (a node holds one play or several, sample-level DP per node) beside each
    node trained alone (``train-local --node K``, same split, method, budget and steps), on the same
    held-out roles: a federated arm's seed counts when its perplexity is below every node's alone, same
    seed; a private arm's share is its log-perplexity drop over the non-private federation's, same seed."""
    runs = [d for d in done if d["run"].section == "cross-silo"]
    sec = _base(
        "cross-silo",
        "Cross-silo generative fine-tuning: Shakespeare plays held by silos, sample-level DP",
        runs,
    )
    sec["columns"] = CROSS_SILO_COLUMNS
    groups = []  # (arm, its runs, the finished ones, their records, whether the arm is a node alone)
    for arm, group in _group(done, "cross-silo"):
        finished = [d for d in group if d["output"]]
        records = [_lm_record(d["output"]) for d in finished]
        groups.append((arm, group, finished, records, arm.argv[:1] == ("--node",)))
    alone: dict[int, list[float]] = {}  # seed -> each node's perplexity alone
    for *_, finished, records, solo in groups:
        for d, record in zip(finished, records, strict=True):
            if solo:
                alone.setdefault(d["run"].seed, []).append(record[1])
    nodes = sum(1 for *_, solo in groups if solo)
    complete = {s: min(v) for s, v in alone.items() if len(v) == nodes}
    baseline = _baseline_drops([(arm, group) for arm, group, *_ in groups], _silo_drop)
    for arm, group, finished, records, solo in groups:
        shares = _shares(arm, finished, _silo_drop, baseline)
        beats = [
            after < complete[d["run"].seed]
            for d, (_, after, *_) in zip(finished, records, strict=True)
            if d["run"].seed in complete
        ]
        sec["commands"].append(_command(group))
        sec["rows"].append(
            {
                "arm": arm.label,
                "seeds": len(records),
                "perplexity before": _mean([r[0] for r in records], ".2f"),
                "perplexity after (mean ± std)": mean_std([r[1] for r in records]),
                "log-perplexity drop (mean ± std)": mean_std([_silo_drop(d["output"]) for d in finished]),
                "share of the non-private drop (same seed)": mean_std(shares) if shares else "n/a",
                "seeds below every node alone": f"{sum(beats)} / {len(beats)}"
                if nodes and not solo
                else "n/a",
                "ε per node (PLD)": _mean([r[2] for r in records], ".2f"),
                "δ": records[0][3] if records and records[0][2] is not None else "n/a",
                "min / run": _mean([d["wall_s"] / 60 if d.get("wall_s") else None for d in finished], ".1f"),
            }
        )
    sec["notes"] += _sample_guarantees(runs, "cross-silo")
    sec["notes"].append(
        "perplexity of held-out roles (users never seen in training) after the last round or step; "
        "before: the untrained adapter; a node alone is one node's shard with the same local steps; a "
        "share is a private run's (a node alone's) log-perplexity drop over the non-private federation's of "
        "the same seed"
    )
    return sec


#: the sections whose runs spend a client-level budget (the privacy table's, with sample-level)
CLIENT_LEVEL = ("client-level", "generative", "instruction", "chat")
#: what a client is, where it is a user
USERS = {
    "generative": "; a client is one user (a role)",
    "chat": "; a client is one user (a sender: their side of their conversations)",
}


def privacy(done: Sequence[dict]) -> dict:
    """Per private run (seed 0 of each arm): μ, ε_gdp, ε_tight; ε by round for the client-level runs."""
    runs = [d for d in done if d["run"].section in (*CLIENT_LEVEL, "sample-level") and d["output"]]
    sec = _base("privacy", "Privacy: what each private run spent", [])
    sec["columns"] = [
        "run",
        "unit",
        "threat model",
        "δ",
        "μ",
        "ε (CLT μ-GDP)",
        "ε (PLD)",
    ]
    for d in runs:
        run, out = d["run"], d["output"]
        if run.seed != min(x["run"].seed for x in runs if x["run"].arm == run.arm):
            continue
        if run.section != "sample-level":
            p = out.get("client_privacy")
            if not p:
                continue
            unit = f"{p.get('what_if', '')}client-level ({p.get('relation', 'add/remove')} one client)"
            unit += USERS.get(run.section, "")
            threat = out["privacy"].split("; ")[-1]
        else:
            p = out["privacy"]
            if p.get("epsilon") is None:
                continue
            unit, threat = p["unit"], p["threat_model"]
        sec["rows"].append(
            {
                "run": run.arm.label,
                "unit": unit,
                "threat model": threat,
                "δ": p.get("delta"),
                "μ": f"{p['mu']:.4g}",
                "ε (CLT μ-GDP)": f"{p['eps_gdp']:.3f}",
                "ε (PLD)": f"{p.get('eps_tight', p.get('epsilon')):.3f}",
            }
        )
    sec["notes"] += [
        "each private arm's first seed, from the utility runs above (their commands); ε after the last round",
        AUDIT_NOTE,
    ]
    sec["by_round"] = {
        d["run"].arm.label: _eps_by_round(Path(d["dir"]) / "metrics.jsonl")
        for d in runs
        if d["run"].section != "sample-level" and d["run"].arm.target_epsilon and d["run"].seed == 0
    }
    return sec


def audit(done: Sequence[dict]) -> dict:
    """One row per audited arm of every ``fedlora audit`` run: its claim beside what the attack shows."""
    runs = [d for d in done if d["run"].section == "audit"]
    sec = _base("audit", "Empirical privacy audits (canaries against the real training code)", runs)
    sec["columns"] = [
        "audit",
        "arm",
        "unit",
        "claimed ε (PLD, or RDP where marked)",
        "δ",
        "AUC",
        "ε lower bound",
        "ε estimate (one-shot)",
        "canaries",
    ]
    for d in runs:
        if not d["output"]:
            continue
        sec["commands"].append(_command([d]))
        for arm in d["output"]:
            claimed = arm.get("epsilon")
            sec["rows"].append(
                {
                    "audit": d["run"].argv[1],
                    "arm": arm["arm"],
                    "unit": arm["unit"],
                    "claimed ε (PLD, or RDP where marked)": "none (not private)"
                    if claimed is None
                    else f"{claimed:.2f}" + (" (RDP)" if arm.get("accountant", "").startswith("rdp") else ""),
                    "δ": arm["delta"],
                    "AUC": f"{arm['auc']:.3f}",
                    "ε lower bound": f"{arm['eps_lower_bound']:.2f} ({arm['confidence']:.0%})",
                    "ε estimate (one-shot)": _mean([arm.get("eps_estimate")], ".2f"),
                    "canaries": arm.get("canaries", "n/a"),
                }
            )
    sec["notes"].append(
        "a lower bound above the claimed ε would be a broken guarantee; the no-noise arm must show a "
        "positive bound (the attack works). docs/privacy.md explains each audit"
    )
    return sec


def _eps_by_round(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [  # each round's tight accountant as the run named it (RDP for Skellam noise, else PLD)
        {
            "round": r["round"],
            "eps_gdp": r["eps_gdp"],
            "eps_tight": r["eps_tight"],
            "tight": r.get("tight_accountant", "pld").upper(),
        }
        for r in lines
        if "eps_tight" in r
    ]


def _rounds(path: Path) -> list[dict]:
    """The train-round lines of a run's metrics.jsonl (none if it is missing)."""
    if not path.exists():
        return []
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [r for r in lines if "bytes_up" in r]


def _replies(path: Path) -> int:
    return sum(r.get("replied", 0) for r in _rounds(path))


def _bytes_per_reply(path: Path) -> float | None:
    """Bytes a client sends per round: the run's uploaded bytes over its replies."""
    replies = _replies(path)
    return sum(r["bytes_up"] for r in _rounds(path)) / replies if replies else None


def _mb_per_reply(d: dict) -> float | None:
    """:func:`_bytes_per_reply` of a finished run, in MB."""
    per_reply = _bytes_per_reply(Path(d["dir"]) / "metrics.jsonl")
    return per_reply / 1e6 if per_reply is not None else None


def communication(done: Sequence[dict]) -> dict:
    """Bytes per round of each client-level arm (seed means) and, from ``bench codec``, each codec's
    bytes per client with its reconstruction of real increments."""
    codec = [d for d in done if d["run"].section == "communication"]
    sec = _base("communication", "Communication: bytes per round and per codec", codec)
    sec["columns"] = ["what", "bytes per client per round", "compression", "cosine (no noise)", "cosine (DP)"]
    for arm, group in _group(done, "client-level"):
        per_client = [_bytes_per_reply(Path(d["dir"]) / "metrics.jsonl") for d in group if d["output"]]
        sec["rows"].append(
            {
                "what": f"{arm.label}: reply",
                "bytes per client per round": _mean(per_client, ",.0f"),
                "compression": "",
                "cosine (no noise)": "",
                "cosine (DP)": "",
            }
        )
    for d in codec:
        out = d["output"]
        sec["commands"].append(" ".join(d["run"].command))
        if not out:
            continue
        order = "aggregate-then-decode"
        for name in dict.fromkeys(r["codec"] for r in out["records"]):
            recs = {r["noise"]: r for r in out["records"] if r["codec"] == name and r["order"] == order}
            clean = recs.get("none") or next(iter(recs.values()))
            noisy = next((r for n, r in recs.items() if n.startswith("eps=")), None)
            sec["rows"].append(
                {
                    "what": f"codec {name} (D = {out['factor_coords']:,}, {order})",
                    "bytes per client per round": f"{clean['bytes']:,}",
                    "compression": "∞" if clean["compression"] is None else f"{clean['compression']:.1f}×",
                    "cosine (no noise)": f"{clean['cosine']:.3f}",
                    "cosine (DP)": f"{noisy['cosine']:.3f} ({noisy['noise']})" if noisy else "n/a",
                }
            )
        sec["notes"].append(
            f"codec bytes: float32 latent of the LoRA factors only; the DP column is the local threat "
            f"model at client-level ε = {out['epsilon']:g}, δ = {out['delta']:g} over {out['rounds']} rounds"
        )
    return sec


def speed(done: Sequence[dict]) -> dict:
    """PRISM vs dp-adamw step (``bench prism-step``) and each client-level arm's round time split;
    whether any time is a GPU's is read from the runs' own stamps, not from the machine that writes
    the report (a report regenerated from records elsewhere says the same)."""
    step = [d for d in done if d["run"].section == "speed"]
    sec = _base("speed", "Speed: DP steps and where a round's time goes", step)
    sec["columns"] = ["what", "seconds", "share / ratio"]
    for d in step:
        out = d["output"]
        sec["commands"].append(" ".join(d["run"].command))
        if not out:
            continue
        arms = (("plain step", "plain"), ("prism step", "prism"), ("dp-adamw step", "dp_adamw"))
        for label, key in (arm for arm in arms if arm[1] in out):  # stored outputs before issue 54: no plain
            sec["rows"].append(
                {
                    "what": f"{label} ({out['model']}, batch {out['batch']} × {out['seq']}, {out['device']})",
                    "seconds": f"{out[key]['seconds']:.4f}",
                    "share / ratio": "",
                }
            )
        ratio = f"{out['time_ratio']:.2f}× time"
        if "ops_ratio" in out:  # stored outputs from before issue 36 lack the op counts
            ratio += f", {out['ops_ratio']:.2f}× aten ops"
        sec["rows"].append({"what": "prism / dp-adamw", "seconds": "", "share / ratio": ratio})
        for key, label in (("prism", "prism / plain"), ("dp_adamw", "dp-adamw / plain")):
            versus = out.get("over_plain", {}).get(key)
            if versus:
                sec["rows"].append(
                    {
                        "what": label,
                        "seconds": "",
                        "share / ratio": f"{versus['time']:.2f}× time, {versus['memory']:.2f}× peak memory",
                    }
                )
    for arm, group in _group(done, "client-level"):
        first = next((d for d in group if d["output"] and d["output"].get("time_split_s")), None)
        if first is None:
            continue
        split = first["output"]["time_split_s"]
        total = sum(split.values()) or 1.0
        for name in sorted(split, key=lambda n: PHASES.index(n) if n in PHASES else len(PHASES)):
            seconds = split[name]
            sec["rows"].append(
                {
                    "what": f"{arm.label}: {name}",
                    "seconds": f"{seconds:.1f}",
                    "share / ratio": f"{seconds / total:.0%}",
                }
            )
        replies = _replies(Path(first["dir"]) / "metrics.jsonl")
        if replies and split.get("encode", 0) > 0:  # the client-side release: clip, noise, encode
            per = split["encode"] / replies
            sec["rows"].append(
                {
                    "what": f"{arm.label}: release per reply (clip, noise, encode; {replies} replies)",
                    "seconds": f"{per:.4f}",
                    "share / ratio": f"{1 / per:,.0f} replies / s",
                }
            )
    timed = [d for d in done if d["run"].section in ("speed", "client-level")]
    if not any((d.get("made") or {}).get("device", "").startswith("cuda") for d in timed):
        sec["notes"].append(
            "GPU timings: not produced (no run here was made on a GPU); every time here is CPU"
        )
    sec["notes"].append(
        "round split: seconds summed over the seed-0 run's rounds in one process (`fedlora simulate`); "
        "the rest of a round's time is messaging and checkpoints; the release per reply is a codec's "
        "throughput"
    )
    return sec


def scale(done: Sequence[dict]) -> dict:
    runs = [d for d in done if d["run"].section == "scale"]
    sec = _base("scale", "Scale: per-client time and memory as the population grows", runs)
    sec["columns"] = ["nodes", "round s", "per-client s", "per-client ratio", "peak RSS MB", "RSS ratio"]
    for d in runs:
        sec["commands"].append(" ".join(d["run"].command))
        for r in (d["output"] or {}).get("rows", []):
            sec["rows"].append(
                {
                    "nodes": f"{r['population']:,}",
                    "round s": f"{r['round_s']:.2f}",
                    "per-client s": f"{r['client_s']:.3f}",
                    "per-client ratio": f"{r['client_s_ratio']:.2f}",
                    "peak RSS MB": f"{r['peak_rss_mb']:.0f}" if r.get("peak_rss_mb") else "n/a",
                    "RSS ratio": f"{r['peak_rss_ratio']:.2f}" if r.get("peak_rss_ratio") else "n/a",
                }
            )
    return sec


#: section name -> builder
BUILDERS: dict[str, Callable[..., dict]] = {
    "client-level": client_level,
    "correlated-noise": correlated_noise,
    "sample-level": sample_level,
    "generative": generative,
    "cross-silo": cross_silo,
    "instruction": instruction,
    "chat": chat,
    "privacy": privacy,
    "communication": communication,
    "speed": speed,
    "scale": scale,
    "audit": audit,
}
