"""Prompt templates and verbalizers for causal-LM classification.

A class is predicted as the label word with the highest log-likelihood after the prompt
(``accuracy = argmax_c log p(word_c | prompt)``); training minimises the NLL of the gold word.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """``template`` has one ``{text}`` slot; ``words[i]`` verbalises label ``i``."""

    template: str
    words: tuple[str, ...]

    @property
    def head(self) -> str:
        return self.template.split("{text}")[0]

    @property
    def tail(self) -> str:
        return self.template.split("{text}")[1]


PROMPTS: dict[str, Prompt] = {
    "rotten-tomatoes": Prompt("Review: {text}\nSentiment:", (" negative", " positive")),
    "bbc-news": Prompt(
        "Article: {text}\nTopic:", (" business", " entertainment", " politics", " sport", " tech")
    ),
    "boolq": Prompt("Passage: {text}\nAnswer (yes or no):", (" no", " yes")),
}


def prompt_for(dataset: str, label_names: tuple[str, ...]) -> Prompt:
    """The dataset's prompt, or a generic one that verbalises the label names."""
    if dataset in PROMPTS:
        return PROMPTS[dataset]
    return Prompt("{text}\nLabel:", tuple(f" {name}" for name in label_names))
