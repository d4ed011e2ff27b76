"""PRISM batched across modules (issue 36) takes the same steps as the per-module algorithm.

The reference below is the unbatched optimizer as it stood before batching: one geometry, lift,
noise, horizontal lift, adaptive direction and retraction per module, from the PRISM primitives; its
standard normal draws come in the batched step's order (a stack per shape, shapes in order of their
first module, ``Ω_A`` before ``Ω_B``), sliced per module.
Both run the engine's steps from the same model, sampling and noise generators; the factors must agree
to float32 tolerance after every step, with modules of two shapes (q/o and k/v) interleaved.
"""

import copy

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from client.dp import prism as pm
from client.dp.engine import DenseUpdate, DpSteps, dp_train
from client.dp.optimizers import PrismDp
from common.models.lora import LoraSpec, attach_lora, get_factors, lora_layers, set_factors
from common.models.lora_init import apply_lora_init
from common.tasks.training import Trainee
from tests.conftest import tiny_llama_config
from tests.harness import LmTask


class UnbatchedPrism:
    """PRISM module by module (the pre-batching optimizer; scalar or geometry floors)."""

    name = "prism"

    def __init__(self, layers, lr, floor_mode):
        self.layers, self.lr, self.floor_mode = layers, lr, floor_mode
        self.moments = {k: pm.init_moments(*get_factors(v)) for k, v in layers.items()}

    def begin(self):
        self.geo = {k: pm.geometry(*get_factors(v)) for k, v in self.layers.items()}
        self.sums = {k: [torch.zeros_like(g.A), torch.zeros_like(g.B)] for k, g in self.geo.items()}

    def sq_norms(self, grads):
        return sum(
            pm.tangent_sq_norm(self.geo[k], *pm.lift(self.geo[k], gA, gB)) for k, (gA, gB) in grads.items()
        )

    def accumulate(self, grads, alpha):
        for k, (gA, gB) in grads.items():
            self.sums[k][0] += torch.einsum("b,bmr->mr", alpha, gA)
            self.sums[k][1] += torch.einsum("b,bnr->nr", alpha, gB)

    def _omegas(self, generator):
        by_shape = {}
        for k, geo in self.geo.items():
            by_shape.setdefault((geo.A.shape, geo.B.shape), []).append(k)
        out = {}
        for (shape_a, shape_b), names in by_shape.items():
            omega_a = torch.randn((len(names), *shape_a), generator=generator)
            omega_b = torch.randn((len(names), *shape_b), generator=generator)
            out.update({k: (omega_a[i], omega_b[i]) for i, k in enumerate(names)})
        return out

    def step(self, noise_std, denom, generator):
        tau = noise_std / denom
        omegas = self._omegas(generator)
        for k, layer in self.layers.items():
            geo = self.geo[k]
            dA, dB = pm.lift(geo, self.sums[k][0] / denom, self.sums[k][1] / denom)
            xi_a, xi_b = pm.shape_noise(geo, *omegas[k])
            dA, dB = pm.horizontalize(geo, dA + tau * xi_a, dB + tau * xi_b)
            lam_a, lam_b = pm.dp_floors(geo, tau, self.floor_mode)
            UA, UB, self.moments[k] = pm.adaptive_direction(self.moments[k], dA, dB, lam_a, lam_b)
            UA, UB = pm.horizontalize(geo, UA, UB)
            set_factors(layer, *pm.retract(geo.A, geo.B, UA, UB, self.lr, align=True))


def _examples(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(1, 500, size=int(rng.integers(4, 12))).tolist()} for _ in range(n)]


@pytest.mark.parametrize("floor_mode", ["scalar", "geometry"])
def test_batched_prism_steps_equal_the_per_module_steps(smollm2_tokenizer, floor_mode):
    torch.manual_seed(0)
    cfg = tiny_llama_config(len(smollm2_tokenizer), num_hidden_layers=3)
    spec = LoraSpec(rank=4, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    model = attach_lora(LlamaForCausalLM(cfg), spec, "CAUSAL_LM")
    apply_lora_init(model, "balanced", seed=0, scale=0.3)
    reference = copy.deepcopy(model)
    shapes = {tuple(get_factors(v)[0].shape) for v in lora_layers(model).values()}
    assert len(shapes) == 2  # q/o and k/v: two groups, interleaved in the model's order

    plan = DpSteps(steps=1, sample_rate=0.6, clip=0.05, noise_multiplier=1.0, microbatch=4)
    batched = PrismDp(lora_layers(model), lr=0.05, floor_mode=floor_mode)
    unbatched = UnbatchedPrism(lora_layers(reference), lr=0.05, floor_mode=floor_mode)
    data, cpu = _examples(), torch.device("cpu")
    start = {k: get_factors(v) for k, v in lora_layers(model).items()}
    for step in range(3):
        for net, opt in ((model, batched), (reference, unbatched)):
            rngs = np.random.default_rng(step), torch.Generator().manual_seed(step)
            dp_train(Trainee(net, LmTask(), data, cpu), opt, plan, DenseUpdate(0.05), rngs=rngs)
        for name, layer in lora_layers(model).items():
            want = get_factors(lora_layers(reference)[name])
            for got, ref in zip(get_factors(layer), want, strict=True):
                torch.testing.assert_close(got, ref, rtol=2e-4, atol=2e-6)
    for name, layer in lora_layers(model).items():  # the steps moved every module (noise and signal)
        assert (get_factors(layer)[0] - start[name][0]).abs().max() > 1e-3
