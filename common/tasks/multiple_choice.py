"""Multiple-choice scoring of a causal LM on the packaged sets (common/data/multiple_choice.py), as
lm-evaluation-harness scores a ``multiple_choice`` task, plus the generated-answer match FlowerTune
reports (issue 76).

The context of an item is its user turn (the question, its lettered options and the instruction)
rendered with the tokenizer's chat template and the assistant's generation prompt
(common/tasks/chat.py ``render``). Each option's continuation is ``"<letter>. <text>"``, the answer
the instruction asks for. Context and continuation are tokenized separately (no special tokens
added) and concatenated, so the continuation's tokens are the same whatever the context ends with.
An option's log-likelihood is the sum, over the continuation's tokens, of the natural-log
probability the model gives each token after the context and the continuation tokens before it.

Per item (held-out items only, the set's fixed split):

- ``acc``: the option of highest log-likelihood is the gold one.
- ``acc_norm``: the option of highest log-likelihood per UTF-8 byte of its continuation is. (The
  harness divides by the choice string's length in characters, ``len(str)``; bytes and characters
  agree on ASCII text, which nearly all of these sets are.) Ties go to the first option, as
  ``numpy.argmax`` gives them.
- ``exact_match``: greedy decoding of ``max_new_tokens`` tokens after the context, the text decoded
  without special tokens and its leading whitespace dropped, starts with the gold letter followed
  by ``.``, ``)`` or the end of the text (:func:`answered_letter`). ``answered`` is the share whose
  generated text starts with any option's letter that way (the rest answered in another form).

Log-likelihoods run many (item, option) sequences in one forward pass: sequences left-padded (the
position ids counted from each sequence's first real token, so padding changes nothing), and the LM
head evaluated only on the last positions, where every continuation ends, when the model takes
``logits_to_keep`` (transformers' causal LMs, PEFT-wrapped or not).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from common.data.multiple_choice import SETS, Item, items_by_text, load_set, option_text, sample, user_text
from common.errors import FedloraError
from common.progress import bar
from common.tasks.base import evaluation
from common.tasks.chat import ChatTask, render

#: greedy answers: (model, tokenizer, contexts) -> one generated text per context
Answerer = Callable[[nn.Module, object, Sequence[str]], list[str]]
METRICS = ("acc", "acc_norm", "exact_match", "answered")

_ANSWER = re.compile(r"([A-Z])(?:[.)]|$)")


def context_text(tokenizer, item: Item) -> str:
    """The item's user turn in the chat template, ending with the assistant's generation prompt."""
    return render(tokenizer, [{"role": "user", "content": user_text(item)}], generation_prompt=True)


def continuations(item: Item) -> list[str]:
    """Each option's continuation, ``"<letter>. <text>"``, in option order."""
    return [option_text(letter, text) for letter, text in item.options]


def answered_letter(generated: str) -> str | None:
    """The letter a generated answer starts with: its first character after leading whitespace, a
    capital letter, followed by ``.`` or ``)`` or the end of the text; None otherwise."""
    found = _ANSWER.match(generated.lstrip())
    return found[1] if found else None


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def left_padded(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> dict[str, Tensor]:
    """Left-padded ``input_ids``, ``attention_mask`` and ``position_ids`` (each ``(b, T)``, on
    ``device``): every sequence ends at position ``T - 1``; its first real token has position 0."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.as_tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "position_ids": positions.to(device),
    }


def _forward(model: nn.Module, batch: dict[str, object], keep: int):
    """The model's output on ``batch``, the LM head run only at the last ``keep`` positions where the
    model takes ``logits_to_keep`` (else at all of them: slice ``logits[:, -keep:]``)."""
    try:
        return model(**batch, logits_to_keep=keep)
    except TypeError:
        return model(**batch)


def _last_logits(model: nn.Module, batch: dict[str, Tensor], keep: int) -> Tensor:
    """``(b, keep, V)`` fp32 logits at the last ``keep`` positions."""
    return _forward(model, batch, keep).logits[:, -keep:].float()


def _token_batches(lengths: Sequence[int], max_tokens: int) -> Iterable[list[int]]:
    """Indices of ``lengths`` in batches, longest first, each at most ``max_tokens`` padded tokens
    (``batch size x its longest``; a sequence longer than that alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batch: list[int] = []
    for i in order:
        if batch and (len(batch) + 1) * lengths[batch[0]] > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def option_loglikelihoods(
    model: nn.Module,
    tokenizer,
    items: Sequence[Item],
    max_tokens: int = 4096,
    max_length: int | None = None,
) -> list[list[float]]:
    """``[item][option]``: the summed log-probability (nats) of each option's continuation given the
    item's context. The context runs once per item and its keys and values serve every option
    (:func:`_shared_context_logprobs`); an item whose context and longest continuation exceed
    ``max_length`` loses context tokens from the left, as many as each option needs (the
    continuation is kept whole), and its options run as separate sequences,
    ``max_tokens`` padded tokens per forward pass (:func:`_continuation_logprobs`). None keeps
    everything. Call under ``torch.no_grad()`` with the model in eval mode
    (:class:`MultipleChoiceScorer` does)."""
    scores = [[0.0] * len(item.options) for item in items]
    device = _device(model)
    cut: list[tuple[int, int, list[int], list[int]]] = []  # (item, option, context, continuation)
    with bar(len(items), "scoring options", "item") as progress:
        for i, item in enumerate(items):
            context = _ids(tokenizer, context_text(tokenizer, item))
            options = [_ids(tokenizer, text) for text in continuations(item)]
            over = len(context) + max(map(len, options)) - max_length if max_length else 0
            if over <= 0:
                scores[i] = _shared_context_logprobs(model, tokenizer, context, options, device)
            else:
                for j, continuation in enumerate(options):
                    drop = len(context) + len(continuation) - max_length
                    cut.append((i, j, context[min(max(drop, 0), len(context) - 1) :], continuation))
            progress.update(1)
    for batch in _token_batches([len(c) + len(k) for _, _, c, k in cut], max_tokens):
        chosen = [cut[r] for r in batch]
        for (i, j, _, _), value in zip(
            chosen, _continuation_logprobs(model, tokenizer, chosen, device), strict=True
        ):
            scores[i][j] = value
    return scores


def _shared_context_logprobs(
    model: nn.Module, tokenizer, context: list[int], options: Sequence[list[int]], device: torch.device
) -> list[float]:
    """Each option's summed token log-probability after ``context``, the context run once: its last
    logits give each option's first token, and its cached keys and values, repeated once per
    option, serve the options' own tokens, right-padded in one pass (``(n, K)``; a padding position
    comes after every real one, so no real token attends to it)."""
    prefill = _forward(model, {"input_ids": torch.tensor([context], device=device), "use_cache": True}, 1)
    first = prefill.logits[0, -1].detach().float().log_softmax(-1)  # (V,): each option's first token
    values = [float(first[k[0]]) for k in options]
    width = max(map(len, options))
    if width == 1:
        return values
    cache = prefill.past_key_values
    cache.batch_repeat_interleave(len(options))
    ids = torch.full((len(options), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(options), len(context) + width), dtype=torch.long)
    mask[:, : len(context)] = 1
    for j, k in enumerate(options):
        ids[j, : len(k)] = torch.as_tensor(k, dtype=torch.long)
        mask[j, len(context) : len(context) + len(k)] = 1
    positions = torch.arange(len(context), len(context) + width)[None, :].expand(len(options), -1)
    out = model(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        position_ids=positions.to(device),
        past_key_values=cache,
        use_cache=True,
    )
    logp = out.logits[:, :-1].detach().float().log_softmax(-1)  # (n, K - 1, V): t predicts token t + 1
    rest = logp.gather(-1, ids[:, 1:, None].to(device)).squeeze(-1)  # (n, K - 1)
    lengths = torch.tensor([len(k) for k in options], device=device)
    mine = torch.arange(width - 1, device=device)[None, :] < lengths[:, None] - 1  # (n, K - 1)
    return [v + r for v, r in zip(values, torch.where(mine, rest, 0.0).sum(1).tolist(), strict=True)]


def _continuation_logprobs(
    model: nn.Module,
    tokenizer,
    requests: Sequence[tuple[int, int, list[int], list[int]]],
    device: torch.device,
) -> list[float]:
    """One forward pass over ``requests`` (context + continuation each, left-padded): each
    continuation's summed token log-probability."""
    batch = left_padded([c + k for _, _, c, k in requests], tokenizer.pad_token_id, device)
    lengths = torch.tensor([len(k) for *_, k in requests], device=device)  # (b,)
    longest = int(lengths.max())
    logits = _last_logits(model, batch, longest + 1)  # (b, K + 1, V): positions T-K-1 .. T-1
    logp = logits[:, :-1].log_softmax(-1)  # (b, K, V): position T-K+t-1 predicts token T-K+t
    targets = batch["input_ids"][:, -longest:]  # (b, K)
    token_lp = logp.gather(-1, targets[..., None]).squeeze(-1)  # (b, K)
    mine = torch.arange(longest, device=device)[None, :] >= longest - lengths[:, None]  # (b, K)
    return torch.where(mine, token_lp, 0.0).sum(1).tolist()


def greedy_answers(
    model: nn.Module, tokenizer, contexts: Sequence[str], max_new_tokens: int = 8, batch_size: int = 16
) -> list[str]:
    """Greedy continuations (at most ``max_new_tokens`` tokens, decoded without special tokens) of
    each context, ``batch_size`` left-padded contexts per ``generate`` call."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    encoded = [_ids(tokenizer, text) for text in contexts]
    out: list[str] = [""] * len(contexts)
    order = sorted(range(len(contexts)), key=lambda i: len(encoded[i]))
    device = _device(model)
    with bar(len(contexts), "generating answers", "item") as progress:
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            batch = left_padded([encoded[i] for i in chosen], pad_id, device)
            generated = model.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
            )
            width = batch["input_ids"].shape[1]
            for i, text in zip(
                chosen, tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True), strict=True
            ):
                out[i] = text
            progress.update(len(chosen))
    return out


def _first_max(values: Sequence[float]) -> int:
    return max(range(len(values)), key=lambda k: (values[k], -k))


def item_metrics(item: Item, loglikelihoods: Sequence[float], generated: str) -> dict[str, float]:
    """``acc``, ``acc_norm``, ``exact_match``, ``answered`` (each 0.0 or 1.0) of one item, from its
    options' log-likelihoods (nats) and its generated answer."""
    per_byte = [
        ll / len(text.encode("utf-8")) for ll, text in zip(loglikelihoods, continuations(item), strict=True)
    ]
    letter = answered_letter(generated)
    letters = {option for option, _ in item.options}
    return {
        "acc": float(_first_max(loglikelihoods) == item.gold),
        "acc_norm": float(_first_max(per_byte) == item.gold),
        "exact_match": float(letter == item.answer),
        "answered": float(letter in letters),
    }


class MultipleChoiceScorer:
    """Scores a causal LM (plain or PEFT) with ``tokenizer`` (a pad token set). ``max_tokens``: padded
    tokens per log-likelihood pass; ``max_length``: context cut from the left beyond it (None: no
    cut); ``max_new_tokens``, ``batch_size``: of the greedy answers; ``answers``: what generates
    them (:func:`greedy_answers`; a test passes a stub)."""

    def __init__(
        self,
        tokenizer,
        max_tokens: int = 4096,
        max_length: int | None = None,
        max_new_tokens: int = 8,
        batch_size: int = 16,
        answers: Answerer | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_tokens, self.max_length = max_tokens, max_length
        self.answers = answers or (
            lambda model, tok, contexts: greedy_answers(model, tok, contexts, max_new_tokens, batch_size)
        )

    @evaluation
    def score(self, model: nn.Module, items: Sequence[Item]) -> dict[str, float]:
        """Means over ``items`` of :func:`item_metrics` (each in [0, 1]) and ``items`` (their count)."""
        if not items:
            raise FedloraError("no multiple-choice items to score")
        lls = option_loglikelihoods(model, self.tokenizer, items, self.max_tokens, self.max_length)
        generated = self.answers(
            model, self.tokenizer, [context_text(self.tokenizer, item) for item in items]
        )
        rows = [item_metrics(*args) for args in zip(items, lls, generated, strict=True)]
        return {**{m: sum(row[m] for row in rows) / len(rows) for m in METRICS}, "items": float(len(rows))}

    @evaluation
    def evaluate(
        self, model: nn.Module, sets: Sequence[str] | None = None, per_set: int | None = 50
    ) -> dict[str, float]:
        """Each set's held-out items, at most ``per_set`` of them (:func:`sample`: a fixed subset), scored:
        ``"<set>/<metric>"`` for every metric of :meth:`score` and, over the sets (each set weighing
        the same), their mean ``"<metric>"``, plus ``"items"`` (all sets) and ``"sets"``."""
        names = list(sets) if sets is not None else list(SETS)
        scores = self.score_sets(model, {name: sample(load_set(name).split()[1], per_set) for name in names})
        return {
            **{f"{name}/{k}": v for name, s in scores.items() for k, v in s.items()},
            **set_means(scores),
            "items": sum(s["items"] for s in scores.values()),
            "sets": float(len(names)),
        }

    def score_sets(
        self, model: nn.Module, items: Mapping[str, Sequence[Item]]
    ) -> dict[str, dict[str, float]]:
        """:meth:`score` of each set's ``items``: set -> its metrics."""
        return {name: self.score(model, chosen) for name, chosen in items.items()}


def set_means(scores: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each of :data:`METRICS` averaged over the sets of ``scores`` (set -> metrics), each set
    weighing the same."""
    return {m: sum(s[m] for s in scores.values()) / len(scores) for m in METRICS}


class MultipleChoiceTask(ChatTask):
    """Instruction tuning on multiple-choice items (common/data/multiple_choice.py): trained as
    conversations (:class:`~common.tasks.chat.ChatTask`: the loss on the answer, ``"B. text"``),
    evaluated as lm-evaluation-harness scores them (:class:`MultipleChoiceScorer`) on the held-out
    items, each set weighing the same: ``accuracy`` (the option of highest log-likelihood),
    ``acc_norm``, ``exact_match`` of the greedy answer and ``answered``, their per-set values
    (``accuracy/<set>``...), and the answers' ``perplexity`` and ``loss``."""

    metric = "accuracy"

    def __init__(self, tokenizer, max_length: int, scorer: MultipleChoiceScorer | None = None) -> None:
        super().__init__(tokenizer, max_length)
        self.scorer = scorer or MultipleChoiceScorer(tokenizer, max_length=max_length)

    def encode(self, texts: Sequence[str], labels: Sequence[int]) -> list[dict]:
        """:meth:`ChatTask.encode`, each example with its ``item`` (None for a conversation that is
        not a registered item: trained, never scored)."""
        examples = super().encode(texts, labels)
        lookup = items_by_text()
        for example, text in zip(examples, texts, strict=True):
            example["item"] = lookup.get(text)
        return examples

    @evaluation
    def evaluate(
        self, model: nn.Module, examples: Sequence[dict], device: torch.device, batch_size: int
    ) -> dict[str, float]:
        by_set: dict[str, list[Item]] = {}
        for example in examples:
            if example.get("item") is not None:
                by_set.setdefault(example["item"].dataset, []).append(example["item"])
        if not by_set:
            raise FedloraError("no held-out multiple-choice items to score")
        scores = self.scorer.score_sets(model, dict(sorted(by_set.items())))
        per_set = {f"{_NAMES.get(m, m)}/{name}": s[m] for name, s in scores.items() for m in METRICS}
        means = {_NAMES.get(m, m): v for m, v in set_means(scores).items()}
        return {**means, **per_set, **super().evaluate(model, examples, device, batch_size)}


_NAMES = {"acc": "accuracy"}  # the harness's acc is the run's held-out metric, accuracy


__all__ = [
    "METRICS",
    "Answerer",
    "MultipleChoiceScorer",
    "MultipleChoiceTask",
    "answered_letter",
    "context_text",
    "continuations",
    "greedy_answers",
    "item_metrics",
    "left_padded",
    "option_loglikelihoods",
    "set_means",
]
