"""The batched cohort engine (client/cohort.py, client/cohort_round.py) against the sequential one.

Equivalence is exact math, so it is checked where rounding cannot hide a bug: plain SGD in fp32 (the
update is linear in the gradient: to 1e-6), AdamW in fp64 (Adam divides by √v, which turns fp32
rounding of near-zero gradients into lr-sized differences: to 1e-9). The base's dropout is off
(the cohort draws its masks over its own batch layout; see client/cohort.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import client.app as client_app
from client.cohort import CohortUnsupported, Member, train_cohort
from client.node.state import client_ledger
from common.config import to_flat
from common.cores import available_cores
from common.lazy import load_component
from common.models import adapter_state, load_adapter_state
from common.models.lora import lora_layers
from common.presets import preset
from common.runtime import open_model, open_split
from common.tasks.classifier import ClassifierTask
from common.tasks.training import StepSchedule, Trainee, train_steps
from server.inprocess import InProcessGrid
from server.simulate import CLIENT_APP, COHORT
from tests.conftest import randomize_lora, run_cli
from tests.harness import TINY, LmTask, records, serve

#: client sizes: equal, smaller than the batch, a single example
SIZES = (10, 10, 5, 10, 3, 1)


@pytest.fixture()
def no_dropout(minilm):
    """MiniLM with every dropout off for the test (attention's reads ``nn.Dropout.p`` too)."""
    drops = [m for m in minilm.model.modules() if isinstance(m, nn.Dropout)]
    before = [m.p for m in drops]
    for m in drops:
        m.p = 0.0
    yield minilm
    for m, p in zip(drops, before, strict=True):
        m.p = p


def _reviews(task: ClassifierTask, n: int) -> list[dict]:
    texts = [f"this film is {'good' if i % 2 else 'bad'} and" + " very" * (i % 11) for i in range(n)]
    return task.encode(texts, [i % 2 for i in range(n)])


def _start(model: nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    state = adapter_state(model)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in state.items()}


def _members(examples, start, steps: int, optimizer: str) -> list[Member]:
    out, at = [], 0
    for i, n in enumerate(SIZES):
        out.append(Member(examples[at : at + n], StepSchedule(steps, 8, 1e-2, 100 + i, optimizer, 4), start))
        at += n
    return out


def _sequential(model, task, members: list[Member]) -> list[tuple[dict, dict]]:
    out = []
    for m in members:
        load_adapter_state(model, m.start)
        metrics = train_steps(Trainee(model, task, m.examples, torch.device("cpu")), m.schedule)
        out.append((adapter_state(model), metrics))
    return out


def _assert_same(seq, batched, start, tol: float) -> None:
    for (s, ms), (b, mb) in zip(seq, batched, strict=True):
        assert set(s) == set(b)
        moved = max(float((s[k] - start[k]).abs().max()) for k in s)
        assert moved > 100 * tol  # the clients trained
        assert max(float((s[k] - b[k]).abs().max()) for k in s) < tol
        assert ms["train-loss"] == pytest.approx(mb["train-loss"], rel=1e-5)


@pytest.mark.parametrize("steps", [1, 3])
def test_a_minilm_cohort_takes_each_clients_own_sgd_steps(no_dropout, steps):
    """Unequal clients (one smaller than its batch, one of a single example), chunks of 4 clients,
    forwards of at most 128 padded tokens: each client's adapter and loss are its sequential run's."""
    bundle = no_dropout
    task = ClassifierTask(bundle.tokenizer, 64)
    start = _start(bundle.model)
    members = _members(_reviews(task, sum(SIZES)), start, steps, "sgd")
    seq = _sequential(bundle.model, task, members)
    _assert_same(
        seq, train_cohort(bundle.model, task, bundle.device, members, tokens=128, clients=4), start, 1e-6
    )


def test_a_cohort_takes_each_clients_own_adamw_steps_in_fp64(no_dropout):
    bundle = no_dropout
    task = ClassifierTask(bundle.tokenizer, 64)
    bundle.model.double()
    try:
        start = _start(bundle.model)
        members = _members(_reviews(task, sum(SIZES)), start, 3, "adamw")
        seq = _sequential(bundle.model, task, members)
        _assert_same(seq, train_cohort(bundle.model, task, bundle.device, members), start, 1e-9)
    finally:
        bundle.model.float()


def test_a_language_model_cohort_matches_its_sequential_runs(tiny_llama):
    """A causal LM (LoRA on q/v of a random Llama), next-token loss, unequal lengths and clients."""
    randomize_lora(tiny_llama)
    gen = torch.Generator().manual_seed(3)
    examples = [
        {"ids": torch.randint(0, 500, (int(n),), generator=gen).tolist()} for n in [9, 12, 7, 16] * 10
    ]
    start = adapter_state(tiny_llama)
    members = _members(examples, start, 2, "sgd")
    seq = _sequential(tiny_llama, LmTask(), members)
    _assert_same(seq, train_cohort(tiny_llama, LmTask(), torch.device("cpu"), members), start, 1e-6)


def test_a_cohort_refuses_what_it_cannot_train_as_one(no_dropout):
    bundle = no_dropout
    start = adapter_state(bundle.model)
    examples = _reviews(ClassifierTask(bundle.tokenizer, 64), 4)
    members = [
        Member(examples, StepSchedule(2, 4, 1e-2, 0, "sgd"), start),
        Member(examples, StepSchedule(2, 4, 1e-3, 1, "sgd"), start),  # another learning rate
    ]
    with pytest.raises(CohortUnsupported, match="share steps, lr and optimizer"):
        train_cohort(bundle.model, ClassifierTask(bundle.tokenizer, 64), bundle.device, members)
    assert lora_layers(bundle.model)  # and the model is untouched: its layers' own forward again
    assert all("forward" not in vars(layer) for layer in lora_layers(bundle.model).values())


# -- through the real ServerApp and ClientApp: the same increments handed to each transport, the same ledgers

NODES = 5


#: the ClientApp's release step, as imported (each run records through its own wrapper of it)
RELEASE = client_app.release_reply


def _federation(tmp_path, batched: bool, monkeypatch, failing: int | None = None, **change):
    """Run a federation sequentially or batched (fp32 base, SGD steps, every dropout off); returns
    (every increment a node handed its transport, by (round, node), the config, the run's folder).
    ``failing``: that node's shard is refused (its data path is not absolute)."""
    sent: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def recording(ins, cfg, context, out, prepared=None):
        sent[(ins.round, context.node_id)] = {k: v.clone() for k, v in out.increment.items()}
        return RELEASE(ins, cfg, context, out, prepared)

    monkeypatch.setattr(client_app, "release_reply", recording)
    run = tmp_path / ("batched" if batched else "sequential")
    values = {
        **TINY,
        "num_clients": NODES,
        "rounds": 2,
        "sample_rate": 1.0,
        "precision": "fp32",
        "client_optimizer": "sgd",
        "lr": 0.05,
        "out_dir": str(run / "run"),
    }
    cfg = preset("minilm-rt", **{**values, **change}).check()
    for module in open_model(cfg, open_split(cfg)).model.modules():  # the run's (cached) model
        if isinstance(module, nn.Dropout):
            monkeypatch.setattr(module, "p", 0.0)
    grid = InProcessGrid(
        load_component(CLIENT_APP),
        cfg.num_clients,
        to_flat(cfg),
        raise_errors=failing is None,
        state_root=run / "nodes",
        cohort=load_component(COHORT) if batched else None,
    )
    if failing is not None:
        grid.contexts[1001 + failing].node_config["data-path"] = "not/absolute.jsonl"
    serve(grid, cfg)
    return sent, cfg, run


THREAT_RUNS = {
    "fedavg": dict(mechanism="fedavg"),
    "central": dict(mechanism="dp-fedavg", threat_model="central", noise_multiplier=1.0, clip=0.5, rounds=1),
    "local": dict(mechanism="dp-fedavg", threat_model="local", noise_multiplier=1.0, clip=0.5, rounds=1),
    "distributed": dict(
        mechanism="dp-fedavg",
        threat_model="distributed",
        noise_multiplier=1.0,
        clip=0.5,
        min_replies=3,
        rounds=1,
    ),
    "secure": dict(
        mechanism="dp-fedavg",
        threat_model="secure-aggregation",
        target_epsilon=8.0,
        clip=0.5,
        min_replies=3,
        secagg_neighbours=4,
        max_participations=2,
        rounds=1,
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize(  # local and distributed (make test-all) hand the increment on as central does
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in ("local", "distributed") else n
        for n in sorted(THREAT_RUNS)
    ],
)
def test_a_batched_round_hands_each_transport_the_sequential_increment(
    tmp_path, monkeypatch, no_dropout, name
):
    """Every node's increment (what its transport then clips, noises or encodes; one round under
    noise, whose draws would make the next start elsewhere), the node's release ledger and a
    non-private run's metrics are the sequential engine's."""
    runs = [_federation(tmp_path, batched, monkeypatch, **THREAT_RUNS[name]) for batched in (False, True)]
    (seq, cfg, seq_dir), (bat, _, bat_dir) = runs
    assert sorted(seq) == sorted(bat) and len(seq) == NODES * cfg.rounds
    for key in [k for k in seq if not cfg.private or k[0] == 1]:  # noise makes later rounds' starts differ
        moved = max(float(seq[key][k].abs().max()) for k in seq[key])
        assert moved > 1e-3 and max(float((seq[key][k] - bat[key][k]).abs().max()) for k in seq[key]) < 1e-6
    for k in range(NODES):
        owner = f"rotten-tomatoes/{k}-of-{NODES}"
        rows = [client_ledger(d / "nodes" / f"node-{k}", owner, cfg.delta).rows() for d in (seq_dir, bat_dir)]
        assert rows[0] or not cfg.private
        drop = ("time", "run")
        assert [{c: v for c, v in r.items() if c not in drop} for r in rows[0]] == [
            {c: v for c, v in r.items() if c not in drop} for r in rows[1]
        ]
    if name == "fedavg":
        losses = [
            [r["train_loss"] for r in records(d / "run") if r["phase"] == "train"] for d in (seq_dir, bat_dir)
        ]
        assert losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.integration
def test_a_batched_round_that_skips_idle_nodes_trains_only_the_contributors(
    tmp_path, monkeypatch, no_dropout
):
    """Hidden participation with ``--idle-training skip`` under the batched engine: the cohort holds
    only the nodes whose coin came up, each of them hands its transport the increment it makes under
    the sequential engine with constant work, and every other node the zero update."""
    from client import cohort_round
    from common.privacy.participation import participation

    coins = [True, False, True, False, False]  # nodes 1001..1005, in the order they are admitted
    cohorts, real_cohort = [], cohort_round.train_cohort
    monkeypatch.setattr(
        cohort_round,
        "train_cohort",
        lambda model, task, device, members, *a: (
            cohorts.append(len(members)) or real_cohort(model, task, device, members, *a)
        ),
    )
    hidden = dict(THREAT_RUNS["secure"], threat_model="secure-aggregation-hidden", max_participations=0)
    runs = []
    for batched, idle_training in ((False, "train"), (True, "skip")):
        feed = iter(coins)
        monkeypatch.setattr(participation, "contributes", lambda rate, feed=feed: next(feed))
        runs.append(_federation(tmp_path, batched, monkeypatch, idle_training=idle_training, **hidden)[0])
    assert cohorts == [2]
    (worked, skipped), contributors = runs, {1001, 1003}
    assert sorted(worked) == sorted(skipped) == [(1, n) for n in range(1001, 1001 + NODES)]
    for (_, node), increment in worked.items():
        other = skipped[(1, node)]
        if node in contributors:
            assert max(float(increment[k].abs().max()) for k in increment) > 1e-3
            assert max(float((increment[k] - other[k]).abs().max()) for k in increment) < 1e-6
        else:
            assert all(not v.any() and not other[k].any() for k, v in increment.items())


@pytest.mark.slow  # make test-all: make test keeps the sequential dropout test (tests/server/test_federation.py)
@pytest.mark.integration
def test_one_failing_node_is_its_own_dropout_not_the_cohorts(tmp_path, monkeypatch):
    sent, cfg, run = _federation(tmp_path, True, monkeypatch, failing=2, mechanism="fedavg", min_replies=2)
    assert {node for _, node in sent} == {1001, 1002, 1004, 1005}
    last = records(run / "run")[-1]
    assert last["round"] == cfg.rounds


# -- the engine as users choose it: fedlora simulate --engine, and the bench that compares them


def test_auto_runs_the_engine_measured_faster_on_the_device(monkeypatch):
    from server import simulate

    cfg = preset("minilm-rt", device="cpu")
    assert simulate.engine_of(cfg) == "sequential"
    assert simulate.engine_of(cfg.replace(engine="batched")) == "batched"
    monkeypatch.setattr(simulate, "resolve_device", lambda name: torch.device("cuda"))
    assert simulate.engine_of(cfg.replace(device="cuda")) == "batched"


def test_workers_default_to_one_per_gpu_on_cuda(monkeypatch):
    from server import workers

    monkeypatch.setattr(workers, "resolve_device", lambda name: torch.device(name))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert workers.resolve_workers(0, "cuda") == 3 and workers.resolve_workers(2, "cuda") == 2
    assert workers.resolve_workers(0, "cpu") == available_cores()


@pytest.mark.slow  # make test-all: real processes; make test keeps the in-process batched rounds and bench scale
@pytest.mark.process
def test_simulate_batched_over_two_workers_trains_every_sampled_client(tmp_path):
    """`fedlora simulate --engine batched --workers 2`: each worker trains its share of the round as one
    cohort; every sampled node replies and the run learns its rounds."""
    out = tmp_path / "run"
    argv = ["simulate", "--preset", "minilm-rt", "--num-clients", "6", "--rounds", "2", "--local-steps", "2"]
    argv += ["--max-train-examples", "120", "--eval-examples", "20", "--engine", "batched", "--workers", "2"]
    assert run_cli([*argv, "--out", str(out)]) == 0
    rounds = [r for r in records(out) if r["phase"] == "train"]
    assert len(rounds) == 2 and all(r["replied"] == r["sampled"] > 0 and not r["dropouts"] for r in rounds)


@pytest.mark.process
def test_bench_scale_compares_the_engines_side_by_side(capsys):
    """`fedlora bench scale --engine sequential,batched`: one row per engine, each with its per-client
    time, clients per second and speedup against the sequential fp32 one-worker row."""
    argv = ["bench", "scale", "--preset", "minilm-rt-xdev", "--populations", "2", "--cohort", "2"]
    argv += ["--rounds", "2", "--engine", "sequential,batched", "--precisions", "fp32"]
    argv += ["--workers", "1", "--json"]
    assert run_cli(argv) == 0
    result = json.loads(capsys.readouterr().out)
    rows = {r["engine"]: r for r in result["rows"]}
    assert set(rows) == {"sequential", "batched"} and rows["sequential"]["speedup"] == 1.0
    batched = rows["batched"]
    assert batched["speedup"] == pytest.approx(rows["sequential"]["client_s"] / batched["client_s"], rel=0.02)
    # clients_per_s is rounded to 2 decimals: ±0.005 where a slow machine makes it small
    assert batched["clients_per_s"] == pytest.approx(1 / batched["client_s"], rel=0.02, abs=0.0051)
    assert result["device"].startswith("cpu")
    assert run_cli([*argv[:-1], "--engine", "diagonal"]) != 0
