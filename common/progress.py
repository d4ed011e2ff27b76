"""Progress bars on the terminal: one per round's clients, per evaluation and per generation, on
stderr and only when it is a terminal (tqdm's ``disable=None``): logs, pipes and CI stay quiet."""

from __future__ import annotations

from tqdm.auto import tqdm


def bar(total: int, desc: str, unit: str) -> tqdm:
    """A transient bar of ``total`` ``unit``s (cleared when done), with rate and time left."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=None, dynamic_ncols=True)


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


__all__ = ["bar", "eta_line"]
