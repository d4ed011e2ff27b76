"""Task modules: how a (model kind, dataset) pair is encoded, trained and evaluated."""

from __future__ import annotations

from common.data.corpora import Corpus
from common.data.prompts import prompt_for
from common.errors import FedloraError
from common.tasks.base import Batch, Task, sample_batches
from common.tasks.classifier import ClassifierTask
from common.tasks.language_model import LanguageModelTask
from common.tasks.verbalizer import VerbalizerTask


def make_task(kind: str, corpus: Corpus, tokenizer, max_length: int) -> Task:
    """``kind``: ``causal-lm`` or ``seq-cls`` (the model's); ``corpus.task`` picks the objective."""
    if corpus.task == "lm":
        if kind != "causal-lm":
            raise FedloraError(f"dataset '{corpus.name}' is language modelling: it needs a causal LM")
        return LanguageModelTask(tokenizer, max_length)
    if kind == "causal-lm":
        return VerbalizerTask(tokenizer, prompt_for(corpus.name, corpus.label_names), max_length)
    return ClassifierTask(tokenizer, max_length)


__all__ = ["Batch", "Task", "make_task", "sample_batches"]
