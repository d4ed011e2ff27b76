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


def _panels(monkeypatch) -> dict:
    """What each saved figure's axes hold: ``drawn["axes"]`` = [(title, lines' x, texts, labels)]."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    drawn: dict = {}
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        drawn["axes"] = [
            (
                ax.get_title(),
                [list(line.get_xdata()) for line in ax.get_lines()],
                [t.get_text() for t in ax.texts],
                [line.get_label() for line in ax.get_lines()],
            )
            for ax in fig.axes
        ]
        drawn["y"] = [list(line.get_ydata()) for line in fig.axes[-1].get_lines()]
        return real(fig, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    return drawn


def test_the_figure_has_a_panel_per_curve_and_a_private_runs_loss_is_its_held_out_loss(tmp_path, monkeypatch):
    """Three panels: the held-out metric (rounds 0 and 1: round 2 was not evaluated), the loss (a
    private run's replies send none: the held-out loss of the evaluated rounds; the panel was empty in
    every private run) and ε (both accountants, the budget)."""
    drawn = _panels(monkeypatch)
    out = draw_curves(_metrics(tmp_path), tmp_path / "curves.png", "accuracy", target_epsilon=8.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (t0, x0, _, _), (t1, x1, empty, labels), (t2, x2, _, _) = drawn["axes"]
    assert t0 == "held-out accuracy" and x0 == [[0, 1]]
    assert t1 == "loss" and x1 == [[0, 1]] and labels == ["held-out loss"] and empty == []
    assert t2 == "ε by round" and x2[:2] == [[1, 2], [1, 2]] and len(x2) == 3  # + the budget line


def test_a_sample_level_run_draws_each_nodes_epsilon_and_many_nodes_as_their_largest(tmp_path, monkeypatch):
    """Issue 75 item 11: curves.png of a sample-level run said "no client-level guarantee" and drew
    no node's ε. Each node's running ε from its ledger (rounds it was charged), the sample-level
    target; past EACH_NODE nodes, their largest at each round."""
    from server.curves import EACH_NODE

    drawn = _panels(monkeypatch)
    rows = [{"round": 0, "phase": "initial", "accuracy": 0.5}, {"round": 1}, {"round": 2}]
    nodes = {0: ([1, 2], [1.0, 2.0]), 1: ([1, 2], [1.5, 2.9]), 2: ([], [])}
    draw_curves(_metrics(tmp_path, rows), tmp_path / "c.png", "accuracy", nodes=nodes, sample_target=3.0)
    title, xs, empty, labels = drawn["axes"][2]
    assert title == "ε by round" and empty == [] and xs[:2] == [[1, 2], [1, 2]]
    assert labels[:2] == ["node 0, sample-level ε (pld)", "node 1, sample-level ε (pld)"] and len(labels) == 3
    many = {k: ([1, 2], [1.0 + k / 100, 2.0 - k / 100]) for k in range(EACH_NODE + 1)}
    draw_curves(_metrics(tmp_path, rows), tmp_path / "c.png", "accuracy", nodes=many)
    _, xs, _, labels = drawn["axes"][2]
    assert labels == [f"largest of {EACH_NODE + 1} nodes' sample-level ε (pld)"] and xs == [[1, 2]]
    assert drawn["y"][0] == [1.0 + EACH_NODE / 100, 2.0]  # the largest at each round

    draw_curves(_metrics(tmp_path, rows), tmp_path / "c.png", "accuracy")
    assert drawn["axes"][2][2] == ["no privacy guarantee"]


def test_a_run_directory_draws_its_nodes_ledgers(tmp_path, monkeypatch):
    """RunDir.draw_curves reads each simulated node's sample-level ledger (nodes/node-k): the last
    charge of each round (a round charged again after an interruption counts once, at its last)."""
    from common.presets import preset
    from common.privacy.accounting.ledger import Charge, Ledger
    from server.run_dir import NODE_LEDGER, RunDir

    drawn = _panels(monkeypatch)
    cfg = preset("minilm-rt-silo")
    run = RunDir(tmp_path / "run", cfg)
    ledger = Ledger.create(run.path / "nodes" / "node-1" / NODE_LEDGER, "sample-level", "n1", cfg.delta)
    for key, rnd in (("1", 1), ("1", 2), ("1#2", 2)):  # round 2 again, as client/app.py keys it
        ledger.charge(Charge(key, rnd, 2.0, 0.1, 5, 0.1, 0, 1.0, "local", "ffa"))
    charged = [r["eps_tight"] for r in ledger.rows()]
    ledger.close()
    (run.path / "metrics.jsonl").write_text(json.dumps({"round": 0, "accuracy": 0.5}) + "\n")
    run.draw_curves("accuracy", 0.0)
    _, xs, _, labels = drawn["axes"][2]
    assert labels[0] == "node 1, sample-level ε (pld)" and xs[0] == [1, 2]
    assert labels[1] == f"sample-level target ε = {cfg.sample_epsilon:g}"
    assert len(charged) == 3  # round 2 twice: the figure keeps its last running ε
    assert list(drawn["y"][0]) == [charged[0], charged[2]]


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

    from common.privacy.accounting.report import plot

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
    assert curves_eps["client-level ε (tight accountant)"] == privacy_eps["PLD (tight)"]
    assert curves_eps["client-level ε (CLT μ-GDP, approx.)"] == privacy_eps["CLT μ-GDP (paper)"]
    assert privacy_eps["PLD (tight)"] != privacy_eps["CLT μ-GDP (paper)"]
