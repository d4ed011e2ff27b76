"""The data a run actually used (issue: a card said "4 clients (iid partition of rotten-tomatoes)"
although the nodes trained on their own files and 2 of 4 refused): the train reply's optional
``data-source`` (common/wire.py), its count per round (server/round.py) and per run
(server/summary.py ``data_used``), and the model card's Training paragraph (server/model_card.py),
which names a ``--dataset`` file by its base name only."""

from __future__ import annotations

import json
import re
import uuid

import pytest
import torch
from flwr.app import ConfigRecord, Context, Error, Message, RecordDict

from client.app import release_reply, reply_of
from common.errors import FedloraError
from common.presets import preset
from common.wire import DATA_SOURCE, TrainInstruction, data_source, parse_train_reply, train_reply
from server.model_card import model_card
from server.releases import make_release
from server.round import RoundContext, run_round
from server.summary import data_used, format_summary
from tests.harness import TINY, card_summary, federate, message_identity, records

SHAPES = {"l.A": (4, 2), "l.B": (3, 2)}
EXPECTED = {"mechanism": "fedavg", "release": "none", "noise-std": 0.0}
REFUSAL = "this node joins only dp-adamw runs; this run is fedavg"
ABSOLUTE = re.compile(r"(?<![\w.~-])/[^\s'\"/)]+/")  # a POSIX path from the root, e.g. /tmp/x/...


def _paragraph(card: str) -> str:
    """The Training section's text."""
    return card.split("## Training\n\n", 1)[1].split("\n## ", 1)[0]


# --- the wire --------------------------------------------------------------------------------------
def _reply(content: RecordDict) -> Message:
    message_identity()
    ins = Message(RecordDict(), dst_node_id=1001, message_type="train", group_id="3")
    ins.metadata.__dict__["_message_id"] = "x"
    return Message(content, reply_to=ins)


@pytest.mark.parametrize(
    "node_config, source",
    [
        ({"data-path": "/srv/owner/secret-reviews.jsonl", "partition-id": 0}, "own"),
        ({"partition-id": 1}, "partition"),
    ],
)
def test_the_train_reply_says_where_the_data_came_from_and_never_the_path(node_config, source):
    """client/app.py's reply builder -> common.wire: ``data-source`` round-trips; the reply names no
    path or file of the node's."""
    cfg = preset("minilm-rt", mechanism="fedavg")
    state = {k: torch.full(s, 0.5) for k, s in SHAPES.items()}
    ins = TrainInstruction(3, {k: torch.zeros(s) for k, s in SHAPES.items()})
    context = Context(1, 1001, node_config, RecordDict(), {})
    out = reply_of(state, ins, cfg, torch.device("cpu"), context, 10, {"train-loss": 0.5})
    content = release_reply(ins, cfg, context, out)
    assert content["meta"][DATA_SOURCE] == source
    msg = _reply(content)
    increment, weight, _ = parse_train_reply(msg, 3, SHAPES, EXPECTED)
    assert weight == 10 and set(increment) == set(SHAPES)
    assert data_source(msg) == source
    text = repr(dict(content["meta"])) + repr(dict(content["metrics"]))
    assert "secret-reviews" not in text and "/srv" not in text


@pytest.mark.parametrize("value", [None, "elsewhere", "OWN", 5, True, ["own"]])
def test_a_missing_or_odd_data_source_is_unstated_never_a_rejection(value):
    """The key is optional: an older client's reply (none) or any other value still parses."""
    meta = {**EXPECTED} if value is None else {**EXPECTED, DATA_SOURCE: value}
    content = train_reply({k: torch.ones(s) for k, s in SHAPES.items()}, 3, 5, {}, meta)
    msg = _reply(content)
    parse_train_reply(msg, 3, SHAPES, EXPECTED)
    assert data_source(msg) is None
    assert data_source(_reply(RecordDict({"meta": ConfigRecord({DATA_SOURCE: "own"})}))) == "own"


# --- a round with canned replies, its summary and card ------------------------------------------------
class _Grid:
    """Each node answers with ``answer(node, msg)``: a reply Message."""

    def __init__(self, answer) -> None:
        self.answer = answer

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            replies.append(self.answer(msg.metadata.dst_node_id, msg))
        return replies


def _policy_error(msg: Message) -> Message:
    """A SuperNode's error reply for a ClientApp that raised a node-policy refusal (Flower's format)."""
    reason = f"<class 'common.errors.FedloraError'>:<'node policy: {REFUSAL}'>"
    return Message(Error(code=2, reason=reason), reply_to=msg)


def test_a_round_counts_own_data_and_refusals_per_node_and_the_card_says_so():
    """4 nodes sampled: 2 train on their own data, 2 refuse under their policy. The round's line
    names them, the summary counts distinct nodes, the card states it (and no partition)."""
    message_identity()
    cfg = preset("minilm-rt", mechanism="fedavg", partition="iid", num_clients=4, min_replies=1)

    def answer(node: int, msg: Message) -> Message:
        if node in (1003, 1004):
            return _policy_error(msg)
        meta = {**EXPECTED, DATA_SOURCE: "own"}
        return Message(
            train_reply({n: torch.ones(s) for n, s in SHAPES.items()}, 1, 5, {}, meta), reply_to=msg
        )

    state = {n: torch.zeros(s) for n, s in SHAPES.items()}
    lines = [{"round": 0, "phase": "initial"}]
    for rnd in (1, 2):
        grid = _Grid(lambda node, msg, rnd=rnd: _retag(answer(node, msg), rnd))
        ctx = RoundContext(grid, make_release(cfg, None), cfg, SHAPES)
        state, record = run_round(ctx, rnd, [1001, 1002, 1003, 1004], state)
        line = json.loads(json.dumps(record.to_json()))  # as metrics.jsonl holds it
        assert line["data_sources"] == {"own": [1001, 1002]} and line["rejected_nodes"] == [1003, 1004]
        assert record.replied == 2 and len(record.rejected) == 2
        lines.append(line)
    counts = data_used(lines)
    assert counts == {
        "nodes_sampled": 4,
        "nodes_own_data": 2,
        "nodes_partition_data": 0,
        "nodes_unstated_data": 0,
        "nodes_refused": 2,
        "refusals": [f"node policy: {REFUSAL}"],
        "nodes_rejected": 0,
        "rejections": [],
        "nodes_silent": 0,
    }
    training = _paragraph(model_card(cfg, card_summary(**counts), 2))
    assert (
        f"4 nodes sampled; 2 trained on their own data files, 0 on their iid partition of rotten-tomatoes; "
        f"2 refused the run (node policy: {REFUSAL})." in training
    )
    assert "(iid partition of rotten-tomatoes)" not in training  # not what the nodes trained on
    console = format_summary(
        {
            **card_summary(**counts),
            "model": "minilm-l6",
            "mechanism": "fedavg",
            "rounds_skipped": 0,
            "sample_rate": 1.0,
            "bytes_down_per_round": 0,
            "bytes_up_per_round": 0,
            "wall_time_s": 1.0,
            "adapter": "a",
            "metrics_file": "m",
        }
    )
    assert f"2 on their own data, 0 on their partition | 2 refused: node policy: {REFUSAL}" in console


def _retag(reply: Message, rnd: int) -> Message:
    """A canned train reply for round ``rnd`` (error replies carry no round)."""
    if not reply.has_error():
        reply.content["meta"]["round"] = rnd
    return reply


def test_a_card_for_two_own_two_refused_of_four_says_so():
    cfg = preset("minilm-rt", mechanism="fedavg", partition="iid")
    summary = card_summary(
        nodes_sampled=4,
        nodes_own_data=2,
        nodes_partition_data=0,
        nodes_unstated_data=0,
        nodes_refused=2,
        refusals=[f"node policy: {REFUSAL}"],
        nodes_rejected=0,
        rejections=[],
        nodes_silent=0,
    )
    training = _paragraph(model_card(cfg, summary, 2))
    assert "4 clients, Poisson sample rate 1," in training
    assert (
        "Data actually used: 4 nodes sampled; 2 trained on their own data files, 0 on their iid "
        f"partition of rotten-tomatoes; 2 refused the run (node policy: {REFUSAL})." in training
    )


def test_a_plain_simulations_card_reads_as_before():
    """Every node on its partition (or a summary written before the new keys): the same sentence."""
    cfg = preset("minilm-rt", mechanism="fedavg", partition="iid")
    before = (
        "Federated LoRA fine-tuning with fedlora-dp: 4 clients (iid partition of rotten-tomatoes), "
        "Poisson sample rate 1, 2 rounds of 20 local step(s) of 16 examples; mechanism `fedavg`, "
        f"LoRA rank {cfg.rank}, seed {cfg.seed}.\n"
    )
    plain = dict(nodes_sampled=4, nodes_partition_data=4, nodes_own_data=0, refusals=[], rejections=[])
    for summary in (card_summary(), card_summary(**plain)):
        training = _paragraph(model_card(cfg, summary, 2))
        assert training.startswith(before) and "Data actually used" not in training


@pytest.mark.parametrize("kind", ["file", "directory"])
def test_a_file_datasets_card_names_its_base_name_and_real_partition_and_no_path(tmp_path, kind):
    name = "reviews.csv" if kind == "file" else "reviews"
    dataset = tmp_path / "owner" / "data" / name
    cfg = preset(
        "minilm-rt", mechanism="fedavg", dataset=str(dataset), partition="natural", partition_by="user_id"
    )
    summary = card_summary(
        dataset=str(dataset),
        dataset_rows=1234,
        dataset_classes=3,
        nodes_sampled=3,
        nodes_own_data=0,
        nodes_partition_data=2,
        nodes_refused=1,
        refusals=[f"node policy: {REFUSAL}"],
    )
    card = model_card(cfg, summary, 3)
    training = _paragraph(card)
    assert f"4 clients (natural partition of {name}, one client per value of user_id)" in training
    assert f"The dataset is the file {name} (1,234 rows, 3 classes)." in training
    assert f"2 on their natural partition of {name}, one client per value of user_id" in training
    assert f"examples of {name}:" in card  # the evaluation section too
    assert str(tmp_path) not in card and "owner" not in card and not ABSOLUTE.search(card), card


def test_reasons_are_one_line_without_paths():
    lines = [
        {
            "round": 1,
            "phase": "train",
            "rejected": [
                "client error: FedloraError: /home/owner/private/mine.jsonl: no training examples\nafter tokenisation",
                "reply for round 2, expected 1",
            ],
            "rejected_nodes": [7, 8],
            "data_sources": {"partition": [9], "unstated": [10]},
            "dropouts": [11],
        },
        {"round": 2, "phase": "train", "rejected": ["client error: crashed"]},  # before rejected_nodes
    ]
    counts = data_used(lines)
    assert counts["refusals"] == ["mine.jsonl: no training examples after tokenisation", "crashed"]
    assert counts["rejections"] == ["reply for round 2, expected 1"]
    assert (counts["nodes_sampled"], counts["nodes_refused"], counts["nodes_rejected"]) == (5, 1, 1)
    assert (counts["nodes_partition_data"], counts["nodes_unstated_data"], counts["nodes_silent"]) == (
        1,
        1,
        1,
    )
    cfg = preset("minilm-rt", mechanism="fedavg", partition="iid")
    training = _paragraph(model_card(cfg, card_summary(**counts), 2))
    assert (
        "1 answered with an error (mine.jsonl: no training examples after tokenisation; crashed)" in training
    )
    assert "1 sent replies the server rejected (reply for round 2, expected 1); 1 never answered." in training
    assert "/home" not in training


# --- an in-process federation: one node on its own data, one refusing, one on its partition -------------
@pytest.mark.integration
def test_a_federation_with_own_data_and_a_refusing_node_says_so(tmp_path):
    own = tmp_path / "owner" / "mine.jsonl"
    own.parent.mkdir()
    pairs = [("A warm, funny film.", 1), ("Tedious and far too long.", 0)] * 12
    own.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in pairs), encoding="utf-8")
    cfg = preset("minilm-rt", **{**TINY, "num_clients": 3}, partition="iid", mechanism="fedavg")
    cfg = cfg.replace(out_dir=str(tmp_path / "r")).check()

    def nodes(client, msg: Message, ctx):
        if ctx.node_id == 1001:  # a data owner's node: its own file
            ctx.node_config["data-path"] = str(own)
        if ctx.node_id == 1002:  # a node whose policy takes only dp-adamw runs
            ctx.node_config["mechanism"] = "dp-adamw"
        try:
            return client(msg, ctx)
        except FedloraError as exc:  # what a SuperNode sends for a ClientApp that raised
            return Message(Error(2, f"<class 'common.errors.FedloraError'>:<'{exc}'>"), reply_to=msg)

    federate(cfg, nodes)
    r1 = records(tmp_path / "r")[1]
    assert r1["data_sources"] == {"own": [1001], "partition": [1003]} and r1["rejected_nodes"] == [1002]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (summary["nodes_own_data"], summary["nodes_partition_data"], summary["nodes_refused"]) == (1, 1, 1)
    assert summary["refusals"] == [f"node policy: {REFUSAL}"]
    card = (tmp_path / "r" / "adapter" / "README.md").read_text()
    assert (
        "3 nodes sampled; 1 trained on its own data file, 1 on its iid partition of rotten-tomatoes; "
        f"1 refused the run (node policy: {REFUSAL})." in card
    )
    assert "mine.jsonl" not in card and str(tmp_path) not in card
