"""Progress: one bar per round's clients, per evaluation and per generation, on stderr. On a
terminal a transient tqdm bar; elsewhere (a log file, a pipe, CI) a plain line every
:data:`LOG_EVERY_S` seconds while the work lasts longer than that, so that a redirected run is
never silent for minutes (a round-0 evaluation of 1,000 examples took 4 minutes on 2 cores)."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

LOG_EVERY_S = 15.0  # seconds between progress lines when stderr is not a terminal


def bar(total: int, desc: str, unit: str) -> tqdm | LogBar:
    """A transient bar of ``total`` ``unit``s (cleared when done), with rate and time left; where
    stderr is not a terminal, a :class:`LogBar` of the same name."""
    if not sys.stderr.isatty():
        return LogBar(total, desc, unit)
    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=None, dynamic_ncols=True)


class LogBar:
    """A progress bar for logs: ``update(n)`` as tqdm's; a line ``desc: done/total units, N s, about
    M s left`` on stderr at most every ``every`` seconds (none for work shorter than that)."""

    def __init__(self, total: int, desc: str, unit: str, every: float | None = None) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.every = LOG_EVERY_S if every is None else every
        self.n = 0
        self._start = self._last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.every and self.n < self.total:
            self._last = now
            print(self.line(now - self._start), file=sys.stderr, flush=True)

    def line(self, elapsed: float) -> str:
        """The progress line after ``elapsed`` seconds (time left at the pace so far)."""
        left = elapsed / self.n * (self.total - self.n) if self.n else 0.0
        return f"{self.desc}: {self.n}/{self.total} {self.unit}s, {elapsed:.0f} s, about {left:.0f} s left"

    def close(self) -> None:
        """Nothing to clear (tqdm's interface)."""

    def __enter__(self) -> LogBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def eta_line(done: int, seconds: float, left: int, evaluations: int = 0, evaluation_s: float = 0.0) -> str:
    """The time estimate after the first ``done`` rounds took ``seconds``: ``left`` more rounds at
    that pace (evaluation included, as the rounds so far had it), plus ``evaluations`` held-out
    evaluations of ``evaluation_s`` seconds each (round 0's) that those rounds did not have."""
    per = seconds / max(done, 1)
    extra = evaluations * evaluation_s
    total = per * left + extra
    when = f"{total / 60:.1f} min" if total >= 60 else f"{total:.0f} s"
    evals = (
        f", and {evaluations} evaluation{'s' if evaluations != 1 else ''} of {evaluation_s:.0f} s"
        if extra
        else ""
    )
    return f"about {when} for the {left} round{'s' if left != 1 else ''} left ({per:.1f} s a round so far{evals})"


__all__ = ["LOG_EVERY_S", "LogBar", "bar", "eta_line"]
