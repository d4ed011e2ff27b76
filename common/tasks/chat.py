"""Supervised fine-tuning on conversations (instruction and chat data, issue 76): the tokenizer's chat
template applied, the loss on the assistant turns only, evaluated by their perplexity.

Each conversation (common/data/conversation.py) is rendered with the tokenizer's own chat template
(``tokenizer.apply_chat_template``), or, for a tokenizer without one, with :data:`FALLBACK_TEMPLATE`
(``### User:`` / ``### Assistant:`` headers, the end-of-sequence token closing each assistant
turn). The rendering is cut into segments at the boundaries of each assistant turn: the text the
template renders up to the turn's generation prompt (``add_generation_prompt=True``) is prompt, the
rest of the turn (its content and the template's end-of-turn tokens) is response. Segments are
tokenized one by one and concatenated, so that every token is either prompt (label -100: no loss)
or response (its own id: the loss), never both.

Truncation to ``max_length`` tokens keeps the last assistant turn and never cuts it whole: the
tokens before it are cut from the left (earliest first) while its response fits; a response longer
than what remains keeps its beginning, after at least a quarter of the window of prompt. Turns
after the last assistant turn carry no loss and are dropped. :meth:`ChatTask.encode` logs how many
conversations were cut, and how (:attr:`ChatTask.truncated`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.data.conversation import RESPONSE_ROLE, Conversation, loads
from common.tasks.base import Batch, pad, token_batch
from common.tasks.language_model import LanguageModelTask

log = logging.getLogger("fedlora.tasks")

#: the template of a tokenizer without a chat template (Jinja, as ``apply_chat_template`` takes it)
FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + ':\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant:\n' }}{% endif %}"
)


_WARNED: set[int] = set()  # the --max-length values whose truncation this process has warned of


@dataclass
class Truncation:
    """Counts of :meth:`ChatTask.encode`'s cuts: conversations seen, cut at all, with prompt tokens
    cut from the left, with the last response cut at its end."""

    conversations: int = 0
    cut: int = 0
    prompt_cut: int = 0
    response_cut: int = 0

    def line(self, max_length: int) -> str:
        return (
            f"{self.cut} of {self.conversations} conversations longer than --max-length {max_length}: "
            f"{self.prompt_cut} lost prompt tokens from the left, {self.response_cut} their last response's "
            "end (no response was cut whole)"
        )


class ChatTask(LanguageModelTask):
    """``tokenizer``: a causal LM's; ``max_length``: tokens per example (the model's context at
    most). An encoded example is ``{"ids": [...], "labels": [...]}`` (labels -100 on prompt tokens);
    the loss and the evaluation (perplexity of the response tokens) are the language model's, over
    the response tokens alone."""

    def __init__(self, tokenizer, max_length: int) -> None:
        super().__init__(tokenizer, max_length, 1)
        self.truncated = Truncation()

    @property
    def template(self) -> str | None:
        """The chat template applied (:func:`template_of`)."""
        return template_of(self.tokenizer)

    def render(self, turns: Sequence[dict], generation_prompt: bool = False) -> str:
        return render(self.tokenizer, turns, generation_prompt)

    @property
    def data_format(self) -> str:
        """What a run summary and model card say about the data's format and template."""
        which = "the fallback (### Role: headers)" if self.template else "the tokenizer's own"
        return f"conversations, the loss on assistant turns only; chat template: {which}"

    def segments(self, conversation: Conversation) -> list[tuple[str, bool]]:
        """``conversation`` rendered, as ``(text, is_response)`` pieces in order, through its last
        assistant turn (later turns carry no loss)."""
        turns = [{"role": role, "content": content} for role, content in conversation]
        last = max(k for k, (role, _) in enumerate(conversation) if role == RESPONSE_ROLE)
        pieces, done = [], ""
        for k, (role, _) in enumerate(conversation[: last + 1]):
            if role != RESPONSE_ROLE:
                continue
            prompt, through = self.render(turns[:k], True), self.render(turns[: k + 1])
            if not (prompt.startswith(done) and through.startswith(prompt)):
                raise ValueError(
                    "the chat template does not render a conversation as a prefix of its continuation"
                )
            pieces += [(prompt[len(done) :], False), (through[len(prompt) :], True)]
            done = through
        return [(text, response) for text, response in pieces if text]

    def encode(self, texts: Sequence[str], labels: Sequence[int]) -> list[dict]:
        """Each text a conversation's canonical JSON -> one example (``labels`` unused)."""
        self.truncated = Truncation()
        examples = [self.encode_one(loads(text)) for text in texts]
        if self.truncated.cut:  # once a process at warning level (a simulation encodes every client)
            first = self.max_length not in _WARNED
            _WARNED.add(self.max_length)
            log.log(logging.WARNING if first else logging.DEBUG, self.truncated.line(self.max_length))
        return examples

    def encode_one(self, conversation: Conversation) -> dict:
        """One conversation -> ``{"ids", "labels"}`` of at most ``max_length`` tokens."""
        ids, labels = [], []
        for text, response in self.segments(conversation):
            piece = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            labels += piece if response else [-100] * len(piece)
        last = _last_response(labels)  # (start, end) of the last response's tokens
        ids, labels = ids[: last[1]], labels[: last[1]]
        self.truncated.conversations += 1
        if len(ids) > self.max_length:
            ids, labels = self._truncate(ids, labels, last[0])
        return {"ids": ids, "labels": labels}

    def _truncate(self, ids: list[int], labels: list[int], start: int) -> tuple[list[int], list[int]]:
        """Cut ``ids``/``labels`` (whose last response starts at ``start``) to ``max_length``: the
        prompt before it from the left, and its end only when it alone leaves less than a quarter
        of the window to the prompt."""
        n, response = self.max_length, len(ids) - start
        head = min(start, max(n - response, n // 4))  # prompt tokens kept, the last ones
        keep = n - head  # response tokens kept, the first ones
        self.truncated.cut += 1
        self.truncated.prompt_cut += head < start
        self.truncated.response_cut += keep < response
        cut = slice(start - head, start + keep)
        return ids[cut], labels[cut]

    def collate(self, examples: Sequence[dict], device: torch.device) -> Batch:
        batch = token_batch([ex["ids"] for ex in examples], self.tokenizer.pad_token_id, device)
        batch["target"] = pad([ex["labels"] for ex in examples], -100)[0].to(device)
        return batch


def template_of(tokenizer) -> str | None:
    """The chat template ``tokenizer``'s conversations are rendered with: None for its own, else
    :data:`FALLBACK_TEMPLATE` (a tokenizer without one)."""
    return None if getattr(tokenizer, "chat_template", None) else FALLBACK_TEMPLATE


def render(tokenizer, turns: Sequence[dict], generation_prompt: bool = False) -> str:
    """The chat template's text of ``turns`` (``{"role", "content"}`` dicts), with the assistant's
    generation prompt after them when ``generation_prompt`` (what ``fedlora generate --chat``
    continues)."""
    return tokenizer.apply_chat_template(
        list(turns),
        chat_template=template_of(tokenizer),
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


def _last_response(labels: Sequence[int]) -> tuple[int, int]:
    """``(start, end)`` of the last run of response positions (labels != -100)."""
    end = max(k for k, label in enumerate(labels) if label != -100) + 1
    start = end
    while start > 0 and labels[start - 1] != -100:
        start -= 1
    return start, end


__all__ = ["FALLBACK_TEMPLATE", "ChatTask", "Truncation", "render", "template_of"]
