"""The class names travel with the adapter (issue 53, item 3): a run on an own CSV saves the CSV's
label names as ``id2label``/``label2id`` in the adapter's fedlora.json, its model card lists them,
and both loading routes the card gives (``load_adapter``; PEFT alone on the base) give a model whose
``config.id2label`` names the classes and whose predicted names reproduce the card's accuracy on the
held-out examples."""

from __future__ import annotations

import csv
import json
import re

import pytest
import torch

from common.models.portable import SIDECAR, load_adapter
from common.presets import preset
from common.runtime import open_split
from server.model_card import model_card
from server.simulate import simulate
from tests.conftest import run_cli
from tests.harness import TINY, card_summary

HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
MOODS = ("calm", "angry", "sad")  # the loader sorts them: class 0 angry, 1 calm, 2 sad
WORDS = {"calm": "quiet gentle peaceful", "angry": "furious shouting rage", "sad": "tears grief lonely"}
ID2LABEL = {0: "angry", 1: "calm", 2: "sad"}


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """A TINY federation on a three-class own CSV: ``(config, run directory, text -> label name)``.
    Its frozen base runs in fp32 as the loaders below load it (``--precision auto`` is bf16 on a CPU
    with native bf16, and a bf16 evaluation can differ from an fp32 one on an example near a tie)."""
    root = tmp_path_factory.mktemp("labels")
    path, gold = root / "own.csv", {}
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["review", "mood"])
        for i in range(200):
            mood = MOODS[i % 3]
            text = f"note {i}: {WORDS[mood]} day number {i}"
            out.writerow([text, mood])
            gold[text] = mood
    cfg = preset(
        "small",
        **TINY,
        dataset=str(path),
        text_column="review",
        label_column="mood",
        precision="fp32",
        sample_rate=1.0,  # small's 0.5 over 2 nodes samples nobody in 1 round of 4: an untrained adapter
    ).check()
    return cfg, simulate(cfg, root / "run"), gold


def _held_out(cfg):
    split = open_split(cfg)
    return list(split.texts(split.test))


def _accuracy(model, tokenizer, cfg, gold) -> float:
    """Share of the run's held-out texts whose predicted class name (``model.config.id2label``) is
    the CSV's label for that text, in the server's batches of 16."""
    texts, hits = _held_out(cfg), 0
    for start in range(0, len(texts), 16):
        part = texts[start : start + 16]
        batch = tokenizer(part, return_tensors="pt", padding=True, truncation=True, max_length=cfg.max_length)
        with torch.no_grad():
            predicted = model(**batch).logits.argmax(1).tolist()
        hits += sum(model.config.id2label[p] == gold[t] for p, t in zip(predicted, part, strict=True))
    return hits / len(texts)


def _card_accuracy(run_dir) -> float:
    summary = json.loads((run_dir / "summary.json").read_text())
    card = (run_dir / "adapter" / "README.md").read_text()
    accuracy = summary["after"]["accuracy"]
    assert f"| after training | {accuracy:.4g} |" in card
    return accuracy


@pytest.mark.integration
def test_the_saved_adapter_and_its_card_carry_the_csvs_label_names(csv_run):
    _, run_dir, _ = csv_run
    sidecar = json.loads((run_dir / "adapter" / SIDECAR).read_text())
    assert sidecar["num_labels"] == 3
    assert sidecar["id2label"] == {str(i): name for i, name in ID2LABEL.items()}
    assert sidecar["label2id"] == {name: i for i, name in ID2LABEL.items()}
    card = (run_dir / "adapter" / "README.md").read_text()
    assert "Classes by index: 0 `angry`, 1 `calm`, 2 `sad`" in card
    assert "LABEL_" not in "".join(p.read_text() for p in (run_dir / "adapter").glob("*.json"))


@pytest.mark.integration
def test_load_adapter_names_the_classes_and_reproduces_the_cards_accuracy(csv_run):
    cfg, run_dir, gold = csv_run
    model, tokenizer = load_adapter(run_dir / "adapter")
    assert model.config.id2label == ID2LABEL
    assert model.config.label2id == {name: i for i, name in ID2LABEL.items()}
    assert _accuracy(model, tokenizer, cfg, gold) == pytest.approx(_card_accuracy(run_dir), abs=1e-9)


@pytest.mark.integration
def test_the_cards_peft_snippet_names_the_classes_and_reproduces_its_accuracy(csv_run):
    """The card's "With PEFT alone" code, run as written with its offline line (this machine is
    offline: the Hub id is pointed at the packaged weights the way the card says)."""
    cfg, run_dir, gold = csv_run
    card = (run_dir / "adapter" / "README.md").read_text()
    snippet = re.findall(r"```python\n(.*?)```", card, re.S)[-1]
    assert "from peft import PeftModel" in snippet and f'base_id = "{HUB_ID}"' in snippet
    snippet = snippet.replace("# offline: ", "")
    scope: dict = {}
    exec(snippet.replace("path/to/adapter", str(run_dir / "adapter")), scope)
    model = scope["model"].eval()
    assert model.config.id2label == ID2LABEL
    tokenizer = load_adapter(run_dir / "adapter")[1]
    assert _accuracy(model, tokenizer, cfg, gold) == pytest.approx(_card_accuracy(run_dir), abs=1e-9)


@pytest.mark.integration
def test_fedlora_predict_names_each_files_label_and_reproduces_the_cards_accuracy(csv_run, tmp_path, capsys):
    """Issue 75 item 11: `fedlora predict --adapter DIR --file F` labels every row by class name;
    over the run's held-out texts its predictions give the card's accuracy (the server's batches of
    16); `--json` gives each class's probability; `--text` labels one text."""
    cfg, run_dir, gold = csv_run
    texts = _held_out(cfg)
    held = tmp_path / "held.jsonl"
    held.write_text("".join(json.dumps({"review": t}) + "\n" for t in texts), encoding="utf-8")
    adapter = str(run_dir / "adapter")
    argv = ["predict", "--adapter", adapter, "--file", str(held), "--text-column", "review", "--json"]
    assert run_cli([*argv, "--batch-size", "16", "--max-length", str(cfg.max_length)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in rows] == texts
    accuracy = sum(r["label"] == gold[r["text"]] for r in rows) / len(rows)
    assert accuracy == pytest.approx(_card_accuracy(run_dir), abs=1e-9)
    for r in rows:
        assert set(r["scores"]) == set(MOODS) and sum(r["scores"].values()) == pytest.approx(1, abs=1e-5)
        assert r["label"] == max(r["scores"], key=r["scores"].get)
    assert run_cli(["predict", "--adapter", adapter, "--text", texts[0]]) == 0
    label, text = capsys.readouterr().out.rstrip("\n").split("\t")
    assert (label, text) == (rows[0]["label"], texts[0])


def test_fedlora_predict_refuses_what_it_cannot_label_in_one_line(tmp_path, capsys):
    causal = tmp_path / "lm"
    causal.mkdir()
    (causal / SIDECAR).write_text(json.dumps({"kind": "causal-lm"}))
    data = tmp_path / "t.csv"
    data.write_text("body\nhello\n")
    cases = [
        (["--adapter", str(causal), "--text", "hi"], "causal LM adapter: it has no classes to predict"),
        (["--adapter", str(tmp_path), "--file", str(data)], "no --text-column 'text' (columns: body)"),
        (["--adapter", str(tmp_path), "--text", "hi"], "is not a saved adapter"),
    ]
    for args, message in cases:
        assert run_cli(["predict", *args]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and message in err, err


def test_a_card_lists_the_labels_and_loads_them_and_a_causal_lm_card_lists_them_too():
    names = ("no", "it's `maybe`", "yes")
    card = model_card(preset("minilm-rt"), card_summary(), 3, (), names)
    assert "Classes by index: 0 `no`, 1 `` it's `maybe` ``, 2 `yes`" in card
    assert "id2label = {0: 'no', 1: \"it's `maybe`\", 2: 'yes'}" in card and "num_labels" not in card
    causal = model_card(preset("smollm2-rt"), card_summary(), None, (), ("negative", "positive"))
    assert "Classes by index: 0 `negative`, 1 `positive`" in causal and "id2label =" not in causal
    unnamed = model_card(preset("minilm-rt"), card_summary(), 2)  # nothing better known: LABEL_i
    assert "## Labels" not in unnamed and "num_labels=2" in unnamed
