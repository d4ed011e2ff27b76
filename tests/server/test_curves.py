"""A run's learning curves (server/curves.py): the figure drawn from metrics.jsonl alone, and the
TensorBoard scalars logged as each metrics line is written."""

from __future__ import annotations

import json

import pytest

from server.curves import Board, draw_curves, read_rounds

ROWS = [
    {"round": 0, "phase": "initial", "accuracy": 0.5, "loss": 0.69},
    {
        "round": 1,
        "phase": "train",
        "sampled": 4,
        "replied": 4,
        "train_loss": None,
        "eps_tight": 1.5,
        "eps_gdp": 1.1,
        "sigma": 1.2,
        "seconds": 2.0,
        "bytes_up": 10,
        "accuracy": 0.6,
        "loss": 0.6,
    },
    {
        "round": 2,
        "phase": "train",
        "sampled": 3,
        "replied": 2,
        "train_loss": None,
        "eps_tight": 2.5,
        "eps_gdp": 2.0,
        "sigma": 1.2,
        "seconds": 2.5,
        "bytes_up": 10,
    },
    {"round": 3, "phase": "stopped", "reason": "client-level budget reached"},
]


def _metrics(tmp_path, rows=ROWS):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_figure_has_a_panel_per_curve_and_says_what_a_private_run_does_not_send(tmp_path, monkeypatch):
    """Three panels: the held-out metric (rounds 0 and 1: round 2 was not evaluated), the train loss
    (none: a private run sends none, and the panel says so) and ε (both accountants, the budget)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    drawn = {}
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        drawn["axes"] = [
            (
                ax.get_title(),
                [list(line.get_xdata()) for line in ax.get_lines()],
                [t.get_text() for t in ax.texts],
            )
            for ax in fig.axes
        ]
        return real(fig, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    out = draw_curves(_metrics(tmp_path), tmp_path / "curves.png", "accuracy", target_epsilon=8.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (t0, x0, _), (_, x1, empty), (t2, x2, _) = drawn["axes"]
    assert t0 == "held-out accuracy" and x0 == [[0, 1]]
    assert x1 == [] and empty == ["not sent (a private run)"]
    assert t2 == "client-level ε" and x2[:2] == [[1, 2], [1, 2]] and len(x2) == 3  # + the budget line


def test_a_torn_or_repeated_round_line_keeps_the_last_line_of_each_round(tmp_path):
    rows = [*ROWS[:2], {**ROWS[1], "accuracy": 0.7}]
    assert [r.get("accuracy") for r in read_rounds(_metrics(tmp_path, rows))] == [0.5, 0.7]


def test_tensorboard_gets_every_number_of_each_line_under_its_tag(tmp_path):
    """Read back with TensorBoard's own reader: the held-out metrics under heldout/, ε and the round
    counts under their tags, by round; nothing for the stopped line."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = Board(tmp_path / "tb")
    for row in ROWS:
        board.log(row)
    board.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    scalars = {
        tag: [(e.step, round(e.value, 4)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }
    assert scalars["heldout/accuracy"] == [(0, 0.5), (1, 0.6)]
    assert scalars["privacy/epsilon_tight"] == [(1, 1.5), (2, 2.5)]
    assert scalars["round/replies"] == [(1, 4), (2, 2)]
    assert "train/loss" not in scalars and not any("bytes" in t for t in scalars)


def test_each_epsilon_curve_has_one_colour_in_both_figures_and_rounds_are_whole(tmp_path, monkeypatch):
    """Issue 75 item 11: the accountants' colours were swapped between curves.png and privacy.png,
    and a 1-round run's axis showed round 0.5."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from common.privacy.report import plot

    seen = []
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        fig.canvas.draw()
        for ax in fig.axes:
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            colours = {line.get_label(): line.get_color() for line in ax.get_lines()}
            seen.append((ticks, colours))
        return real(fig, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    one_round = [
        {"round": 0, "phase": "initial", "accuracy": 0.5},
        {"round": 1, "eps_tight": 2.0, "eps_gdp": 1.5},
    ]
    draw_curves(_metrics(tmp_path, one_round), tmp_path / "curves.png", "accuracy")
    rounds = [
        {"round": r, "eps_tight": 1.0 + r, "eps_gdp": 1.0 + r / 2, "threat_model": "central"} for r in (1, 2)
    ]
    plot({"rounds": rounds, "delta": 1e-5, "unit": "client-level"}, tmp_path / "privacy.png")
    assert all(float(t).is_integer() for ticks, _ in seen for t in ticks)
    curves_eps, privacy_eps = seen[2][1], seen[3][1]
    assert curves_eps["ε (tight accountant)"] == privacy_eps["PLD (tight)"]
    assert curves_eps["ε (CLT μ-GDP, approximation)"] == privacy_eps["CLT μ-GDP (paper)"]
    assert privacy_eps["PLD (tight)"] != privacy_eps["CLT μ-GDP (paper)"]
