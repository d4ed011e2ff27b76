"""Task modules: how a (model kind, dataset) pair is encoded, trained and evaluated."""

from __future__ import annotations

from collections.abc import Callable

from common.data.conversation import MC_TASK, TASK
from common.data.corpora import Corpus
from common.data.prompts import prompt_for
from common.errors import FedloraError
from common.tasks.base import Batch, Task, sample_batches
from common.tasks.chat import ChatTask
from common.tasks.classifier import ClassifierTask
from common.tasks.language_model import LanguageModelTask
from common.tasks.multiple_choice import MultipleChoiceTask
from common.tasks.verbalizer import VerbalizerTask

#: corpus tasks a causal LM trains on as text: task -> (what it is, its Task from (tokenizer,
#: max_length, lm_blocks))
CAUSAL_TASKS: dict[str, tuple[str, Callable[..., Task]]] = {
    "lm": ("language modelling", LanguageModelTask),
    TASK: ("instruction / chat data", lambda tokenizer, max_length, _: ChatTask(tokenizer, max_length)),
    MC_TASK: (
        "multiple-choice instruction data",
        lambda tokenizer, max_length, _: MultipleChoiceTask(tokenizer, max_length),
    ),
}


def make_task(bundle, corpus: Corpus, max_length: int, lm_blocks: int = 4) -> Task:
    """The task for ``bundle`` (common/models/loader.py ModelBundle; its ``kind``, ``causal-lm`` or
    ``seq-cls``, and tokenizer) on ``corpus`` (whose ``task`` picks the objective), with examples of
    at most ``max_length`` tokens, which must fit the model's context; a language-modelling corpus
    gives ``lm_blocks`` examples per text (0: every block)."""
    kind, tokenizer = bundle.kind, bundle.tokenizer
    context = getattr(getattr(bundle.model, "config", None), "max_position_embeddings", None)
    if isinstance(context, int) and max_length > context:
        raise FedloraError(f"--max-length {max_length} is over {bundle.name}'s context of {context} tokens")
    if corpus.task in CAUSAL_TASKS:
        what, task = CAUSAL_TASKS[corpus.task]
        if kind != "causal-lm":
            raise FedloraError(f"dataset '{corpus.name}' is {what}: it needs a causal LM")
        return task(tokenizer, max_length, lm_blocks)
    if kind == "causal-lm":
        return VerbalizerTask(tokenizer, prompt_for(corpus.name, corpus.label_names), max_length)
    return ClassifierTask(tokenizer, max_length)


__all__ = ["CAUSAL_TASKS", "Batch", "Task", "make_task", "sample_batches"]
