"""A node's hidden participation coin shows in nothing the server sees (issue 74, items 2 and 4).

Through the real ClientApp and the server's own train instruction (a hidden-participation secure
round, tests/server/test_secure_federation.py): a poisoned global adapter is refused before the coin
is drawn, a node whose training diverged sends the zero update whatever its coin (the sequential and
the batched engine alike), and the simulation's ``--idle-training skip`` reaches a node only through
the ``context.state`` its grid writes, never through node config, which a SuperNode's operator sets.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client import app as app_module
from client import cohort_round
from common.errors import FedloraError
from common.models import AdapterState
from common.privacy.participation import participation
from common.wire import MAX_GLOBAL_VALUE, TrainInstruction, to_record
from server.exchange import message_bytes
from server.inprocess import InProcessGrid
from server.workers import WorkerPoolGrid
from tests.server.test_secure_federation import _hidden_node

pytestmark = pytest.mark.integration

BAD = [math.nan, math.inf, 3e38]


def _outcome(client: Callable, msg: Message, context: Context) -> tuple[str, object]:
    """What the server sees of a node's answer: ``("reply", its bytes)`` or ``("error", the reason
    Flower sends for what it raised)``."""
    try:
        reply = client(msg, context)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"
    return ("error", reply.error.reason) if reply.has_error() else ("reply", message_bytes(reply))


def _coin(monkeypatch, coin: bool, drawn: list[bool] | None = None) -> None:
    """Force every hidden coin to ``coin`` (each draw recorded in ``drawn``)."""

    def contributes(rate: float) -> bool:
        if drawn is not None:
            drawn.append(coin)
        return coin

    monkeypatch.setattr(participation, "contributes", contributes)


def _sent(monkeypatch) -> list[AdapterState]:
    """The increments the node hands its transport, as they are handed (client/app.py ``reply_of``)."""
    sent, real = [], app_module.reply_of
    monkeypatch.setattr(
        app_module, "reply_of", lambda increment, *a: sent.append(increment) or real(increment, *a)
    )
    return sent


def _is_zero_update(increment: AdapterState) -> bool:
    return all(v.numpy().tobytes() == bytes(v.nbytes) for v in increment.values())


def test_real_adapters_lie_far_inside_the_range_a_node_accepts(tmp_path):
    """The bound a node checks the broadcast against (common/wire.py ``MAX_GLOBAL_VALUE``) is some
    five orders of magnitude beyond what a real adapter holds."""
    *_, train_message = _hidden_node(tmp_path, 1)
    state = TrainInstruction.from_record(train_message(1).content).global_state
    assert 0 < max(float(v.abs().max()) for v in state.values()) < MAX_GLOBAL_VALUE * 1e-4


@pytest.mark.parametrize("bad", BAD)
def test_a_poisoned_global_adapter_is_refused_before_the_coin(tmp_path, monkeypatch, bad):
    """One coordinate of the global adapter nan, inf or 3e38: the node refuses the round in one line,
    the same error whatever its coin, which it never draws."""
    client, grid, train_message = _hidden_node(tmp_path, 2)
    context = grid.contexts[min(grid.contexts)]
    monkeypatch.setattr(app_module, "_shard", lambda *a: pytest.fail("loaded its data"))
    outcomes, drawn = [], []
    for rnd, coin in ((1, False), (2, True)):
        _coin(monkeypatch, coin, drawn)
        msg = train_message(rnd)
        state = TrainInstruction.from_record(msg.content).global_state
        name = sorted(state)[len(state) // 2]
        state[name].view(-1)[7] = bad
        msg.content["global"] = to_record(state)
        outcomes.append(_outcome(client, msg, context))
    assert outcomes[0] == outcomes[1]
    kind, reason = outcomes[0]
    assert kind == "error" and reason.startswith("FedloraError: train instruction: global adapter")
    assert "\n" not in reason and drawn == []


@pytest.mark.parametrize("bad", BAD)
def test_a_node_whose_training_diverged_answers_alike_whatever_its_coin(tmp_path, monkeypatch, bad):
    """Local steps that end with a nan, inf or 3e38 in the adapter: a normal reply of the same size
    for either coin; a non-finite increment is not releasable, so the node hands its transport the
    zero update (+0.0 everywhere) even when its coin came up, and what it hands over is finite."""
    client, grid, train_message = _hidden_node(tmp_path, 2)
    context = grid.contexts[min(grid.contexts)]
    real_update = app_module.local_update

    def diverge(trainee, *a, **kw) -> dict:
        metrics = real_update(trainee, *a, **kw)
        with torch.no_grad():  # (the next message loads its global adapter over it)
            next(p for p in trainee.model.parameters() if p.requires_grad).view(-1)[3] = bad
        return metrics

    monkeypatch.setattr(app_module, "local_update", diverge)
    sent = _sent(monkeypatch)
    outcomes = []
    for rnd, coin in ((1, False), (2, True)):
        _coin(monkeypatch, coin)
        outcomes.append(_outcome(client, train_message(rnd), context))
    assert outcomes[0] == outcomes[1] and outcomes[0][0] == "reply"
    assert len(sent) == 2 and _is_zero_update(sent[0])
    assert all(bool(v.isfinite().all()) for increment in sent for v in increment.values())
    if not math.isfinite(bad):  # (3e38 may overflow in the increment's horizontal lift: zero too)
        assert _is_zero_update(sent[1])


def test_the_batched_engine_sends_a_diverged_nodes_zero_update_too(tmp_path, monkeypatch):
    """client/cohort_round.py ends its cohort's local steps in the same :func:`client.app.trained`: a
    contributor whose cohort training diverged replies normally, with the zero update."""
    _, grid, train_message = _hidden_node(tmp_path, 1)
    context = grid.contexts[min(grid.contexts)]
    _coin(monkeypatch, True)
    monkeypatch.setattr(
        cohort_round,
        "train_cohort",
        lambda model, task, device, members, *a: [
            ({k: torch.full_like(v, math.nan) for k, v in m.start.items()}, {}) for m in members
        ],
    )
    sent = _sent(monkeypatch)
    [outcome] = cohort_round.train_round([train_message(1)], [context])
    assert isinstance(outcome, Message) and not outcome.has_error()
    assert len(sent) == 1 and _is_zero_update(sent[0])


@pytest.mark.parametrize("value", [True, "true", "false"])
def test_a_node_config_that_turns_constant_work_off_is_refused(tmp_path, monkeypatch, value):
    """The old node config key ``simulated-skip-idle``, whatever its value: the node refuses the
    round in one line, before it draws its coin or loads its data."""
    client, grid, train_message = _hidden_node(tmp_path, 1)
    context = grid.contexts[min(grid.contexts)]
    context.node_config[participation.LEGACY_SKIP_IDLE] = value
    monkeypatch.setattr(participation, "contributes", lambda rate: pytest.fail("drew its coin"))
    monkeypatch.setattr(app_module, "_shard", lambda *a: pytest.fail("loaded its data"))
    with pytest.raises(FedloraError, match=r"^node config 'simulated-skip-idle' is not accepted") as err:
        client(train_message(1), context)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value", [True, "true", "false", "True", 1, "1"])
def test_skip_idle_is_the_bool_true_in_the_simulations_state_record(value):
    """Only the bool True in the node's :data:`~common.privacy.participation.participation.SIMULATION` record skips
    idle training: a string (``"false"`` included), a number or the key elsewhere never does."""
    state = RecordDict({participation.SIMULATION: ConfigRecord({participation.SKIP_IDLE: value})})
    assert participation.skips_idle(state) is (value is True)
    elsewhere = RecordDict({"other": ConfigRecord({participation.SKIP_IDLE: value})})
    assert participation.skips_idle(elsewhere) is participation.skips_idle(RecordDict()) is False


#: a ClientApp that answers what its node's context says of idle training
telling = ClientApp()


@telling.train()
def _tell(msg: Message, context: Context) -> Message:
    said = {
        "skip": participation.skips_idle(context.state),
        "in-node-config": participation.LEGACY_SKIP_IDLE in context.node_config,
    }
    return Message(RecordDict({"idle": ConfigRecord(said)}), reply_to=msg)


@pytest.mark.parametrize("idle_training", ["train", "skip"])
def test_the_simulations_skip_reaches_its_nodes_in_their_state_in_process_and_in_workers(idle_training):
    """The grid writes the run's ``idle-training`` into each node's ``context.state`` (never its node
    config); a worker pool ships that state with every message, so its nodes read the same."""
    run_config = {"idle-training": idle_training}
    want = {"skip": idle_training == "skip", "in-node-config": False}
    grid = InProcessGrid(telling, 2, run_config)
    for context in grid.contexts.values():
        assert participation.skips_idle(context.state) is want["skip"]
        assert participation.LEGACY_SKIP_IDLE not in context.node_config
    with WorkerPoolGrid("tests.client.test_coin_outcomes:telling", 3, run_config, 2) as pool:
        messages = [
            Message(RecordDict(), dst_node_id=n, message_type="train", group_id="1")
            for n in pool.get_node_ids()
        ]
        assert [dict(r.content["idle"]) for r in pool.send_and_receive(messages)] == [want] * 3
