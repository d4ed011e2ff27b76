"""Client-level Gaussian release: clipping, noise per threat model, DP-FedAvg mean, noise plan and
budget stop."""

import math

import pytest
import torch

from common.config import preset
from common.errors import FedloraError
from common.privacy.calibration import epsilon_for
from common.privacy.ledger import Charge, Ledger
from common.privacy.release import (
    add_noise,
    client_noise_std,
    clip,
    clip_and_noise,
    effective_sigma,
    global_norm,
)
from server.aggregate import private_mean
from server.budget import budget_stop, plan_noise


def _state(seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(300, 8, generator=gen) * scale, "b": torch.randn(8, 200, generator=gen) * scale}


def test_clip_bounds_the_global_norm_and_keeps_small_updates():
    big, small = _state(scale=3.0), _state(scale=1e-3)
    clipped, norm = clip(big, 1.5)
    assert norm == pytest.approx(global_norm(big)) and global_norm(clipped) == pytest.approx(1.5, rel=1e-6)
    assert torch.allclose(clipped["a"] / big["a"], torch.full_like(big["a"], 1.5 / norm))  # direction kept
    same, _ = clip(small, 1.5)
    assert all(torch.equal(same[k], small[k]) for k in small)


def test_noise_has_the_requested_std_and_is_not_reproducible():
    zero = {"a": torch.zeros(200_000)}
    first, second = add_noise(zero, 0.3)["a"], add_noise(zero, 0.3)["a"]
    assert first.std().item() == pytest.approx(0.3, rel=0.01) and abs(first.mean().item()) < 0.01
    assert not torch.equal(first, second)  # OS-seeded: the run's seed cannot reproduce DP noise


def test_clip_and_noise_clips_before_the_noise():
    big = _state(scale=3.0)
    clipped = clip_and_noise(big, 1.5, 0.0)
    assert all(torch.equal(clipped[k], clip(big, 1.5)[0][k]) for k in big)
    noised = clip_and_noise(big, 1.5, 0.3)
    residual = torch.cat([(noised[k] - clipped[k]).flatten() for k in big])
    assert residual.std().item() == pytest.approx(0.3, rel=0.05)


@pytest.mark.parametrize(
    ("threat", "expected"),
    [("local", 2.0 * 0.5), ("distributed", 2.0 * 0.5 / math.sqrt(4)), ("central", 0.0)],
)
def test_client_noise_share(threat, expected):
    assert client_noise_std(threat, 2.0, 0.5, 4) == pytest.approx(expected)


def test_effective_sigma_after_dropouts():
    assert effective_sigma("distributed", 2.0, 4, 1) == pytest.approx(1.0)  # 1 of 4 shares: σ/2
    assert effective_sigma("distributed", 2.0, 4, 4) == 2.0
    assert effective_sigma("local", 2.0, 4, 1) == effective_sigma("central", 2.0, 4, 1) == 2.0


def test_private_mean_per_threat_model():
    incs = [_state(s) for s in range(3)]
    local = private_mean(incs, "local", 1.0, 1.0, expected=6.0)
    assert torch.allclose(local["a"], sum(i["a"] for i in incs) / 3, atol=1e-6)  # mean of replies
    dist = private_mean(incs, "distributed", 1.0, 1.0, expected=6.0)
    assert torch.allclose(dist["a"], sum(i["a"] for i in incs) / 6, atol=1e-6)  # fixed denominator p·N
    zeros = [{"a": torch.zeros(100_000)}] * 2
    central = private_mean(zeros, "central", 2.0, 0.5, expected=4.0)["a"]
    assert central.std().item() == pytest.approx(2.0 * 0.5 / 4.0, rel=0.02)  # server noise σC / (p·N)


def test_plan_noise_calibrates_for_both_accountants():
    cfg = preset("default", mechanism="dp-fedavg", target_epsilon=3.0, threat_model="central", rounds=20)
    plan = plan_noise(cfg.check())
    assert plan.calibrated and plan.p == cfg.sample_rate
    for name in ("gdp", "pld"):
        assert epsilon_for(name, plan.sigma, plan.p, cfg.rounds, cfg.delta) <= 3.0
    # one accountant is at its target: σ is not larger than needed
    assert max(epsilon_for(n, plan.sigma * 0.99, plan.p, cfg.rounds, cfg.delta) for n in ("gdp", "pld")) > 3.0
    local = plan_noise(cfg.replace(threat_model="local", noise_multiplier=1.5).check())
    assert local.p == 1.0 and local.sigma == 1.5 and not local.calibrated  # no amplification vs the server
    assert plan_noise(preset("default").check()) is None


def test_gaussian_release_without_noise_or_budget_is_refused():
    with pytest.raises(FedloraError, match="noise-multiplier or --target-epsilon"):
        preset("default", mechanism="dp-fedavg").check()


def test_budget_stop_before_the_round_that_would_exceed(tmp_path):
    cfg = preset("default", mechanism="dp-fedavg", noise_multiplier=1.0, threat_model="central")
    plan = plan_noise(cfg.replace(target_epsilon=1.0).check())
    eps = [max(epsilon_for(n, 1.0, plan.p, t, cfg.delta) for n in ("gdp", "pld")) for t in (1, 2, 3)]
    plan = plan_noise(cfg.replace(target_epsilon=(eps[1] + eps[2]) / 2).check())  # room for 2 rounds
    ledger = Ledger.create(tmp_path / "l.sqlite", "client-level", "x", cfg.delta)
    charges = 0
    while not budget_stop(ledger, plan):
        charges += 1
        ledger.charge(Charge("x", charges, plan.sigma, plan.p, 1, plan.p, 2, 1.0, "central", "dp-fedavg"))
    assert charges == 2 and "budget" in budget_stop(ledger, plan)
