"""Whether a finished run applied any round.

A run that applied none ends with the adapter it began with, yet may have spent privacy: a round
that sampled nobody is charged all the same (whom the sampler picks is secret, and so is an empty
sample). ``fedlora simulate`` and ``fedlora deploy up`` / ``resume`` then exit 1 with one line that
says what became of each round and what ε was charged (docs/deployment.md, "Exit codes"), and the
ServerApp fails with that line (Flower's run status ``finished:failed``, whatever the route)."""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import FedloraError
from common.privacy.accounting.statement import round_epsilons

SUMMARY_FILE = "summary.json"
METRICS_FILE = "metrics.jsonl"
LISTED = 4  # at most this many round numbers are named; more are counted


class NoRoundApplied(FedloraError):
    """The run ended, but applied no round: its adapter is the initial one (exit code 1)."""

    exit_code = 1


def no_round_applied(run_dir: Path) -> str | None:
    """Why the finished run in ``run_dir`` applied no round, as one line; None when it applied one.
    Reads its ``summary.json`` (a run without one is reported as such) and ``metrics.jsonl``."""
    path = Path(run_dir) / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return (
            f"no round is known to have been applied: {path} is missing or unreadable ({type(exc).__name__})"
        )
    if summary.get("rounds_completed"):
        return None
    what = "; ".join(_what_happened(summary, _records(Path(run_dir)))) or "no round ran"
    return f"no round was applied: {what}{_charged(summary)}; the adapter in {run_dir} is the initial one"


def ended_without_a_round(run_dir: Path) -> str | None:
    """Like :func:`no_round_applied`, but only for a run that ended (its ``summary.json`` written):
    None for a run that applied a round or that failed before its summary."""
    return no_round_applied(run_dir) if (Path(run_dir) / SUMMARY_FILE).is_file() else None


def check_applied(run_dir: Path) -> None:
    """Raise :class:`NoRoundApplied` (exit code 1) when the run in ``run_dir`` applied no round."""
    if why := no_round_applied(run_dir):
        raise NoRoundApplied(why)


def _records(run_dir: Path) -> list[dict]:
    """The run's metrics lines after round 0 (a torn or unreadable line is skipped)."""
    out = []
    try:
        lines = (run_dir / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("round", 0) > 0:
            out.append(record)
    return out


def _what_happened(summary: dict, records: list[dict]) -> list[str]:
    """What became of each round that ran none, grouped by what (the metrics lines; without them,
    the summary's counts)."""
    nobody = [r for r in records if r.get("phase") == "skipped" and not r.get("sampled")]
    few = [r for r in records if r.get("phase") == "skipped" and r.get("sampled")]
    withheld = [r for r in records if r.get("phase") == "train" and not r.get("applied")]
    interrupted = [r for r in records if r.get("phase") == "interrupted"]
    parts = []
    if nobody:
        online = sorted({r.get("online", summary.get("num_clients")) for r in nobody} - {None})
        over = ""
        if online:
            count = str(online[0]) if len(online) == 1 else f"{online[0]}-{online[-1]}"
            over = f" over {count} node{'' if online == [1] else 's'}"
        rate = summary.get("sample_rate")
        why = f" (sample rate {rate:g}{over})" if isinstance(rate, int | float) else ""
        parts.append(f"{_rounds(nobody)} sampled nobody{why}")
    if few:
        parts.append(f"{_rounds(few)} sampled fewer clients than min-replies (nothing sent)")
    if withheld:
        parts.append(f"{_rounds(withheld)} withheld (fewer usable replies than min-replies)")
    if interrupted:
        parts.append(f"{_rounds(interrupted)} interrupted by a crash")
    parts += [
        f"round {r['round']} not run: {r.get('reason', '')}" for r in records if r.get("phase") == "stopped"
    ]
    if not parts:  # no metrics lines to go by
        counts = (("rounds_skipped", "skipped"), ("rounds_withheld", "withheld"))
        parts = [f"{summary[k]} round(s) {what}" for k, what in counts if summary.get(k)]
        if summary.get("stopped"):
            parts.append(f"stopped: {summary['stopped']}")
    return parts


def _rounds(records: list[dict]) -> str:
    """``round 1``, ``rounds 1, 2 and 4``, or (more than :data:`LISTED`) ``12 rounds``."""
    numbers = [str(r["round"]) for r in records]
    if len(numbers) == 1:
        return f"round {numbers[0]}"
    if len(numbers) <= LISTED:
        return f"rounds {', '.join(numbers[:-1])} and {numbers[-1]}"
    return f"{len(numbers)} rounds"


def _charged(summary: dict) -> str:
    """``; charged all the same: client-level eps ...``: the ε the run spent, if it spent any."""
    privacy = summary.get("client_privacy") or {}
    gdp, tight = privacy.get("eps_gdp"), privacy.get("eps_tight")
    if not (gdp or tight):
        return ""
    accountant = privacy.get("tight_accountant", "pld")
    if accountant == "pld" and gdp is not None and tight is not None:  # the larger leads (statement.py)
        eps = round_epsilons(gdp, tight)
    else:
        bounds = (("gdp", gdp), (accountant, tight)) if accountant == "pld" else ((accountant, tight),)
        eps = " / ".join(f"{name} {value:.3g}" for name, value in bounds if value is not None)
    return f"; charged all the same: {privacy.get('what_if', '')}client-level eps {eps}"


__all__ = ["NoRoundApplied", "check_applied", "no_round_applied"]
