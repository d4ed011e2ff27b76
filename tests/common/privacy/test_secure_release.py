"""An adapter increment through the secure release (common/privacy/secure_release.py): encoded by
each client with the plan's numbers, summed mod 2^b, decoded to the mean of the clipped increments
plus the predicted noise, in the adapter's own shapes."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from common.privacy.discrete import modular_sum
from common.privacy.secure_plan import SecureTarget, plan_secure
from common.privacy.secure_release import SecureRelease

SHAPES = {"layer.lora_A": (8, 120), "layer.lora_B": (120, 8), "head": (2,)}
DIM = sum(math.prod(s) for s in SHAPES.values())


def _release(clients: int = 8) -> SecureRelease:
    plan = plan_secure(SecureTarget(8.0, 1e-5, 3), DIM, 1.0, (5, clients), (4, 3))
    return SecureRelease(plan, SHAPES)


def _update(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen) * (0.01 + 0.02 * seed) for name, shape in SHAPES.items()}


def _clipped(update: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in update.values()))
    return {k: t * min(1.0, clip / norm) for k, t in update.items()}


def test_the_decoded_mean_is_the_clipped_mean_plus_the_planned_noise_in_the_adapters_shapes():
    release, clients, seed = _release(), 8, os.urandom(16)
    updates = [_update(i) for i in range(clients)]  # norms from below to well above the clip
    total = modular_sum([release.encode(u, seed).astype(np.uint64) for u in updates], release.plan.bits)
    mean = release.decode(total, seed, clients)
    assert {k: tuple(v.shape) for k, v in mean.items()} == SHAPES
    truth = {k: sum(_clipped(u, 1.0)[k] for u in updates) / clients for k in SHAPES}
    error = torch.cat([(mean[k] - truth[k]).reshape(-1) for k in SHAPES]).double()
    p = release.plan
    predicted = math.sqrt(clients * p.share_variance) / p.scale / clients  # 8 shares of μ/m
    assert error.std().item() == pytest.approx(predicted, rel=0.15)  # rounding adds < 1 % here
    assert abs(error.mean().item()) < 6 * predicted / math.sqrt(DIM)


def test_other_rounds_rotate_differently_and_a_foreign_adapter_is_refused():
    release = _release()
    assert not torch.equal(release.signs(b"round 1"), release.signs(b"round 2"))
    with pytest.raises(ValueError, match="not the plan's adapter"):
        release.encode({"other": torch.zeros(DIM)}, b"seed")
    with pytest.raises(ValueError, match="the plan is for"):
        SecureRelease(release.plan, {"layer.lora_A": (8, 120)})
