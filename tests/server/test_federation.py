"""One in-process federation end to end (real ServerApp and ClientApp), and its failure paths."""

import io
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from flwr.app import Message
from peft import PeftModel
from safetensors import safe_open
from transformers import AutoModelForSequenceClassification

from common.config import to_flat
from common.errors import FedloraError
from common.lazy import load_component
from common.models import adapter_state
from common.models.precision import resolve_precision
from common.models.registry import MODELS
from common.presets import preset
from common.privacy.accounting.ledger import Ledger
from common.wire import from_record, train_reply
from server.checkpoint import CHECKPOINT_FILE
from server.inprocess import InProcessGrid
from server.simulate import CLIENT_APP, simulate
from tests.harness import TINY, federate, records, serve

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run") / "r"
    simulate(preset("minilm-rt", **TINY, tensorboard=True).check(), run_dir)
    return run_dir


def test_one_round_end_to_end(minilm_run):
    recs = records(minilm_run)
    assert [r["round"] for r in recs] == [0, 1]
    r1 = recs[1]
    assert r1["sampled"] == r1["replied"] == 2 and r1["rejected"] == []
    assert r1["bytes_down"] > 0 and r1["bytes_up"] > 0
    summary = json.loads((minilm_run / "summary.json").read_text())
    assert summary["rounds_completed"] == 1 and summary["after"]["accuracy"] == r1["accuracy"]
    assert summary["precision"] == resolve_precision("auto", "cpu")  # what auto chose on this machine
    assert (minilm_run / "adapter" / "adapter_config.json").exists()


def test_a_run_draws_its_curves_and_logs_each_round_to_tensorboard(minilm_run):
    """``curves.png`` beside the metrics (named in the summary), and with ``--tensorboard`` the
    held-out accuracy of rounds 0 and 1 as TensorBoard reads it back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    summary = json.loads((minilm_run / "summary.json").read_text())
    assert (
        Path(summary["curves"]) == minilm_run / "curves.png"
        and (minilm_run / "curves.png").stat().st_size > 0
    )
    events = EventAccumulator(str(minilm_run / "tensorboard"))
    events.Reload()
    accuracy = [(e.step, e.value) for e in events.Scalars("heldout/accuracy")]
    assert [step for step, _ in accuracy] == [0, 1]
    assert accuracy[1][1] == pytest.approx(records(minilm_run)[1]["accuracy"])


def test_saved_adapter_loads_with_peft_and_differs_from_init(minilm_run):
    base_dir = MODELS["minilm-l6"].locate()
    base = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=2)
    loaded = PeftModel.from_pretrained(base, minilm_run / "adapter").eval()
    ids = torch.randint(1000, 2000, (3, 10))
    fresh = AutoModelForSequenceClassification.from_pretrained(base_dir, num_labels=2).eval()
    # Reference: our own loader with the final state from the run's adapter weights.
    state = adapter_state(loaded)
    assert any(k.endswith(".A") and v.abs().max() > 0 for k, v in state.items()), "training moved the adapter"
    with torch.no_grad():
        out = loaded(input_ids=ids).logits
        merged = loaded.merge_and_unload()(input_ids=ids).logits
        assert not torch.allclose(out, fresh(input_ids=ids).logits)
    torch.testing.assert_close(out, merged, rtol=1e-4, atol=1e-5)


def test_round_with_nobody_sampled_is_recorded_and_skipped(tmp_path):
    simulate(preset("minilm-rt", **{**TINY, "sample_rate": 1e-9}).check(), tmp_path / "r")
    recs = records(tmp_path / "r")
    assert {k: recs[1][k] for k in ("round", "phase", "sampled", "replied")} == {
        "round": 1,
        "phase": "skipped",
        "sampled": 0,
        "replied": 0,
    }
    assert recs[1]["accuracy"] == recs[0]["accuracy"]  # nothing applied


def _run_with_corrupt_node(cfg, corrupt) -> None:
    """The federation with node 1's replies passed through ``corrupt(content)``."""

    def corrupting(client, msg: Message, ctx):
        reply = client(msg, ctx)
        if ctx.node_config["partition-id"] == 1:
            corrupt(reply.content)
        return reply

    federate(cfg, corrupting)


def test_invalid_reply_is_rejected_and_round_continues(tmp_path):
    cfg = preset("minilm-rt", **TINY).replace(out_dir=str(tmp_path / "r")).check()
    _run_with_corrupt_node(cfg, lambda content: content["meta"].__setitem__("round", 99))
    r1 = records(tmp_path / "r")[1]
    assert r1["replied"] == 1 and len(r1["rejected"]) == 1 and "round 99" in r1["rejected"][0]


def test_distributed_noise_with_a_dropout_never_ends_above_the_target(tmp_path):
    """Distributed shares are sized for min-replies (m = min(min-replies, K)): a node that drops out
    takes no noise the applied sum needed, the round's charge stays at the planned σ, and a run
    calibrated for its target ends at or below it. (Before: shares of σC/sqrt(K), σ lowered after
    the dropout, final ε above the target.)"""
    dp = dict(mechanism="dp-fedavg", threat_model="distributed", target_epsilon=6.0, clip=0.5)
    cfg = preset("minilm-rt", **{**TINY, "num_clients": 3, "rounds": 2}, **dp)
    cfg = cfg.replace(out_dir=str(tmp_path / "r")).check()
    _run_with_node_dying(cfg)
    recs = records(tmp_path / "r")
    assert [(r["replied"], r["applied"]) for r in recs[1:]] == [(3, True), (2, True)]
    ledger = Ledger.open(tmp_path / "r" / "ledger.sqlite", "client-level")
    rows = ledger.rows()
    sigma = rows[0]["sigma"]
    assert [r["sigma"] for r in rows] == [sigma, sigma] and recs[2]["sigma_released"] >= sigma
    assert max(rows[-1]["eps_gdp"], rows[-1]["eps_tight"]) <= 6.0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert "an observer of the aggregate only" in summary["privacy"]
    assert "zero-out adjacency" in summary["privacy"]  # the aggregate shows how many replied


def test_replaying_the_published_seed_does_not_predict_the_sample(tmp_path):
    """The client sample comes from OS entropy and its state is never stored: two runs of one
    configuration (same published seed) draw different samples, and the checkpoint holds no
    sampler state. Clients here answer with zero increments (only the sampling is under test)."""

    def sampled_sets(out):
        seen: dict[int, set[int]] = {}

        def zero_client(msg, ctx):
            rnd = int(msg.content["config"]["round"])
            seen.setdefault(rnd, set()).add(ctx.node_id)
            zeros = {k: torch.zeros_like(v) for k, v in from_record(msg.content["global"]).items()}
            meta = {"mechanism": "fedavg", "release": "none", "noise-std": 0.0}
            return Message(train_reply(zeros, rnd, 10, {}, meta), reply_to=msg)

        cfg = preset("minilm-rt", **{**TINY, "num_clients": 8, "rounds": 3, "sample_rate": 0.5})
        federate(cfg.replace(eval_examples=8, out_dir=str(out)).check(), client=zero_client)
        return [frozenset(seen.get(r, ())) for r in (1, 2, 3)]

    first, second = sampled_sets(tmp_path / "a"), sampled_sets(tmp_path / "b")
    assert first != second  # equal with probability 2^-24
    with safe_open(tmp_path / "a" / CHECKPOINT_FILE, framework="pt") as fh:
        assert "rng" not in json.loads(fh.metadata()["loop"])


def test_private_runs_average_uniformly_and_refuse_clear_counts(tmp_path):
    """Under any DP mechanism a reply carries no example count (a clear count is not private), so
    the server averages with equal weights; a reply that sends one is rejected."""
    cfg = preset("minilm-rt", **TINY, mechanism="dp-adamw", sample_epsilon=8.0)
    cfg = cfg.replace(out_dir=str(tmp_path / "r")).check()
    _run_with_corrupt_node(cfg, lambda content: content["metrics"].__setitem__("num-examples", 50))
    r1 = records(tmp_path / "r")[1]
    assert r1["replied"] == 1 and "num-examples" in r1["rejected"][0]


def test_existing_run_directory_is_never_overwritten(minilm_run):
    before = (minilm_run / "metrics.jsonl").read_bytes()
    with pytest.raises(FedloraError, match="already holds a run"):
        simulate(preset("minilm-rt", **TINY).check(), minilm_run)
    assert (minilm_run / "metrics.jsonl").read_bytes() == before


def test_prism_local_steps_compose_with_client_level_release(tmp_path):
    """`--mechanism prism --release gaussian`: each node charges its own sample-level ledger every
    round (before training), the server charges the client-level one; both are reported apart."""
    cfg = preset(
        "minilm-rt",
        **{**TINY, "rounds": 2, "local_steps": 2},
        mechanism="prism",
        sample_epsilon=8.0,
        release="gaussian",
        noise_multiplier=0.8,
    ).check()
    run_dir = simulate(cfg, tmp_path / "r")
    recs = records(run_dir)
    assert [r["replied"] for r in recs[1:]] == [2, 2]
    for k in range(2):
        ledger = Ledger.open(run_dir / "nodes" / f"node-{k}" / "sample-ledger.sqlite", "sample-level")
        rows = ledger.rows()
        assert [(r["run"], r["round"], r["count"], r["status"]) for r in rows] == [
            ("1", 1, 2, "applied"),
            ("1", 2, 2, "applied"),
        ]
        assert rows[-1]["mechanism"] == "prism" and 0 < rows[-1]["eps_tight"] <= 8.0
    client_level = Ledger.open(run_dir / "ledger.sqlite", "client-level").rows()
    assert [r["round"] for r in client_level] == [1, 2]


def _run_with_node_dying(cfg, dying_partition: int = 2) -> None:
    """The federation where node ``dying_partition`` answers its first message, then never again."""
    client = load_component(CLIENT_APP)
    grid = None

    def dies_after_one_reply(msg: Message, ctx):
        reply = client(msg, ctx)
        if ctx.node_config["partition-id"] == dying_partition:
            grid.offline.add(ctx.node_id)
        return reply

    state_root = Path(cfg.out_dir).parent / "nodes"  # each node's ledgers, never the user's home
    grid = InProcessGrid(dies_after_one_reply, cfg.num_clients, to_flat(cfg), state_root=state_root)
    serve(grid, cfg)


def test_a_node_lost_mid_run_is_listed_as_a_dropout_and_the_run_finishes(tmp_path):
    cfg = preset("minilm-rt", **{**TINY, "num_clients": 3, "rounds": 2}).replace(out_dir=str(tmp_path / "r"))
    _run_with_node_dying(cfg.check())
    recs = records(tmp_path / "r")
    assert [(r["round"], r["replied"], r["dropouts"]) for r in recs[1:]] == [(1, 3, []), (2, 2, [1003])]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["dropouts"] == [{"round": 2, "nodes": [1003]}]


def test_too_few_replies_withhold_the_round_but_keep_its_charge(tmp_path):
    dp = dict(mechanism="dp-fedavg", noise_multiplier=2.0, clip=0.5, min_replies=3)
    cfg = preset("minilm-rt", **{**TINY, "num_clients": 3, "rounds": 2}, **dp).replace(
        out_dir=str(tmp_path / "r")
    )
    _run_with_node_dying(cfg.check())
    recs = records(tmp_path / "r")
    assert [(r["replied"], r["applied"]) for r in recs[1:]] == [(3, True), (2, False)]
    assert recs[2]["accuracy"] == recs[1]["accuracy"]  # nothing applied in round 2
    rows = Ledger.open(tmp_path / "r" / "ledger.sqlite", "client-level").rows()
    assert [(r["round"], r["status"]) for r in rows] == [(1, "applied"), (2, "withheld")]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["rounds_completed"] == 1 and summary["rounds_withheld"] == 1
    # local noise: accounted and labelled as zero-out adjacency, against the server too
    assert "zero-out adjacency" in summary["privacy"] and "the server included" in summary["privacy"]
    report = json.loads((tmp_path / "r" / "privacy.json").read_text())
    assert all(r["guarantee"].startswith("zero-out adjacency") for r in report["rounds"])
    assert any("who replied" in line for line in summary["not_covered"])


@pytest.mark.slow  # make test-all: a summary line; the node ledgers it reads are tested in tests/client/test_node_releases.py
def test_a_cross_silo_summary_reports_each_nodes_sample_level_epsilon(tmp_path, capsys):
    run_dir = tmp_path / "r"
    silo = dict(
        max_train_examples=200, eval_examples=40, rounds=1, local_steps=2, batch_size=8, max_length=16
    )
    simulate(preset("minilm-rt-silo", **silo).check(), run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    nodes = summary["node_privacy"]
    assert [n["node"] for n in nodes] == [0, 1, 2, 3]
    for n in nodes:
        ledger = Ledger.open(run_dir / "nodes" / f"node-{n['node']}" / "sample-ledger.sqlite", "sample-level")
        assert n["eps_tight"] == pytest.approx(ledger.report()["eps_tight"]) and 0 < n["eps_tight"] <= 3.0
        ledger.close()
    assert summary["privacy"].startswith("none") and summary["sample_privacy"].startswith("sample-level")
    assert "node 3" in capsys.readouterr().out


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.slow  # make test-all: the progress display; make test keeps the round lines of the other runs
def test_a_terminal_sees_each_rounds_clients_the_evaluation_and_a_time_estimate(
    tmp_path, monkeypatch, capsys
):
    """On a terminal: a bar per round's clients (``round 1 train``, 2 of 2, with its rate) and per
    evaluation, and after round 1 an estimate of the time left; off a terminal (CI, a pipe, a log)
    no bar at all, the estimate all the same."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    simulate(preset("minilm-rt", **{**TINY, "rounds": 2}).check(), tmp_path / "tty")
    shown = terminal.getvalue()
    assert "round 1 train" in shown and "2/2" in shown and "client/s" in shown
    assert "round 2 train" in shown and "evaluating" in shown
    assert re.search(
        r"about \d+ s for the 1 round left \(\d+\.\d s a round so far\)", capsys.readouterr().out
    )
    monkeypatch.undo()
    simulate(preset("minilm-rt", **{**TINY, "rounds": 2}).check(), tmp_path / "log")
    captured = capsys.readouterr()
    assert "round 1 train" not in captured.err and "evaluating" not in captured.err
    assert "for the 1 round left" in captured.out
