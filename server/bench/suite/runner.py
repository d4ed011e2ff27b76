"""Runs the suite's commands, each in a fresh process, and reads back what each one wrote.

A run's directory ``<out>/runs/<key>`` gets ``command.json`` (the command line) when it starts and
the command's own outputs (``summary.json`` of ``simulate``, ``result.json`` of ``train-local``,
``audit.json`` of ``audit``, or ``output.json``: the JSON a ``bench ... --json`` prints) when it
ends; ``log.txt`` holds its output.
A directory whose command is the same and whose outputs exist is reused, not run again.
A run the plan asks to score again (``Run.rescore``: the DP track's instruction runs) gets
``evaluation.json`` and ``evaluation-base.json`` (:data:`SCORES`: ``fedlora evaluate --json`` of its
final adapter and of the base model, the base read from the suite's own ``--eval-cache`` after the
first) once it has finished, and again on reuse while one is missing and its checkpoint is there.

Several runs may go at once (:func:`execute_all`, ``--jobs``): each ``simulate`` then runs its clients
in its own process (``--workers 1``, a simulation setting: results do not depend on it) on
cores/jobs torch threads, and every run records its own wall time and peak resident memory.

An interrupted invocation (Ctrl-C, or SIGTERM, which the suite takes as one) stops the commands
running under it, so none is left behind; the next invocation resumes an interrupted federation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common.cores import threads_each
from common.provenance import ROOT  # the repository (``python -m common.cli`` runs from here)
from server.bench.suite.plan import Run

OUTPUTS = ("summary.json", "result.json", "audit.json", "output.json")
#: a rescored run's scores: file -> whether it scores the base model (``--base``) instead of the adapter
SCORES = {"evaluation.json": False, "evaluation-base.json": True}
#: the commands running now (each thread of :func:`execute_all` waits on its own), stopped with the suite
_LIVE: set[subprocess.Popen] = set()
#: set while an interrupted suite stops them: a command that ends then was stopped, it did not fail
_STOPPING = threading.Event()


def output_file(run_dir: Path) -> str | None:
    """The name of the run's result file (the first of :data:`OUTPUTS` that exists), or None."""
    return next((name for name in OUTPUTS if (run_dir / name).exists()), None)


def output_of(run_dir: Path) -> dict | None:
    """The run's result (its :func:`output_file`'s JSON), or None."""
    name = output_file(run_dir)
    return None if name is None else json.loads((run_dir / name).read_text(encoding="utf-8"))


def scores_of(run_dir: Path) -> dict[str, dict]:
    """The run's :data:`SCORES` that exist, by file name."""
    return {
        name: json.loads((run_dir / name).read_text(encoding="utf-8"))
        for name in SCORES
        if (run_dir / name).exists()
    }


def _stored(run_dir: Path) -> dict:
    """The run directory's ``command.json`` (empty if none)."""
    path = run_dir / "command.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def finished(run: Run, runs_dir: Path, stored: dict | None = None) -> dict | None:
    """The record of ``run``'s finished directory (as :func:`execute` returns it, ``reused``), or None
    when the directory holds no output of this very command. ``stored``: its command.json, if read."""
    run_dir = runs_dir / run.key
    stored = _stored(run_dir) if stored is None else stored
    output = output_of(run_dir) if stored.get("command") == run.command else None
    if output is None:
        return None
    scores = scores_of(run_dir)
    return {**stored, "output": output, "scores": scores, "error": None, "dir": str(run_dir), "reused": True}


def interrupted(run: Run, runs_dir: Path, stored: dict | None = None) -> bool:
    """Whether ``run`` is a federation stopped before its end, which :func:`execute` resumes from its
    checkpoint (its directory was made by this very command and holds no output of it yet).
    ``stored``: its command.json, if read."""
    run_dir = runs_dir / run.key
    if run.output != "dir" or run.argv[:1] != ("simulate",):
        return False
    if not (run_dir / "out" / "checkpoint.safetensors").exists():
        return False
    stored = _stored(run_dir) if stored is None else stored
    return stored.get("command") == run.command and finished(run, runs_dir, stored) is None


def own_wall_s(output: dict, key: str) -> float | None:
    """A finished run's wall time from its output's ``key`` (seconds), with a round-0 evaluation read
    from ``--eval-cache`` counted at the seconds it took when computed (``cached_evaluation_s``)."""
    wall = output.get(key)
    return None if wall is None else round(wall + output.get("cached_evaluation_s", 0.0), 1)


def execute(
    run: Run,
    runs_dir: Path,
    echo: Callable[[str], None],
    jobs: int = 1,
    made: dict | None = None,
    engine: str = "auto",
) -> dict:
    """Run ``run`` (or reuse its finished directory); returns ``{"command", "wall_s", "peak_rss_mb",
    "made", "output", "error", "dir"}`` (``error``: the last line of a failed command, ``output`` then
    None). ``jobs``: how many runs share the machine (a ``simulate`` then keeps its clients
    in-process); ``made``: the invocation's date, commit and device, recorded with a run it makes;
    ``engine``: the client engine a ``simulate`` runs with (client/cohort.py), which is how it runs,
    not what it computes (server/run_dir.py NOT_IDENTITY): the command and its record stay the same.
    A federation interrupted earlier resumes from its checkpoint, its log continues, and its
    ``wall_s`` is the whole run's (the summary's ``wall_time_s``), not the last session's alone."""
    run_dir = runs_dir / run.key
    command = run.command
    shown = " ".join(command)
    stored = _stored(run_dir)
    if (found := finished(run, runs_dir, stored)) is not None:
        echo(f"[suite] reuse {run.key}: {shown}")
        if set(SCORES) - set(found["scores"]):
            found["scores"] = _rescore(run, run_dir, echo, _env(jobs))
        return found
    resumed = interrupted(run, runs_dir, stored)
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (*OUTPUTS, *SCORES):  # a stale output from another command must not be read as this one's
        (run_dir / name).unlink(missing_ok=True)
    (run_dir / "command.json").write_text(json.dumps({"command": command}) + "\n", encoding="utf-8")
    argv, out = list(command[1:]), run_dir / "out"
    if resumed:
        argv = ["simulate", "--out", str(out), "--resume"]  # an interrupted federation continues
        echo(f"[suite] resume {run.key}: {shown}")
    else:
        shutil.rmtree(out, ignore_errors=True)
        if run.output == "dir":
            argv += ["--out", str(out)]
        echo(f"[suite] run {run.key}: {shown}")
    env = _env(jobs)
    if engine != "auto" and argv[0] == "simulate":
        argv += ["--engine", engine]
    if jobs > 1:
        argv += ["--workers", "1"] if argv[0] == "simulate" else []
    start = time.monotonic()
    with open(run_dir / "log.txt", "a" if resumed else "w", encoding="utf-8") as log:
        returncode, stdout, usage = _child(argv, env, log, capture=run.output == "json")
    wall = round(time.monotonic() - start, 1)
    record = {"command": command, "wall_s": wall, "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}
    if made:
        record["made"] = made
    error = None
    if returncode != 0:
        error = _last_line(run_dir / "log.txt", returncode)
    elif run.output == "json":
        (run_dir / "output.json").write_text(stdout, encoding="utf-8")
    else:
        _collect(run_dir)
    output = None if error else output_of(run_dir)
    if resumed and output and "wall_time_s" in output:  # the whole run's, every session's rounds (summary)
        record["wall_s"] = own_wall_s(output, "wall_time_s")
    (run_dir / "command.json").write_text(json.dumps(record) + "\n", encoding="utf-8")
    if error:
        verb = "stopped (the next invocation takes it up again)" if _STOPPING.is_set() else "FAILED"
        echo(f"[suite] {verb} {run.key} ({wall:.0f} s): {error}")
    scores = _rescore(run, run_dir, echo, env) if output else {}
    return {**record, "output": output, "scores": scores, "error": error, "dir": str(run_dir)}


def _env(jobs: int) -> dict[str, str]:
    """A command's environment: no progress bars, and with ``jobs`` runs at once its share of the
    cores' torch threads (unless the caller set them)."""
    env = {**os.environ, "TQDM_DISABLE": "1"}
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", str(threads_each(jobs)))
    return env


def _child(argv: list[str], env: dict, log, capture: bool) -> tuple[int, str, os.struct_rusage]:
    """Run ``fedlora <argv>`` in a child process that an interrupted suite stops (:data:`_LIVE`),
    its stderr (and stdout unless ``capture``) into ``log``; (exit code, captured stdout, its own
    resource usage: ``ru_maxrss`` its peak memory, KiB on Linux)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "common.cli", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE if capture else log,
        stderr=log,
        text=True,
    )
    _LIVE.add(proc)
    try:
        stdout = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        _LIVE.discard(proc)
    return os.waitstatus_to_exitcode(status), stdout, usage


def _last_line(log: Path, returncode: int) -> str:
    """A failed command's last line of output (what it said last), at most 300 characters."""
    lines = log.read_text(encoding="utf-8").strip().splitlines()
    return (lines or [f"exit {returncode}"])[-1][:300]


def _rescore(run: Run, run_dir: Path, echo: Callable[[str], None], env: dict[str, str]) -> dict[str, dict]:
    """Score a finished run's final adapter and the base model again as the plan asks
    (``run.rescore``), each missing :data:`SCORES` file from its checkpoint under ``out/``; the base
    model's through ``<runs>/../eval-cache``, so computed once per configuration of the items. Returns
    the scores there are (none when the plan asks none; a run restored or adopted without its
    checkpoint keeps those it came with). ``env``: the runs' environment (:func:`_env`)."""
    if not run.rescore or not (run_dir / "out" / "config.json").exists():
        return scores_of(run_dir)
    cache = run_dir.parent.parent / "eval-cache"
    for name, base in SCORES.items():
        if (run_dir / name).exists():
            continue
        echo(f"[suite] score {run.key} again: {' '.join(run.rescore_command(base))}")
        argv = [*run.rescore_command(base)[1:], "--eval-cache", str(cache), "--json"]
        argv[argv.index("RUN")] = str(run_dir / "out")
        with open(run_dir / "log.txt", "a", encoding="utf-8") as log:
            returncode, stdout, _ = _child(argv, env, log, capture=True)
        if returncode != 0:
            echo(f"[suite] FAILED to score {run.key} again: {_last_line(run_dir / 'log.txt', returncode)}")
            break
        (run_dir / name).write_text(stdout, encoding="utf-8")
    return scores_of(run_dir)


def execute_all(
    plan: Sequence[Run],
    runs_dir: Path,
    echo: Callable[[str], None],
    jobs: int = 1,
    made: dict | None = None,
    on_done: Callable[[Run, dict], None] | None = None,
    engine: str = "auto",
) -> list[dict]:
    """:func:`execute` every run of ``plan``, ``jobs`` at a time, the federations an earlier invocation
    left interrupted first; the records in ``plan``'s order.
    ``on_done(run, record)`` as each run ends (the suite keeps its record at once: an invocation of
    hours may not reach its end). An exception here (an interrupt) stops the commands running.
    ``engine``: as :func:`execute`."""

    def one(run: Run) -> dict:
        record = execute(run, runs_dir, echo, jobs, made, engine)
        if on_done is not None:
            on_done(run, record)
        return record

    # interrupted federations first (their checkpoints are hours of work), then the plan's order
    order = sorted(range(len(plan)), key=lambda i: not interrupted(plan[i], runs_dir))
    _STOPPING.clear()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each thread waits on its own child
        try:
            records = dict(zip(order, pool.map(one, [plan[i] for i in order]), strict=True))
            return [records[i] for i in range(len(plan))]
        except BaseException:
            _STOPPING.set()
            pool.shutdown(wait=False, cancel_futures=True)  # no run not yet started starts now
            for proc in list(_LIVE):
                proc.terminate()
            raise


def _collect(run_dir: Path) -> None:
    """Copy the command's summary/result and metrics up to the run directory (the command wrote them
    into ``out/``), so :func:`output_of` finds them."""
    for name in ("metrics.jsonl", *OUTPUTS):  # the outputs last
        src = run_dir / "out" / name
        if src.exists():
            (run_dir / name).write_bytes(src.read_bytes())
