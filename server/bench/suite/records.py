"""The committed record of each suite run (issue 52), so that docs/RESULTS.md regenerates from the
repository alone.

``<records>/<key>.json`` (kilobytes: no adapter, no checkpoint) holds a finished run's command, wall
time and peak memory, the date, commit and device it ran on, where it was adopted from, its output
(the ``summary.json``, ``result.json``, ``audit.json`` or bench JSON the report reads), the scores
of a rescored run (runner.SCORES, :data:`SCORE_KEYS` of each) and the fields
of its ``metrics.jsonl`` that the report reads (:data:`METRIC_KEYS`), with the held-out curve
(:data:`HELD_OUT`). With ``--docs DIR`` the suite
restores, before it runs anything, every plan run whose directory holds no output from the record
of the same command under ``DIR/results/runs/``, and afterwards writes a record for every finished
run there: deleting every local run directory and running the documented command again makes the
same report from what is committed. A record keeps the date, commit and device of the invocation
that first ran (or first recorded) its run, whatever later invocations reuse it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from server.bench.suite.plan import Run
from server.bench.suite.runner import OUTPUTS, SCORES, finished, output_file

#: the records' folder beside RESULTS.md's figures (``--docs docs``: docs/results/runs/)
RECORDS = "runs"
#: the metrics.jsonl fields the report reads (server/bench/suite/sections.py: ε by round, bytes and replies)
METRIC_KEYS = ("round", "eps_gdp", "eps_tight", "tight_accountant", "bytes_up", "replied")
#: the held-out metrics of an evaluation line, kept with its phase: a reader sees the curve, not only the end
HELD_OUT = ("accuracy", "loss", "perplexity", "positive_rate")
#: a run directory's command.json fields a record keeps
KEPT = ("command", "wall_s", "peak_rss_mb", "made", "adopted_from")
#: the fields of a rescored run's scores (runner.SCORES: ``fedlora evaluate`` JSON) a record keeps:
#: not the run's local path, nor its whole configuration, which the record's command already is
SCORE_KEYS = ("adapter", "round", "eval_examples", "seconds", "cached", "metrics", "made")


def metrics_digest(path: Path) -> list[dict]:
    """The report's fields of each line of a ``metrics.jsonl`` that has any (none if it is missing)."""
    if not path.exists():
        return []
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    digest = []
    for line in lines:
        kept = {k: line[k] for k in METRIC_KEYS if k in line}
        if any(line.get(k) is not None for k in HELD_OUT):
            kept |= {k: line[k] for k in ("phase", *HELD_OUT) if line.get(k) is not None}
        if set(kept) - {"round"}:
            digest.append(kept)
    return digest


def save(done: Sequence[dict], records: Path, made: dict) -> int:
    """Write the record of every finished run in ``done`` (the suite's run records) into ``records``;
    ``made``: this invocation's date, commit and device, for runs that carry none and have no record
    of the same output yet. Returns how many records changed."""
    records.mkdir(parents=True, exist_ok=True)
    changed = 0
    for d in done:
        run_dir = Path(d["dir"])
        name = output_file(run_dir)
        if d["output"] is None or name is None:
            continue
        path = records / f"{d['run'].key}.json"
        old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        same = old.get("command") == d["command"] and old.get("output") == d["output"]
        record = {k: d[k] for k in KEPT if d.get(k) is not None}
        record["made"] = d.get("made") or (old.get("made") if same else None) or made
        record |= {
            "output_file": name,
            "output": d["output"],
            "metrics": metrics_digest(run_dir / "metrics.jsonl"),
        }
        if scores := d.get("scores"):
            record["scores"] = {f: {k: v[k] for k in SCORE_KEYS if k in v} for f, v in scores.items()}
        text = json.dumps(record, indent=1, ensure_ascii=False, sort_keys=True) + "\n"
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed += 1
    return changed


def restore(plan: Sequence[Run], records: Path, runs_dir: Path) -> list[str]:
    """Re-create, from ``records``, the directory of every run of ``plan`` that holds no output of its
    command, where a record of that very command exists; returns the keys restored."""
    restored = []
    for run in plan:
        path = records / f"{run.key}.json"
        if finished(run, runs_dir) is not None or not path.exists():
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("command") != run.command:
            continue  # the plan changed since: the run is made again
        run_dir = runs_dir / run.key
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in (*OUTPUTS, *SCORES):
            (run_dir / name).unlink(missing_ok=True)
        for name, score in record.get("scores", {}).items():
            (run_dir / name).write_text(json.dumps(score), encoding="utf-8")
        stored = {k: record[k] for k in KEPT if k in record}
        (run_dir / "command.json").write_text(json.dumps(stored) + "\n", encoding="utf-8")
        (run_dir / record["output_file"]).write_text(json.dumps(record["output"]), encoding="utf-8")
        lines = "".join(json.dumps(m) + "\n" for m in record.get("metrics", []))
        (run_dir / "metrics.jsonl").write_text(lines, encoding="utf-8")
        restored.append(run.key)
    return restored
