"""Stored runs the suite takes as its own: a finished ``fedlora simulate`` run directory made by hand
(e.g. a long measurement started before the suite) counts as a plan run when it computed the same
thing, so full-scale results are not paid for twice.

"The same thing" is the run's configuration: every option of the plan command's resolved
:class:`RunConfig` equals the stored ``config.json``'s, except the options that do not change what a
run computes (:data:`server.run_dir.NOT_IDENTITY`). A run that predates an option does not match
(what it did in the option's place is unknown) unless :data:`PREDATED` names the option's value that
does what every run did before it existed. ``--precision auto`` counts as what it resolves to
on this machine, on both sides: adopt runs made on the machine that runs the suite."""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict
from pathlib import Path

from common.local_options import add_arguments, config_of, local_record
from common.provenance import device
from server.bench.suite.plan import Run
from server.bench.suite.runner import SCORES, finished, own_wall_s
from server.simulate_cli import add_config_arguments, config_from_args

#: options added later, each with the value that reproduces runs made before it (issue 26's columns
#: of one's own dataset: the names every built-in dataset used, and no partition column)
PREDATED: dict[str, object] = {
    "text_column": "text",
    "label_column": "label",
    "partition_by": "",
    "users_per_client": 1,  # issue 52's bigger silos: one user (play) per client before
    "lm_blocks": 4,  # issue 33's silos: every run before took a text's first 4 blocks
    "labels": "",  # issue 53: no declared label set
    "skip_bad_rows": False,  # issue 53: malformed rows were not checked (now refused unless skipped)
}

#: what the suite's runner copies from an adopted run (its outputs and per-round metrics; ``result.json``
#: is a ``train-local`` run's output; the scores of ``fedlora evaluate`` run on it, runner.SCORES)
FILES = ("config.json", "summary.json", "metrics.jsonl", "privacy.json", "result.json", *SCORES)
NOT_RECORDED = "not recorded"  # the commit of a run made before runs stamped their output
#: a finished run's output file, per command, and the key of its wall time in seconds
OUTPUTS = {"simulate": ("summary.json", "wall_time_s"), "train-local": ("result.json", "seconds")}


def _simulate_config(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(add_help=False)
    add_config_arguments(parser)
    return json.loads(json.dumps(asdict(config_from_args(parser.parse_args(argv)))))


def _train_local_config(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return local_record(config_of(args), args.node, args.validation, args.charge_every)


#: the resolved configuration of each adoptable command, from its options
CONFIGS: dict[str, Callable[[list[str]], dict]] = {
    "simulate": _simulate_config,
    "train-local": _train_local_config,
}


def plan_config(run: Run) -> dict | None:
    """The resolved configuration (JSON values) of a ``simulate`` or ``train-local`` plan run, as
    its ``config.json`` would hold it; None for other commands."""
    if run.output != "dir" or run.argv[0] not in CONFIGS:
        return None
    return CONFIGS[run.argv[0]](run.command[2:])  # after ``fedlora <command>``


def differences(planned: dict, stored: dict) -> list[str]:
    """Options in which a stored ``config.json`` differs from a planned configuration."""
    from server.run_dir import NOT_IDENTITY

    planned, stored = _resolved(planned), {**PREDATED, **_resolved(stored)}
    missing = object()
    return [
        name
        for name, value in planned.items()
        if name not in NOT_IDENTITY and stored.get(name, missing) != value
    ]


def _resolved(config: dict) -> dict:
    """``config`` with ``precision`` as this machine resolves it for the run's device."""
    if "precision" not in config:
        return config
    from common.device import resolve_device
    from common.models.precision import resolve_precision

    device = resolve_device(config.get("device", "auto"))
    return {**config, "precision": resolve_precision(config["precision"], device)}


def stored_config(directory: Path) -> dict | None:
    """The stored configuration of a finished run directory (None: unfinished or not a run)."""
    done = any((directory / output).exists() for output, _ in OUTPUTS.values())
    if not done or not (directory / "config.json").exists():
        return None
    return json.loads((directory / "config.json").read_text(encoding="utf-8"))


def _own_record(directory: Path) -> dict:
    """What a finished run says of itself, from one read of its output: ``wall_s``, its own wall time
    (its summary's, with a round-0 evaluation read from ``--eval-cache`` counted at the seconds it
    took when computed; or a train-local result's seconds), and ``made``, when, at which commit and where
    it was made (the stamp its output carries, written by every run since they record it; else its
    output file's date and this machine, since adoption takes runs made here, with the commit marked
    as not recorded)."""
    for output, key in OUTPUTS.values():
        path = directory / output
        if path.exists():
            own = json.loads(path.read_text(encoding="utf-8"))
            made = own.get("made") or {
                "date": datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC)
                .date()
                .isoformat(),
                "commit": NOT_RECORDED,
                "device": device(),
            }
            return {"wall_s": own_wall_s(own, key), "made": made}
    raise ValueError(f"{directory} holds no finished run")


def adopt(
    plan: Sequence[Run], directories: Iterable[Path], runs_dir: Path, echo: Callable[[str], None]
) -> list[str]:
    """Copy each finished run directory that matches a plan run with no output yet into that run's
    place under ``runs_dir`` (``command.json`` records the plan's command, the run's own wall time,
    when, at which commit and where it was made, and where it came from); returns the keys adopted.
    A directory matches at most one run."""
    candidates = {d: s for d in map(Path, directories) if (s := stored_config(d)) is not None}
    adopted = []
    for run in plan:
        planned = plan_config(run)
        if planned is None:
            continue
        if (found := finished(run, runs_dir)) is not None:
            adopted += _scores(run, found, candidates, runs_dir, echo)
            continue
        match = next((d for d, s in candidates.items() if not differences(planned, s)), None)
        if match is None:
            continue
        del candidates[match]
        target = runs_dir / run.key
        target.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            if (match / name).exists():
                (target / name).write_bytes((match / name).read_bytes())
        record = {"command": run.command, **_own_record(match), "adopted_from": str(match)}
        (target / "command.json").write_text(json.dumps(record) + "\n", encoding="utf-8")
        echo(f"[suite] adopt {run.key}: {match}")
        adopted.append(run.key)
    return adopted


def _scores(
    run: Run, found: dict, candidates: dict[Path, dict], runs_dir: Path, echo: Callable[[str], None]
) -> list[str]:
    """Take the scores (runner.SCORES) that a plan run adopted earlier lacks from the directory it was
    adopted from, when that directory is among the ``candidates`` and has them now (``fedlora
    evaluate`` run on it since); returns the run's key if any was taken."""
    source = Path(found.get("adopted_from") or "")
    if not run.rescore or source not in candidates:
        return []
    target = runs_dir / run.key
    taken = [n for n in SCORES if n not in found["scores"] and (source / n).exists()]
    for name in taken:
        (target / name).write_bytes((source / name).read_bytes())
    if taken:
        echo(f"[suite] adopt {', '.join(taken)} of {run.key}: {source}")
    return [run.key] if taken else []
