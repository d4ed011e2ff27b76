"""Supervised fine-tuning on conversations (common/tasks/chat.py): the tokenizer's chat template,
the loss on assistant tokens only, truncation that never cuts the last response whole."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from common.data.conversation import dumps
from common.tasks.chat import FALLBACK_TEMPLATE, ChatTask
from tests.conftest import tiny_llama_config

CONVERSATION = (
    ("system", "You answer in one word."),
    ("user", "What colour is the sky?"),
    ("assistant", "Blue."),
    ("user", "And grass?"),
    ("assistant", "Green."),
    ("user", "Thanks"),  # after the last answer: carries no loss, dropped
)


@pytest.fixture(scope="module")
def task(smollm2_tokenizer):
    return ChatTask(smollm2_tokenizer, 256)


def _response_text(task: ChatTask, example: dict) -> str:
    return task.tokenizer.decode(
        [i for i, label in zip(example["ids"], example["labels"], strict=True) if label != -100]
    )


def test_the_template_renders_the_conversation_and_only_assistant_turns_are_labelled(task):
    example = task.encode([dumps(CONVERSATION)], [0])[0]
    rendered = task.tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in CONVERSATION[:-1]], tokenize=False
    )
    assert task.tokenizer.decode(example["ids"]) == rendered  # the model's own template, in full
    assert _response_text(task, example) == "Blue.<|im_end|>\nGreen.<|im_end|>\n"
    labelled = [k for k, label in enumerate(example["labels"]) if label != -100]
    assert all(example["labels"][k] == example["ids"][k] for k in labelled)
    assert "sky" not in _response_text(task, example) and "Thanks" not in task.tokenizer.decode(
        example["ids"]
    )


def test_a_tokenizer_without_a_template_gets_the_stated_fallback(smollm2_tokenizer):
    bare = copy.deepcopy(smollm2_tokenizer)
    bare.chat_template = None
    task = ChatTask(bare, 256)
    assert task.template == FALLBACK_TEMPLATE
    example = task.encode([dumps(CONVERSATION)], [0])[0]
    text = bare.decode(example["ids"])
    assert text.startswith("### System:\nYou answer in one word.\n\n### User:\nWhat colour is the sky?")
    assert _response_text(task, example) == f"Blue.{bare.eos_token}\n\nGreen.{bare.eos_token}\n\n"


def test_the_loss_reads_response_tokens_only(task):
    """The per-example loss is the mean NLL of the response tokens (a hand computation over them);
    moving the logits that predict a prompt token changes nothing, those predicting a response
    token change it."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_llama_config(len(task.tokenizer)))
    examples = task.encode([dumps(CONVERSATION), dumps(CONVERSATION[1:3])], [0, 0])
    batch = task.collate(examples, torch.device("cpu"))
    with torch.no_grad():
        loss = task.per_example_loss(model, batch)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    for b, example in enumerate(examples):
        positions = [k for k, label in enumerate(example["labels"]) if label != -100 and k > 0]
        logp = F.log_softmax(logits[b], -1)
        by_hand = -torch.stack([logp[k - 1, example["ids"][k]] for k in positions]).mean()
        assert float(loss[b]) == pytest.approx(float(by_hand), rel=1e-5)

    from common.tasks.verbalizer import token_nll

    target = batch["target"][0]
    predicts_prompt = next(k - 1 for k in range(1, len(target)) if target[k] == -100)
    predicts_response = next(k - 1 for k in range(1, len(target)) if target[k] != -100)
    for position, moves in ((predicts_prompt, False), (predicts_response, True)):
        shifted = logits.clone()
        shifted[0, position] += torch.randn(shifted.shape[-1])
        changed = float(token_nll(shifted, batch["target"])[0]) != pytest.approx(float(loss[0]), rel=1e-6)
        assert changed == moves


def test_truncation_keeps_the_last_response_and_counts_the_cuts(smollm2_tokenizer, caplog):
    long_prompt = (("user", "word " * 300), ("assistant", "Short answer."))
    long_answer = (("user", "Tell me."), ("assistant", "token " * 300))
    task = ChatTask(smollm2_tokenizer, 64)
    with caplog.at_level("DEBUG", logger="fedlora.tasks"):
        prompt_cut, answer_cut, whole = task.encode(
            [dumps(c) for c in (long_prompt, long_answer, CONVERSATION)], [0] * 3
        )
    assert all(len(e["ids"]) <= 64 for e in (prompt_cut, answer_cut, whole))
    assert _response_text(task, prompt_cut) == "Short answer.<|im_end|>\n"  # the prompt lost its start
    answer = _response_text(task, answer_cut)
    assert (
        answer.startswith("token token") and sum(label != -100 for label in answer_cut["labels"]) == 64 - 16
    )
    assert (task.truncated.cut, task.truncated.prompt_cut, task.truncated.response_cut) == (2, 2, 1)
    assert "2 of 3 conversations longer than --max-length 64" in caplog.text
    caplog.clear()
    with caplog.at_level("DEBUG", logger="fedlora.tasks"):
        task.encode([dumps(long_prompt)], [0])  # again in this process: no second warning
    assert [r.levelname for r in caplog.records] == ["DEBUG"]


def test_the_held_out_loss_applies_the_lm_head_at_the_answer_tokens_only(task, tiny_llama):
    """The evaluation's per-example loss (``target_nll``: hidden states, then the head at the labelled
    positions) equals the training loss's full-logits form, on a batch with prompts, padding and LoRA."""
    from common.tasks.base import logits_of, target_nll
    from common.tasks.verbalizer import token_nll
    from tests.conftest import randomize_lora

    randomize_lora(tiny_llama)
    examples = task.encode([dumps(CONVERSATION), dumps(CONVERSATION[1:3])], [0, 0])
    batch = task.collate(examples, torch.device("cpu"))
    assert (batch["target"] == -100).any() and (batch["target"] != -100).any()
    with torch.no_grad():
        full = token_nll(logits_of(tiny_llama, batch), batch["target"])
        kept = target_nll(tiny_llama, batch)
    assert torch.allclose(full, kept, rtol=1e-5, atol=1e-6) and kept.min() > 0
