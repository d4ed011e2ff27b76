"""Packaged corpora load offline with the documented sizes; the LM task measures perplexity."""

import math

import pytest
import torch

from common.data import load_corpus
from common.data.dedup import text_key
from common.tasks.language_model import LanguageModelTask


@pytest.mark.parametrize(
    ("name", "size", "labels"),
    [("rotten-tomatoes", 12808, 2), ("bbc-news", 2225, 5), ("boolq", 12697, 2)],
)
def test_classification_corpora(name, size, labels):
    corpus = load_corpus(name)
    assert len(corpus) == size and len(corpus.label_names) == labels
    assert set(corpus.labels) == set(range(labels))
    assert all(isinstance(t, str) and t for t in corpus.texts[:50])


@pytest.mark.parametrize(
    ("name", "copies"), [("rotten-tomatoes", 57), ("bbc-news", 101), ("news-articles", 2), ("boolq", 0)]
)
def test_copies_of_a_text_in_the_packaged_corpora(name, copies):
    """Texts equal up to case and whitespace (text_key); the splits keep such copies together."""
    texts = load_corpus(name).texts
    assert len(texts) - len(set(map(text_key, texts))) == copies


def test_news_articles_is_an_lm_corpus():
    corpus = load_corpus("news-articles")
    assert corpus.task == "lm" and len(corpus) > 3700
    assert min(len(t.split()) for t in corpus.texts) >= 20


def test_lm_perplexity_is_exp_of_mean_token_nll(tiny_llama, smollm2_tokenizer):
    task = LanguageModelTask(smollm2_tokenizer, max_length=16)
    examples = task.encode(["The quick brown fox jumps over the lazy dog. " * 5, "Short text here."], [0, 0])
    assert all(len(ex["ids"]) <= 16 for ex in examples) and len(examples) >= 3
    total, count = 0.0, 0
    with torch.no_grad():
        for ex in examples:  # unbatched reference
            ids = torch.tensor([ex["ids"]])
            logp = tiny_llama(input_ids=ids).logits[0, :-1].log_softmax(-1)
            total -= float(logp.gather(1, ids[0, 1:, None]).sum())
            count += len(ex["ids"]) - 1
    result = task.evaluate(tiny_llama, examples, torch.device("cpu"), batch_size=2)
    assert result["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-4)


@pytest.mark.parametrize("blocks", [4, 2, 0])
def test_lm_blocks_caps_the_examples_taken_from_each_text(smollm2_tokenizer, blocks):
    """``--lm-blocks``: a text's first ``blocks`` blocks of ``max_length`` tokens (0: all of them);
    a text shorter than one block is one example."""
    task = LanguageModelTask(smollm2_tokenizer, max_length=8, max_blocks_per_doc=blocks)
    long = " ".join(f"word{i}" for i in range(40))
    whole = len(smollm2_tokenizer(long, add_special_tokens=False)["input_ids"]) // 8
    assert whole > 4
    examples = task.encode([long, "Short."], [0, 0])
    assert len(examples) == (blocks or whole) + 1 and len(examples[-1]["ids"]) < 8
    assert all(len(ex["ids"]) == 8 for ex in examples[:-1])
