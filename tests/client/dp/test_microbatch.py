"""A DP step does not depend on how its logical batch is cut into micro-batches (padding included),
for every registered DP optimizer; and the micro-batch a CUDA run fits to free memory."""

import copy

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from client.dp.engine import DenseUpdate, DpSteps, dp_train
from client.dp.microbatch import FILL, Microbatches, fit_microbatch
from client.dp.optimizers import DP_OPTIMIZERS, make_dp_optimizer
from common.models.lora import LoraSpec, attach_lora, lora_layers
from common.models.lora_init import apply_lora_init
from common.tasks.base import by_length
from common.tasks.training import Trainee
from tests.conftest import tiny_llama_config
from tests.harness import LmTask

CPU = torch.device("cpu")


def _examples(n=11, seed=0):
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(1, 500, size=int(rng.integers(3, 14))).tolist()} for _ in range(n)]


def _model(vocab: int, init: str) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = LoraSpec(rank=4, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    model = attach_lora(LlamaForCausalLM(tiny_llama_config(vocab)), spec, "CAUSAL_LM")
    if init == "balanced":
        apply_lora_init(model, init, seed=0, scale=0.3)
    return model


def _weights(model) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone() for n, p in model.named_parameters() if ".lora_" in n or ".base_layer." in n
    }


@pytest.mark.parametrize("name", sorted(DP_OPTIMIZERS))
def test_every_optimizer_steps_alike_however_the_batch_is_cut(name, smollm2_tokenizer):
    """Three Poisson steps (rate 0.7: batches of varying size) with σ 1 from the same sampling and
    noise generators: one example per pass (no padding) and passes of 4 padded examples end at the
    same weights, LoRA and base (the merging optimizers), to fp32 tolerance."""
    merges = DP_OPTIMIZERS[name].spec.merges_base  # LoRA's B = 0 is their gradient tap
    base = _model(len(smollm2_tokenizer), "peft" if merges else "balanced")
    data = _examples()
    assert len({len(e["ids"]) for e in data}) > 3  # padding is exercised
    ends = []
    for microbatch in (1, 4):
        model = copy.deepcopy(base)
        opt = make_dp_optimizer(
            name, lora_layers(model), 0.05, **({"selection": 1} if "sparta" in name else {})
        )
        if hasattr(opt, "_draw"):  # wishart's projections come from OS entropy: fix them alike here
            opt._draw = {CPU: torch.Generator().manual_seed(5)}
        plan = DpSteps(steps=3, sample_rate=0.7, clip=0.05, noise_multiplier=1.0, microbatch=microbatch)
        rngs = np.random.default_rng(3), torch.Generator().manual_seed(3)
        dp_train(Trainee(model, LmTask(), data, CPU), opt, plan, DenseUpdate(0.05), rngs=rngs)
        ends.append(_weights(model))
    start = _weights(base)
    assert any(not torch.equal(start[k], ends[0][k]) for k in start), "nothing moved"
    for k in start:
        torch.testing.assert_close(ends[1][k], ends[0][k], rtol=1e-4, atol=1e-6)


def test_fit_fills_the_available_memory_within_its_bounds():
    # 1 KB a token, 100-token examples: 100 KB an example; 10 MB available -> FILL * 100 examples
    assert fit_microbatch(1024, 100, 10 * 1024**2, 16, 10_000) == int(FILL * 10 * 1024**2 / (1024 * 100))
    assert fit_microbatch(1024, 100, 10 * 1024**2, 16, 50) == 50  # never more than the examples
    assert fit_microbatch(1024, 100, 1024, 16, 50) == 16  # never under the configured size
    assert fit_microbatch(0.0, 100, 1024, 4, 50) == 50  # nothing measured: everything in one pass


def test_the_cpu_keeps_the_configured_size():
    data = _examples(10)
    cuts = Microbatches(4, data, CPU, fit=True)
    idx = list(range(10))
    parts = list(cuts.parts(idx))
    assert [len(p) for p in parts] == [4, 4, 2] and cuts.size == 4
    assert [i for p in parts for i in p] == by_length(idx, data)


def test_cuda_measures_the_first_pass_then_fits_the_next_steps(monkeypatch):
    """The CUDA path with the device's counters stood in for: the first pass peaks 100 bytes a padded
    token over its start and 50 kB are available, so the next step's passes take
    FILL * 50 kB / (100 B * the longest example's tokens) examples; the first step keeps its cut."""
    data = _examples(50)
    longest = max(len(e["ids"]) for e in data)
    state = {"allocated": 1_000, "peak": 1_000}

    def fake(name, value):
        monkeypatch.setattr(torch.cuda, name, value)

    fake("synchronize", lambda device=None: None)
    fake("memory_allocated", lambda device=None: state["allocated"])
    fake("max_memory_allocated", lambda device=None: state["peak"])
    fake("reset_peak_memory_stats", lambda device=None: state.update(peak=state["allocated"]))
    fake("mem_get_info", lambda device=None: (50_000, 2_000_000))
    fake("memory_reserved", lambda device=None: state["allocated"])
    cuts = Microbatches(4, data, torch.device("cuda"), fit=True)
    idx = list(range(50))
    parts = cuts.parts(idx)
    first = next(parts)
    tokens = len(first) * max(len(data[i]["ids"]) for i in first)
    state["peak"] += 100 * tokens  # the caller's forward/backward on the first part
    rest = list(parts)
    assert [len(p) for p in [first, *rest]] == [4] * 12 + [2]  # this step keeps its cut
    want = int(FILL * 50_000 / (100 * longest))
    assert 4 < want < 50 and cuts.size == want and not cuts.measure
    assert [len(p) for p in cuts.parts(idx)] == [want, 50 - want]  # the next step fills the memory
