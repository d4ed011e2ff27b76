"""The packaged multiple-choice sets (common/data/multiple_choice.py) and their scorer
(common/tasks/multiple_choice.py): every set loads offline, known rows parse to their gold letter,
the held-out split is fixed and disjoint, and the scorer's log-likelihoods, acc and acc_norm equal a
hand computation on a tiny random Llama with SmolLM2's real tokenizer."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaForCausalLM

from common.data.conversation import loads
from common.data.multiple_choice import (
    EXCLUDED,
    HELD_OUT_FRACTION,
    INSTRUCTION,
    NOT_STATED,
    SETS,
    Item,
    answer_text,
    counts,
    data_root,
    lettered_options,
    load_set,
    parse_lettered,
    sample,
    source_files,
    to_json,
)
from common.models.lora import LoraSpec, attach_lora
from common.tasks.multiple_choice import (
    MultipleChoiceScorer,
    answered_letter,
    context_text,
    continuations,
    option_loglikelihoods,
)
from tests.conftest import randomize_lora, tiny_llama_config

#: one known row per format: (set, a phrase of its question, gold letter, option count, group)
KNOWN = [
    ("mmlu", "most rapid method to resynthesize ATP", "B", 4, "clinical"),
    ("mmlu", "Poplar City paid $5000 interest", "D", 4, "mixed"),
    ("medqa", "inadvertently cuts a flexor tendon", "C", 5, ""),
    ("medmcqa", "only complete cailage ring in the respiratory tree", "A", 4, "Anatomy"),
    ("pubmedqa", "first urinary albumin/creatinine ratio (acr)", None, 3, ""),
    ("commonsenseqa", "revolving door is convenient for two direction travel", "A", 5, ""),
    ("openbookqa", "afford a nice vacation at the end of the year", "B", 4, ""),
    ("piqa", "To fight Ivan Drago in Rocky for sega master system", "B", 2, ""),
    ("siqa", "What does Tracy need to do before this?", "C", 3, ""),
    ("logiqa", "Based on the above statement, which of the following can be derived?", "A", 4, ""),
    ("boolq", "do you have to be an all-star to be in the home run derby", "B", 2, ""),
    ("bigbench-anu", "Karen continued to yell at the cashier", "D", 5, ""),
    ("bigbench-disambiguationqa", "After meeting with the producers, Sam went to his office.", "B", 3, ""),
    ("bigbench-causal-judgment", "Did the CEO intentionally harm the environment?", "A", 2, ""),
]


def _find(name: str, phrase: str) -> Item:
    found = [item for item in load_set(name).items if phrase in item.question or phrase in item.passage]
    assert found, f"{name}: no item with {phrase!r}"
    return found[0]


@pytest.mark.parametrize("name", list(SETS))
def test_every_set_loads_offline_with_items_and_a_licence(name):
    loaded = load_set(name)
    assert len(loaded.items) > 0 and SETS[name].licence and SETS[name].note
    assert all(path.is_relative_to(data_root()) for path, _ in source_files(name))
    for item in loaded.items:
        letters = [letter for letter, _ in item.options]
        assert letters == [chr(ord("A") + k) for k in range(len(letters))] and len(letters) >= 2
        assert item.answer in letters and all(text for _, text in item.options)
    assert all(SETS[n].licence == NOT_STATED for n in SETS)  # the wheel states none for its data


def test_known_rows_parse_to_their_gold_letter_and_options():
    for name, phrase, gold, n_options, group in KNOWN:
        item = _find(name, phrase)
        assert len(item.options) == n_options and item.group == group, name
        if gold:
            assert item.answer == gold, name
    # PubMedQA: options yes / no / maybe; this row's label is in the file
    row = json.loads((data_root() / "PubMedQA/pqal/test.jsonl").read_text().splitlines()[0])
    item = _find("pubmedqa", KNOWN[4][1])
    assert [t for _, t in item.options] == ["yes", "no", "maybe"] and item.options[item.gold][1] == row[
        "answer"
    ]
    assert item.passage.startswith("Context (1):")
    assert _find("siqa", "What does Tracy").passage.startswith("Tracy didn't go home")


def test_parsing_is_robust_to_the_files_quirks():
    # MMLU options that span lines stay one option; a stray quote line (MedQA) is dropped
    assert lettered_options('A. x\n y\nB. z\n"') == (("A", "x\n y"), ("B", "z"))
    # CommonsenseQA: options open with a blank line; the last one carries the question's "?"
    row = {"question": "q", "options": "\nA. row boat\nB. sail boat?", "answer": "B. sail boat"}
    assert parse_lettered(row).answer == "B"
    assert parse_lettered({**row, "answer": "B"}).answer == "B"  # a bare letter
    assert parse_lettered({**row, "answer": "C. canoe"}) == "gold answer not among the options"
    assert parse_lettered({**row, "answer": "B. canoe"}) == "gold answer not among the options"
    assert parse_lettered({"question": "q", "options": "A. x\nB. y"}) == "no gold answer"
    assert parse_lettered({**row, "options": "\nC. a\nD. b"}) == "options unreadable"  # CSQA's one bad row
    assert load_set("commonsenseqa").skipped == {"options unreadable": 1}
    assert load_set("boolq").skipped == {"no gold answer": 3245}  # combined.jsonl's unlabelled test rows


def test_the_held_out_split_is_fixed_disjoint_and_about_a_fifth():
    totals = counts()
    for name, loaded in ((n, load_set(n)) for n in SETS):
        train, held_out = loaded.split()
        assert not {i.key for i in train} & {i.key for i in held_out}
        assert len(train) + len(held_out) == len(loaded.items) == len({i.key for i in loaded.items})
        assert totals[name] == {
            "train": len(train),
            "held_out": len(held_out),
            "skipped": sum(loaded.skipped.values()),
        }
    everything = sum(t["train"] + t["held_out"] for t in totals.values())
    assert abs(sum(t["held_out"] for t in totals.values()) / everything - HELD_OUT_FRACTION) < 0.01
    # a function of the content alone: rebuilt items (another set, another group) keep their side
    for item in load_set("openbookqa").items[:50]:
        twin = Item("other", item.question, item.options, "A", "g", item.passage)
        assert twin.held_out == item.held_out and twin.key == item.key
    # pinned: a change to the split would move these
    pinned = [
        _find("mmlu", KNOWN[0][1]),
        _find("mmlu", "take their own electric razor"),
        _find("medqa", KNOWN[2][1]),
    ]
    assert [item.held_out for item in pinned] == [False, True, False]
    assert sum(i.held_out for i in load_set("openbookqa").items) == totals["openbookqa"]["held_out"] == 110


def test_an_item_is_an_instruction_conversation():
    item = _find("mmlu", KNOWN[0][1])
    user, assistant = loads(to_json(item))
    assert user[0] == "user" and assistant == ("assistant", "B. phosphocreatine breakdown.")
    assert user[1] == (
        "The most rapid method to resynthesize ATP during exercise is through:\n\nA. glycolysis.\n"
        "B. phosphocreatine breakdown.\nC. tricarboxylic acid cycle (Krebs' cycle).\nD. glycogenolysis.\n\n"
        + INSTRUCTION
    )
    assert answer_text(item) == continuations(item)[item.gold]
    assert sample(load_set("mmlu").items, 3) == sample(list(reversed(load_set("mmlu").items)), 3)
    assert "HellaSwag/test.jsonl" in EXCLUDED and "ASDiv/test.jsonl" in EXCLUDED


@pytest.fixture(scope="module")
def tiny_peft_llama(smollm2_tokenizer):
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(len(smollm2_tokenizer), max_position_embeddings=512))
    model = attach_lora(model, LoraSpec(rank=4, targets=("q_proj", "v_proj")), "CAUSAL_LM")
    randomize_lora(model)
    return model.eval()


def _by_hand(model, tokenizer, item: Item, max_length: int | None = None) -> list[float]:
    """Each option's log-likelihood: one unpadded forward pass of context + continuation (the context
    cut from the left to ``max_length`` tokens in all), the log-softmax at each position before a
    continuation token, summed."""
    whole = tokenizer(context_text(tokenizer, item), add_special_tokens=False)["input_ids"]
    out = []
    for text in continuations(item):
        continuation = tokenizer(text, add_special_tokens=False)["input_ids"]
        context = whole[max(len(whole) + len(continuation) - (max_length or 10**9), 0) :]
        ids = torch.tensor([context + continuation])
        with torch.no_grad():
            logp = model(input_ids=ids).logits[0].float().log_softmax(-1)
        out.append(sum(float(logp[len(context) + t - 1, tok]) for t, tok in enumerate(continuation)))
    return out


def test_the_scorer_agrees_with_a_hand_computation(tiny_peft_llama, smollm2_tokenizer):
    model, tok = tiny_peft_llama, smollm2_tokenizer
    _, held_out = load_set("mmlu").split()
    items = [*sample(held_out, 4), _find("piqa", KNOWN[7][1])]  # 4-option items, and a 2-option one
    hand = [_by_hand(model, tok, item) for item in items]
    # a small token budget: several forward passes, items' options split across them, unequal lengths
    scored = option_loglikelihoods(model, tok, items, max_tokens=600)
    for mine, theirs in zip(scored, hand, strict=True):
        assert mine == pytest.approx(theirs, rel=1e-4)
    acc = sum(max(range(len(h)), key=h.__getitem__) == i.gold for h, i in zip(hand, items, strict=True))
    norm = [
        [ll / len(c.encode()) for ll, c in zip(h, continuations(i), strict=True)]
        for h, i in zip(hand, items, strict=True)
    ]
    acc_norm = sum(max(range(len(n)), key=n.__getitem__) == i.gold for n, i in zip(norm, items, strict=True))
    # a stubbed generation: right, right with ")", wrong letter, a word, a bare letter (end of text)
    stub = [f" {items[0].answer}. x", f"{items[1].answer}) y", "Z. no", "The answer", items[4].answer]
    model.train()
    result = MultipleChoiceScorer(tok, answers=lambda m, t, contexts: stub).score(model, items)
    assert model.training  # the scorer restores the mode it found
    assert result["acc"] == pytest.approx(acc / 5) and result["acc_norm"] == pytest.approx(acc_norm / 5)
    assert result["exact_match"] == pytest.approx(3 / 5) and result["answered"] == pytest.approx(3 / 5)
    assert result["items"] == 5


def test_a_context_cut_to_max_length_keeps_each_options_own_cut(tiny_peft_llama, smollm2_tokenizer):
    """An item longer than ``max_length`` loses context from the left, as many tokens as each option
    needs (a short option keeps more); the others share one context pass. Both agree with the hand
    computation on the cut sequence."""
    model, tok = tiny_peft_llama, smollm2_tokenizer
    _, held_out = load_set("mmlu").split()
    items = sample(held_out, 4)
    lengths = [len(tok(context_text(tok, i), add_special_tokens=False)["input_ids"]) for i in items]
    limit = sorted(lengths)[1] + 2  # the shortest item fits whole, the longer ones are cut
    scored = option_loglikelihoods(model, tok, items, max_tokens=600, max_length=limit)
    for item, mine in zip(items, scored, strict=True):
        assert mine == pytest.approx(_by_hand(model, tok, item, limit), rel=1e-4)


def test_the_exact_match_rule():
    assert [answered_letter(t) for t in ("B. text", " B)", "\nC", "B", "Bx", "b. x", "(B)", "Answer: B")] == [
        "B",
        "B",
        "C",
        "B",
        None,
        None,
        None,
        None,
    ]


def test_evaluate_reports_each_set_and_the_mean(tiny_peft_llama, smollm2_tokenizer):
    scorer = MultipleChoiceScorer(smollm2_tokenizer, answers=lambda m, t, contexts: ["A."] * len(contexts))
    result = scorer.evaluate(tiny_peft_llama, ["piqa", "boolq"], per_set=3)
    assert result["items"] == 6 and result["sets"] == 2
    assert result["exact_match"] == pytest.approx(
        (result["piqa/exact_match"] + result["boolq/exact_match"]) / 2
    )
    for name in ("piqa", "boolq"):  # "A." is gold exactly where the held-out items' answer is A
        held = sample(load_set(name).split()[1], 3)
        assert result[f"{name}/exact_match"] == pytest.approx(sum(i.answer == "A" for i in held) / 3)


def test_the_benchmark_corpus_holds_each_sets_items_with_a_balanced_held_out_split():
    """``instruct-mc``: every registered set's training items (at most TRAIN_PER_SET), then its
    held-out items (at most HELD_OUT_PER_SET) as the given test split, interleaved across sets; each
    text an item's conversation, labelled and grouped by its set; no held-out item in training."""
    from common.data.corpora import load_corpus
    from common.data.multiple_choice import HELD_OUT_PER_SET, TRAIN_PER_SET, items_by_text

    corpus = load_corpus("instruct-mc")
    assert (
        corpus.task == "multiple-choice" and corpus.label_names == tuple(SETS) and corpus.group_name == "set"
    )
    test = set(corpus.given_test)
    lookup = items_by_text()
    items = [lookup[text] for text in corpus.texts]
    assert all(items[i].held_out == (i in test) for i in range(len(corpus)))
    assert all(
        corpus.groups[i] == items[i].dataset == corpus.label_names[corpus.labels[i]]
        for i in range(len(corpus))
    )
    first = [corpus.groups[i] for i in corpus.given_test[: len(SETS)]]
    assert first == list(SETS)  # the held-out items interleave the sets
    for name in SETS:
        train, held = load_set(name).split()
        mine = [i for i in range(len(corpus)) if corpus.groups[i] == name]
        assert sum(i in test for i in mine) == min(len(held), HELD_OUT_PER_SET)
        assert sum(i not in test for i in mine) == min(len(train), TRAIN_PER_SET)


def test_the_balanced_benchmark_spreads_each_sets_training_answers_over_the_letters():
    """``instruct-mc-balanced`` (issue 76, the letter-prior diagnosis): the same corpus, each set's
    k-th training item relettered so its gold option sits at letter k mod its options; the same
    question, option texts and gold text; the held-out items and their order unchanged."""
    from collections import Counter

    from common.data.corpora import load_corpus
    from common.data.multiple_choice import items_by_text, relettered

    item = Item("x", "Which?", (("A", "one"), ("B", "two"), ("C", "three")), "B")
    assert relettered(item, 0).options == (("A", "two"), ("B", "three"), ("C", "one"))
    assert relettered(item, 0).answer == "A" and relettered(item, 2).options[2] == ("C", "two")
    assert relettered(item, 1) == item

    plain, balanced = load_corpus("instruct-mc"), load_corpus("instruct-mc-balanced")
    lookup = items_by_text()
    assert balanced.given_test == plain.given_test and balanced.labels == plain.labels
    held = set(plain.given_test)
    assert all(balanced.texts[i] == plain.texts[i] for i in held)
    for name in SETS:
        rows = [i for i in range(len(plain)) if plain.groups[i] == name and i not in held]
        golds: dict[int, Counter] = {}  # option count -> gold letters
        for i in rows:
            a, b = (loads(c.texts[i]) for c in (plain, balanced))
            assert a[0][1].split("\n")[0] == b[0][1].split("\n")[0]  # the same question's first line
            assert a[1][1].split(". ", 1)[1] == b[1][1].split(". ", 1)[1]  # the same gold text
            options = len(lookup[plain.texts[i]].options)
            golds.setdefault(options, Counter())[b[1][1][0]] += 1
        for n, letters in golds.items():  # every letter of n-option items gold equally often (up to one)
            counts_ = [letters.get(chr(ord("A") + k), 0) for k in range(n)]
            assert max(counts_) - min(counts_) <= 1, (name, n, letters)


def test_the_task_trains_on_answers_and_scores_its_held_out_items_per_set(tiny_peft_llama, smollm2_tokenizer):
    """MultipleChoiceTask: each example keeps its item; evaluation scores them per set (the mean over
    sets is ``accuracy``), beside the answers' perplexity."""
    from common.data.multiple_choice import to_json
    from common.tasks.multiple_choice import MultipleChoiceTask

    scorer = MultipleChoiceScorer(smollm2_tokenizer, answers=lambda m, t, contexts: ["A."] * len(contexts))
    task = MultipleChoiceTask(smollm2_tokenizer, 512, scorer)
    items = [*sample(load_set("piqa").split()[1], 2), *sample(load_set("openbookqa").split()[1], 3)]
    examples = task.encode([to_json(item) for item in items], [0] * len(items))
    assert [ex["item"] for ex in examples] == items
    assert all(
        task.tokenizer.decode(
            [i for i, y in zip(ex["ids"], ex["labels"], strict=True) if y != -100]
        ).startswith(f"{ex['item'].answer}. ")
        for ex in examples
    )
    result = task.evaluate(tiny_peft_llama, examples, torch.device("cpu"), 4)
    piqa, obqa = scorer.score(tiny_peft_llama, items[:2]), scorer.score(tiny_peft_llama, items[2:])
    assert result["accuracy/piqa"] == piqa["acc"] and result["exact_match/openbookqa"] == obqa["exact_match"]
    assert result["accuracy"] == pytest.approx((piqa["acc"] + obqa["acc"]) / 2)
    assert result["perplexity"] > 1 and task.metric == "accuracy"
