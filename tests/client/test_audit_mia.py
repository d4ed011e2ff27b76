"""``fedlora audit mia`` end to end: canary examples in one local training run, or one canary in K
runs (client/audit/)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.harness import audit_json


def test_mia_canaries_are_seeded_random_vocabulary_texts():
    from transformers import AutoTokenizer

    from client.audit.mia import CANARY_TOKENS, canary_texts
    from common.models.registry import resolve_model

    tok = AutoTokenizer.from_pretrained(str(resolve_model("minilm-l6").locate()))
    texts, labels = canary_texts(tok, 40, 3, seed=1)
    assert (texts, labels) == canary_texts(tok, 40, 3, seed=1) and texts != canary_texts(tok, 40, 3, seed=2)[
        0
    ]
    assert len(set(texts)) == 40 and set(labels) == {0, 1, 2}
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    assert all(abs(len(i) - CANARY_TOKENS) <= 4 for i in ids)  # re-tokenising merges a few word pieces
    assert not set().union(*map(set, ids)) & set(tok.all_special_ids)


def test_audit_mia_rejects_bad_input_in_one_line(tmp_path, capsys):
    for argv, message in (
        (["--canaries", "9"], "at least 10 canaries"),
        (["--arms", "dp-sgd"], "unknown arm 'dp-sgd'"),
        (["--confidence", "1.5"], "--confidence must be in"),
    ):
        assert run_cli(["audit", "mia", *argv, "--out", str(tmp_path / "a")]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "a").exists()


@pytest.mark.heavy
def test_audit_mia_without_noise_finds_the_memorised_canaries(tmp_path, capsys):
    """Random-sequence canaries in a small non-private local run: the loss attack wins outright."""
    out = tmp_path / "mia"
    argv = ["--steps", "20", "--canaries", "20", "--arms", "no noise (non-private AdamW)", "--out", str(out)]
    (free,) = audit_json(argv, capsys, "mia")
    assert free["epsilon"] is None and free["mechanism"] == "none" and free["dataset"] == "bbc-news"
    assert free["auc"] >= 0.9 and free["eps_lower_bound"] > 0 and free["canaries"] == 20
    kept = json.loads((out / "arm-0" / "canaries.json").read_text())
    assert len(kept["scores"]) == 20 and sum(kept["included"]) == free["included"]
    assert run_cli(["audit", "mia", "--out", str(out)]) == 2  # never into an earlier audit
    assert "never writes into an earlier one" in capsys.readouterr().err


@pytest.mark.heavy
def test_audit_mia_plan_is_independent_of_the_inclusion_vector(tmp_path, monkeypatch):
    """The noise plan (N, hence q and σ) is made for the real examples + every canary: the same for
    two seeds whose inclusion vectors differ in size (9 and 3 of 10 canaries included)."""
    import client.audit.mia as mia
    from common.config import RunConfig
    from common.local_options import local_defaults

    planned, real_plan = [], mia.local_plan

    def plan(cfg, model, examples):
        planned.append(examples)
        return real_plan(cfg, model, examples)

    monkeypatch.setattr(mia, "local_plan", plan)
    monkeypatch.setattr(mia, "train_one", lambda *args, **kwargs: {})  # the plan is all this test needs
    base = {k: v for k, v in local_defaults().items() if v is not None}
    cfg = RunConfig(
        **{
            **base,
            "dataset": "bbc-news",
            "max_train_examples": 20,
            "batch_size": 8,
            "mechanism": "dp-adamw",
            "sample_epsilon": 3.0,
        }
    ).check()
    a, b = (mia.audit_run(cfg.replace(seed=s), 10, tmp_path / str(s), s, 0.95) for s in (0, 2))
    assert (a["included"], b["included"]) == (9, 3) and a["examples"] != b["examples"]
    assert planned == [a["plan_examples"]] * 2 == [b["plan_examples"]] * 2 == [a["examples"] + 1] * 2
    assert a["sample_rate"] == b["sample_rate"] and a["noise_multiplier"] == b["noise_multiplier"]


@pytest.mark.slow  # ≈ 2 minutes: a non-private and a dp-adamw run
def test_audit_mia_bound_stays_below_the_claim(tmp_path, capsys):
    arms = "no noise (non-private AdamW),dp-adamw ε=3"
    free, private = audit_json(
        ["--steps", "30", "--canaries", "40", "--arms", arms, "--out", str(tmp_path / "a")], capsys, "mia"
    )
    assert free["auc"] >= 0.9
    assert (
        private["epsilon"] == pytest.approx(3.0, abs=1e-3) and private["eps_lower_bound"] < private["epsilon"]
    )
    assert private["unit"].startswith("sample-level") and private["noise_multiplier"] > 0


@pytest.mark.slow  # ≈ 40 s (10 trainings); the bound's statistics are tested above
def test_audit_mia_k_models_without_noise(tmp_path, capsys):
    """One canary, 10 tiny non-private runs: every file and field is there and the canary separates
    (AUC; 10 models are too few for a positive 95 % bound)."""
    out = tmp_path / "k"
    argv = ["--examples", "10", "--steps", "5", "--models", "10", "--arms", "no noise (non-private AdamW)"]
    argv += ["--out", str(out)]
    (free,) = audit_json(argv, capsys, "mia")
    kept = json.loads((out / "arm-0" / "models.json").read_text())
    assert free["models"] == 10 == len(kept["scores"]) and free["models_in"] == sum(kept["included"])
    assert free["epsilon"] is None and 0 < free["models_in"] < 10 and free["auc"] >= 0.9
    assert run_cli(["audit", "mia", "--models", "5", "--out", str(tmp_path / "x")]) == 2
    assert "--models must be 0 (one run) or >= 10" in capsys.readouterr().err
