"""The end-of-run summary as the console prints it, and the data a run actually used, counted from
its metrics lines (:func:`data_used`)."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: reasons kept per kind in a summary (the metrics lines hold every one)
MAX_REASONS = 10
REASON_CHARS = 160
_FLOWER_ERROR = re.compile(r"^<class '([\w.]+)'>:<'(.*?)(?:'>)?$")  # Flower's "<class 'E'>:<'msg'>"
_PATH = re.compile(r"(?<![\w.~-])(?:/|[A-Za-z]:\\)(?:[^\s'\"/\\]+[/\\])*([^\s'\"/\\]+)[/\\]?")
_OWN_ERRORS = ("FedloraError", "common.errors.FedloraError")  # one-line errors: the message says it all


def one_line(reason: str, limit: int = REASON_CHARS) -> str:
    """A rejected reply's reason as a summary (and the model card) states it: one line, at most
    ``limit`` characters, without the validator's ``client error:`` and the exception wrapping of a
    node's error reply (its message is the node's own one line, e.g. ``node policy: ...``), and with
    every absolute path cut to its base name."""
    text = " ".join(str(reason).split()).removeprefix("client error: ")
    if match := _FLOWER_ERROR.match(text):
        kind, message = match.groups()
        text = message if kind in _OWN_ERRORS else f"{kind.rsplit('.', 1)[-1]}: {message}"
    for kind in _OWN_ERRORS:
        text = text.removeprefix(f"{kind}: ")
    text = _PATH.sub(lambda m: m.group(1), text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_error_reply(reason: str) -> bool:
    """Whether a rejected reply's reason is a node's error reply (a refusal or a failure), not a
    reply the server's validation rejected (common/wire.py)."""
    return str(reason).startswith("client error:")


def data_used(lines: Iterable[dict]) -> dict:
    """The summary's account of the data a run used, over its train rounds' metrics lines
    (server.round.RoundRecord), in distinct nodes: ``nodes_sampled`` (every node that answered, was
    refused or dropped out), ``nodes_own_data`` (trained on its own data file), ``nodes_partition_data``
    (on its partition of the run's dataset), ``nodes_unstated_data`` (a usable reply that did not
    say), ``nodes_refused`` with ``refusals`` (an error reply, e.g. a node-policy refusal),
    ``nodes_rejected`` with ``rejections`` (a reply the server's validation rejected) and
    ``nodes_silent`` (sampled, never answered); reasons distinct, :func:`one_line` each. A node may
    count under several (refused in one round, trained in another). Lines written before these
    fields count as far as they go."""
    sources: dict[str, set[int]] = {"own": set(), "partition": set(), "unstated": set()}
    refused, rejected, dropped = set(), set(), set()
    refusals: dict[str, None] = {}
    rejections: dict[str, None] = {}
    for line in lines:
        if line.get("phase") != "train":
            continue
        for source, nodes in (line.get("data_sources") or {}).items():
            sources.setdefault(source, set()).update(nodes)
        reasons, nodes = line.get("rejected") or [], line.get("rejected_nodes") or []
        for k, reason in enumerate(reasons):
            error = is_error_reply(reason)
            (refusals if error else rejections)[one_line(reason)] = None
            if k < len(nodes):
                (refused if error else rejected).add(nodes[k])
        dropped.update(line.get("dropouts") or [])
    used = set().union(*sources.values())
    return {
        "nodes_sampled": len(used | refused | rejected | dropped),
        "nodes_own_data": len(sources["own"]),
        "nodes_partition_data": len(sources["partition"]),
        "nodes_unstated_data": len(used - sources["own"] - sources["partition"]),
        "nodes_refused": len(refused),
        "refusals": list(refusals)[:MAX_REASONS],
        "nodes_rejected": len(rejected),
        "rejections": list(rejections)[:MAX_REASONS],
        "nodes_silent": len(dropped - used - refused - rejected),
    }


def plain_data(s: dict) -> bool:
    """Whether a summary's data is a plain simulation's: every node on its partition, none refused or
    rejected (also a summary written before :func:`data_used`)."""
    return not any(
        s.get(k) for k in ("nodes_own_data", "nodes_unstated_data", "nodes_refused", "nodes_rejected")
    )


def _data_line(s: dict) -> list[str]:
    if plain_data(s):
        return []
    parts = [
        f"{s.get('nodes_own_data', 0)} on their own data, "
        f"{s.get('nodes_partition_data', 0)} on their partition"
        + (f", {s['nodes_unstated_data']} unstated" if s.get("nodes_unstated_data") else "")
    ]
    if s.get("nodes_refused"):
        parts.append(f"{s['nodes_refused']} refused: {'; '.join(s.get('refusals', []))}")
    if s.get("nodes_rejected"):
        parts.append(f"{s['nodes_rejected']} rejected: {'; '.join(s.get('rejections', []))}")
    return [f"  data (nodes)       {' | '.join(parts)}"]


def _held_out(s: dict) -> str:
    """What the held-out metric was computed over: its examples, or a language model's texts and the
    blocks of ``--max-length`` tokens they were cut into."""
    texts, examples = s.get("eval_texts", s["eval_examples"]), s["eval_examples"]
    if texts == examples:
        return f"{examples} examples"
    return f"{texts} held-out texts, cut into {examples} blocks of at most --max-length tokens"


def format_summary(s: dict) -> str:
    """Readable end-of-run summary."""
    metric = s["metric"]
    lines = [
        "",
        f"fedlora run summary  ({s['model']} on {s['dataset']}, mechanism {s['mechanism']})",
        f"  rounds             {s['rounds_completed']} completed, {s['rounds_skipped']} skipped (nobody sampled, or under secure aggregation fewer than min-replies)"
        + (f", interrupted by a crash: {s['rounds_interrupted']}" if s.get("rounds_interrupted") else ""),
        *(
            [f"  withheld           {s['rounds_withheld']} round(s) with too few usable replies"]
            if s.get("rounds_withheld")
            else []
        ),
        f"  clients            {s['num_clients']} nodes, sample rate p = {s['sample_rate']}",
        *_data_line(s),
        *(
            [
                "  dropouts           "
                + "; ".join(
                    f"round {d['round']}: node(s) {', '.join(map(str, d['nodes']))}" for d in s["dropouts"]
                )
            ]
            if s.get("dropouts")
            else []
        ),
        f"  held-out {metric:<9} {s['before'][metric]:.4f} before -> {s['after'][metric]:.4f} after"
        f"  ({_held_out(s)})",
        f"  bytes per round    {s['bytes_down_per_round'] / 1e6:.2f} MB down, "
        f"{s['bytes_up_per_round'] / 1e6:.2f} MB up (mean over completed rounds)",
        f"  client privacy     {s['privacy']}",
        *(
            [f"  sample privacy     {s['sample_privacy']}"]
            if s.get("sample_privacy", "none").startswith("sample")
            else []
        ),
        *(
            f"  node {n['node']:<14} sample-level epsilon {n['eps_tight']:.4g} (pld, the guarantee; gdp "
            f"{n['eps_gdp']:.4g} is the CLT mu-GDP approximation, not a bound) at delta {n['delta']:g}, from its ledger"
            for n in s.get("node_privacy", [])
        ),
        *(f"  not covered        {what}" for what in s.get("not_covered", [])),
        *([f"  stopped early      {s['stopped']}"] if s.get("stopped") else []),
        *([f"  privacy report     {', '.join(s['privacy_report'])}"] if s.get("privacy_report") else []),
        f"  wall time          {s['wall_time_s']:.1f} s",
        f"  adapter            {s['adapter']}",
        f"  metrics            {s['metrics_file']}"
        + (f" (curves: {s['curves']})" if s.get("curves") else ""),
    ]
    return "\n".join(lines)
