"""What the federation tests share: a tiny configuration, the in-process federation with an
optional wrapper around the ClientApp, the run's metrics lines, Flower's message identity, and a
data owner's instruction data written in each of its three forms (docs/instruction-tuning.md)."""

from __future__ import annotations

import contextlib
import csv
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from flwr.app import Context, Message, RecordDict

from common.config import RunConfig, to_flat
from common.lazy import load_component
from common.privacy.accounting.ledger import Charge
from server.inprocess import InProcessGrid
from server.outcome import NoRoundApplied
from server.simulate import CLIENT_APP, SERVER_APP

#: the smallest federation that trains: 2 MiniLM clients, 1 round of 2 local steps, 40 held-out examples,
#: the clients in the server's process (``workers`` 1: a spawned worker imports the whole stack, ~10 s
#: on 2 cores; results do not depend on it, tests/server/test_workers.py)
TINY = dict(
    num_clients=2,
    rounds=1,
    local_steps=2,
    batch_size=8,
    max_train_examples=200,
    eval_examples=40,
    seed=5,
    workers=1,
)

#: (real ClientApp, message, context) -> reply
Wrapper = Callable[[Callable, Message, Context], Message]


def federate(cfg: RunConfig, wrap: Wrapper | None = None, client: Callable | None = None) -> InProcessGrid:
    """Run the real ServerApp for ``cfg`` (``cfg.out_dir`` set) over an in-process grid; each reply
    passes through ``wrap(client_app, msg, ctx)`` when given, and ``client`` replaces the real
    ClientApp. Node k keeps its state in ``<out_dir>/../nodes/node-k``. Returns the grid."""
    app = client or load_component(CLIENT_APP)
    handler = app if wrap is None else (lambda msg, ctx: wrap(app, msg, ctx))
    grid = InProcessGrid(
        handler, cfg.num_clients, to_flat(cfg), state_root=Path(cfg.out_dir).parent / "nodes"
    )
    serve(grid, cfg)
    return grid


def serve(grid: InProcessGrid, cfg: RunConfig) -> None:
    """Run the real ServerApp for ``cfg`` over ``grid``. A run that applied no round fails the
    ServerApp (server/app.py, for Flower's run status); as in server/simulate.py, the test reads what
    became of it from the run directory instead."""
    with contextlib.suppress(NoRoundApplied):
        load_component(SERVER_APP)(grid, Context(1, 0, {}, RecordDict(), to_flat(cfg)))


def records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl lines."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def message_identity() -> None:
    """Set Flower's task identity so that tests can build Messages outside a running app."""
    InProcessGrid(lambda m, c: m, 0, {})


class LmTask:
    """Per-example mean next-token NLL on fixed token lists (no tokenizer needed)."""

    metric = "loss"

    def collate(self, examples, device):
        width = max(len(e["ids"]) for e in examples)
        ids = torch.zeros(len(examples), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, e in enumerate(examples):
            ids[i, : len(e["ids"])] = torch.tensor(e["ids"])
            mask[i, : len(e["ids"])] = 1
        return {"input_ids": ids.to(device), "attention_mask": mask.to(device)}

    def per_example_loss(self, model, batch):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logp = logits[:, :-1].log_softmax(-1)
        tgt, keep = batch["input_ids"][:, 1:], batch["attention_mask"][:, 1:].bool()
        picked = logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        return -(picked * keep).sum(1) / keep.sum(1).clamp(min=1)


def card_summary(**data) -> dict:
    """A run summary with the keys server/model_card.py reads (a 4-client, 2-round classification
    run, no privacy), ``data`` replacing or adding keys."""
    return {
        "num_clients": 4,
        "rounds_completed": 2,
        "dataset": "rotten-tomatoes",
        "metric": "accuracy",
        "before": {"accuracy": 0.5},
        "after": {"accuracy": 0.75},
        "eval_examples": 100,
        "privacy": "none (no client-level release)",
        "sample_privacy": "none (no sample-level)",
        "not_covered": ["who was sampled"],
        **data,
    }


def ledger_charge(rnd: int, sigma: float = 1.2, p: float = 0.5, run: str = "r1", **kw) -> Charge:
    """A client-level ledger charge of round ``rnd`` (central noise, dp-fedavg, 3 sampled) with
    ``kw`` changed."""
    values = dict(
        run=run,
        round=rnd,
        sigma=sigma,
        p=p,
        count=1,
        sample_rate=p,
        sampled=3,
        clip=1.0,
        threat_model="central",
        mechanism="dp-fedavg",
    )
    return Charge(**{**values, **kw})


# --- instruction data in its three forms: the same (prompt, answer, user) rows as alpaca JSONL, a
# prompt/completion CSV or chat JSONL

#: form -> the file name its rows are written to
FILES = {"alpaca": "sft.jsonl", "prompt-completion": "sft.csv", "chat": "chat.jsonl"}
FORMS = tuple(FILES)

InstructionRow = tuple[str, str, str]  # (prompt, answer, user)


def write_form(directory: Path, form: str, rows: Sequence[InstructionRow]) -> Path:
    """``rows`` in ``form`` under ``directory`` (a ``user`` column or field beside each row)."""
    path = directory / FILES[form]
    if form == "prompt-completion":
        with path.open("w", newline="") as fh:
            csv.writer(fh).writerows([("prompt", "completion", "user"), *rows])
        return path
    records = [
        {"instruction": q, "output": a, "user": u}
        if form == "alpaca"
        else {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}], "user": u}
        for q, a, u in rows
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


__all__ = [
    "FILES",
    "FORMS",
    "TINY",
    "LmTask",
    "card_summary",
    "federate",
    "message_identity",
    "records",
    "serve",
    "write_form",
]


def audit_json(argv: list[str], capsys, kind: str = "client") -> list[dict]:
    """``fedlora audit KIND --quick --json`` on a tiny federation (client) or client data (mia): one
    result per audited arm."""
    from tests.conftest import run_cli

    tiny = ["--clients", "2"] if kind == "client" else ["--examples", "20"]
    assert run_cli(["audit", kind, "--quick", *tiny, "--json", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines() if line.startswith("{")]
