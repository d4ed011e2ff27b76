"""``fedlora bench suite``: run every comparison with fixed seeds and write ``results.json``, the
figures and the Markdown of ``docs/RESULTS.md`` (server/bench/suite/plan.py says what runs)."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from common.config import ENGINES
from common.errors import FedloraError
from common.provenance import made
from common.signals import handlers_while
from server.bench.suite.adopt import NOT_RECORDED, adopt, stored_config
from server.bench.suite.plan import PROFILES, Run, profile, runs
from server.bench.suite.records import RECORDS, restore, save
from server.bench.suite.report import FIGURES, markdown
from server.bench.suite.runner import ROOT, execute_all, finished
from server.bench.suite.sections import BUILDERS, CLIENT_LEVEL

SECTIONS = tuple(BUILDERS)
DEFAULT_OUT = "bench-results"
PACKAGES = ("torch", "transformers", "peft", "flwr", "opacus", "dp-accounting")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        dest="profile",
        action="store_const",
        const="quick",
        default="full",
        help="miniature runs and quick audits, about 30 minutes on 2 cores (same as --profile quick)",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILES,
        default="full",
        help="full (the real presets, 3 seeds: hours on a CPU), quick, or tiny (the suite's smoke test)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="directory for runs/, results.json, RESULTS.md")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="comma-separated sections to run (default all: "
        + ", ".join(SECTIONS)
        + "); the other sections of the same profile's report in --out are kept as they were",
    )
    parser.add_argument(
        "--docs",
        default=None,
        metavar="DIR",
        help="also write DIR/RESULTS.md, its figures and a record of every run (DIR/results/runs/: a "
        "run whose directory is gone is restored from its record, so the report regenerates from DIR)",
    )
    parser.add_argument(
        "--adopt",
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="finished `fedlora simulate` or `train-local` run directories to take as plan runs with the same configuration "
        "(made by hand on this machine; each is copied under runs/, command.json names where it came from)",
    )
    parser.add_argument(
        "--stored-only",
        action="store_true",
        help="run nothing: report the runs already finished (or adopted) and list the commands not run yet",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="runs at once (default 1); each simulate keeps its clients in-process on cores/N threads",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="client engine of every federation (default auto: sequential on a CPU): how a run is "
        "executed, not what it computes, so its command and record are the same whichever "
        "(batched measured 1.19x sequential on 2 CPU cores in fp32: docs/cohort-engine.md)",
    )
    parser.add_argument(
        "--seeds",
        default=None,
        metavar="S,S",
        help="only these seeds' runs (e.g. 0 for a one-seed sweep; default: the profile's)",
    )
    parser.add_argument("--json", action="store_true", help="print results.json instead of the summary")


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _needed(name: str) -> set[str]:
    """The plan sections a report section reads (privacy and speed read the utility runs too)."""
    return {
        "privacy": {"sample-level", *CLIENT_LEVEL},
        "speed": {"speed", "client-level"},
        "communication": {"communication", "client-level"},
    }.get(name, {name})


@dataclass(frozen=True)
class Scope:
    """Which seeds' runs a suite invocation makes (None: the profile's), how many at once, the
    directory of the committed run records (server/bench/suite/records.py; None: none) and the client
    engine its federations run with (how they run, not what they compute)."""

    seeds: tuple[int, ...] | None = None
    jobs: int = 1
    records: Path | None = None
    engine: str = "auto"


def suite(
    profile_name: str,
    out: Path,
    sections: list[str],
    echo=print,
    adopted: Sequence[Path] = (),
    stored_only: bool = False,
    scope: Scope = Scope(),
) -> dict:
    """Run (or reuse) every needed command of the profile, build the chosen sections, draw the
    figures and write ``results.json`` and ``RESULTS.md`` into ``out``; returns the results.
    ``adopted``: finished run directories to take as plan runs first (server/bench/suite/adopt.py);
    ``stored_only``: run nothing, and list the commands with no finished run as missing;
    ``scope``: the seeds to run (None: all), how many runs go at once, and the directory of the
    committed run records (restored from before anything runs, each written as its run ends, and
    all written again at the end, adopted and reused ones included)."""
    p = profile(profile_name)
    wanted = set().union(*(_needed(s) for s in sections))
    plan = [
        r for r in runs(p) if r.section in wanted and (scope.seeds is None or r.seed in (None, *scope.seeds))
    ]
    now = made()
    records = scope.records
    if records is not None:
        for key in restore(plan, records, out / "runs"):
            echo(f"[suite] restore {key} from {records}")
    took = adopt(plan, adopted, out / "runs", echo)
    start = time.monotonic()
    done, missing = [], []

    def keep(run: Run, record: dict) -> None:  # a finished run's record, kept as it ends
        if records is not None:
            save([{"run": run, **record}], records, now)

    outcomes = (
        [finished(run, out / "runs") for run in plan]
        if stored_only
        else execute_all(plan, out / "runs", echo, scope.jobs, now, keep, scope.engine)
    )
    for run, record in zip(plan, outcomes, strict=True):
        if record is None:
            missing.append(" ".join(run.command))
        else:
            done.append({"run": run, **record})
    # where the reported runs were made (their stamps), so a report regenerated from records
    # elsewhere names the same devices; this machine only where no run is stamped
    device = ", ".join(sorted({d["made"]["device"] for d in done if d.get("made")})) or now["device"]
    if records is not None:
        save(done, records, now)
    built = {name: BUILDERS[name](done) for name in sections}
    figures = out / FIGURES
    figures.mkdir(parents=True, exist_ok=True)
    from server.bench.suite import plots  # matplotlib: only when a report is drawn

    plots.draw(built, figures)
    argv = [
        "fedlora",
        "bench",
        "suite",
        *([f"--profile {profile_name}"] if profile_name != "full" else []),
        *(["--stored-only"] if stored_only else []),
        *([f"--seeds {','.join(map(str, scope.seeds))}"] if scope.seeds is not None else []),
        *([f"--jobs {scope.jobs}"] if scope.jobs > 1 else []),
        *([f"--engine {scope.engine}"] if scope.engine != "auto" else []),
    ]
    results = {
        "suite": {
            "command": " ".join([*argv, *([f"--out {out}"] if str(out) != DEFAULT_OUT else [])]),
            "profile": profile_name,
            "date": now["date"],
            "device": device,
            "versions": _versions(),
            "commit": now["commit"],
            "wall_s": round(time.monotonic() - start, 1),  # this invocation (reused runs cost nothing)
            "runs_wall_s": round(sum(d.get("wall_s") or 0 for d in done), 1),  # every command's own time
            "reused": sum(1 for d in done if d.get("reused")),
            "adopted": sorted({d["adopted_from"] for d in done if d.get("adopted_from")}),
            "adopted_now": len(took),
            "missing": missing,
            "runs": len(done),
            "notes": list(p.notes),
        },
        "sections": [],
    }
    fresh = [{**_public(built[name]), "made": _made(done, name, now)} for name in sections]
    results["sections"] = carried(_previous(out / "results.json", profile_name), fresh)
    (out / "results.json").write_text(
        json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    (out / "RESULTS.md").write_text(markdown(results), encoding="utf-8")
    return results


def _made(done: Sequence[dict], section: str, now: dict) -> dict | None:
    """When, at which commit and where a section's newest runs were made (its runs' own stamps, so a
    report regenerated from committed records names the same; ``now`` where no run carries one; None
    where the section has no finished run: nothing was made): the newest date, with every commit its
    runs of that date name (recorded ones first)."""
    ran = [d for d in done if d["run"].section in _needed(section)]
    if not ran:
        return None
    stamps = [d["made"] for d in ran if d.get("made")]
    if not stamps:
        return now
    newest = max(stamps, key=lambda m: m["date"])
    commits = {m["commit"] for m in stamps if m["date"] == newest["date"]}
    return {**newest, "commit": ", ".join(sorted(commits, key=lambda c: (c == NOT_RECORDED, c)))}


def _previous(path: Path, profile_name: str) -> dict | None:
    """The results an earlier invocation of the same profile left in ``path`` (None: none, another
    profile, or unreadable: then nothing is carried)."""
    try:
        previous = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return previous if previous.get("suite", {}).get("profile") == profile_name else None


def carried(previous: dict | None, fresh: list[dict]) -> list[dict]:
    """The report's sections: ``fresh`` ones (built now) replace their namesakes, every other section
    of ``previous`` stays as it was (with the commit and date it was made at), in the order of
    ``SECTIONS``: a suite invocation of one section updates that section and leaves the others."""
    by_name = {
        sec["name"]: sec for sec in (previous or {}).get("sections", []) if sec.get("name") in SECTIONS
    }
    by_name.update({sec["name"]: sec for sec in fresh})
    return [by_name[name] for name in SECTIONS if name in by_name]


def _public(section: dict) -> dict:
    """The section without the fields kept for the figures (``_after``, ``_target``)."""
    rows = [{k: v for k, v in r.items() if not k.startswith("_")} for r in section["rows"]]
    return {**section, "rows": rows}


def publish(out: Path, docs: Path, results: dict) -> None:
    """Copy ``RESULTS.md`` and the figures its sections show into ``docs``, and remove the figures
    it no longer shows (a section with no run draws none), so ``docs`` holds what one regeneration
    makes and nothing older."""
    (docs / FIGURES).mkdir(parents=True, exist_ok=True)
    shown = {name for sec in results["sections"] for name in sec["figures"]}
    for png in (docs / FIGURES).glob("*.png"):
        if png.name not in shown:
            png.unlink()
    for name in sorted(shown):
        shutil.copyfile(out / FIGURES / name, docs / FIGURES / name)
    shutil.copyfile(out / "RESULTS.md", docs / "RESULTS.md")


def run(args: argparse.Namespace) -> int:
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown or not sections:
        raise FedloraError(
            f"--sections: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SECTIONS)}"
        )
    if args.docs and not Path(args.docs).is_dir():
        raise FedloraError(f"--docs {args.docs}: not a directory")
    if args.docs and args.profile != "full" and Path(args.docs).resolve() == ROOT / "docs":
        raise FedloraError(
            f"--docs {args.docs}: docs/RESULTS.md is the full profile's report; the {args.profile} profile "
            "only checks the pipeline (write it elsewhere with --out)"
        )
    out = Path(args.out)
    echo = (lambda line: print(line, file=sys.stderr)) if args.json else print
    for path in args.adopt:
        if stored_config(Path(path)) is None:
            raise FedloraError(
                f"--adopt {path}: not a finished run directory (no config.json and summary.json)"
            )
    if args.jobs < 1:
        raise FedloraError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        seeds = None if args.seeds is None else tuple(int(s) for s in args.seeds.split(",") if s.strip())
    except ValueError:
        raise FedloraError(f"--seeds {args.seeds}: not a comma-separated list of integers") from None
    records = Path(args.docs) / FIGURES / RECORDS if args.docs else None
    scope = Scope(seeds, args.jobs, records, args.engine)
    adopted = [Path(a) for a in args.adopt]
    with _terminate_as_interrupt():
        results = suite(args.profile, out, sections, echo, adopted, args.stored_only, scope)
    if args.docs:
        publish(out, Path(args.docs), results)
    if args.json:
        print(json.dumps(results, ensure_ascii=False))
    else:
        failed = [n for s in results["sections"] for n in s["notes"] if n.startswith("failed:")]
        print(
            f"suite {args.profile}: {len(results['sections'])} sections in {results['suite']['wall_s']:.0f} s; "
            f"{out / 'results.json'}, {out / 'RESULTS.md'}"
            + (f"; {len(failed)} failed runs" if failed else "")
        )
    return 1 if any(n.startswith("failed:") for s in results["sections"] for n in s["notes"]) else 0


#: what the interrupted suite says (fedlora prints "fedlora: interrupted; <this>" and exits 130)
RESUME_HINT = "run the same command again: finished runs are reused, an interrupted federation resumes"


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler's stop) taken as Ctrl-C while the suite runs: the commands under
    way are stopped (server/bench/suite/runner.py), not left running without it. The previous
    handler comes back after (the suite may run inside another program: a test session)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(RESUME_HINT)

    try:
        with handlers_while({signal.SIGTERM: interrupt}):
            yield
    except KeyboardInterrupt as exc:
        raise KeyboardInterrupt(str(exc) or RESUME_HINT) from None
