"""Client-level Gaussian release: clipping, noise per threat model, DP-FedAvg mean, noise plan and
budget stop."""

import math

import pytest
import torch

from common.errors import FedloraError
from common.presets import preset
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.calibration import epsilon_for
from common.privacy.accounting.ledger import Charge, Ledger
from common.privacy.mechanisms.mechanism import private_mean
from common.privacy.mechanisms.release import add_noise, clip, clip_and_noise, global_norm
from common.privacy.participation.threat import THREATS
from common.privacy.planning.plan import NoisePlan, budget_stop, plan_noise


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


def _plan(threat: str, min_replies: int = 1) -> NoisePlan:
    return NoisePlan(2.0, 1.0, 0.5, threat, 0.0, 1e-5, False, min_replies)


@pytest.mark.parametrize(
    ("threat", "min_replies", "expected"),
    [
        ("local", 1, 2.0 * 0.5),
        ("distributed", 4, 2.0 * 0.5 / math.sqrt(4)),  # all 4 sampled needed: a quarter each
        ("distributed", 2, 2.0 * 0.5 / math.sqrt(2)),  # any 2 of 4 must carry the whole noise
        ("distributed", 9, 2.0 * 0.5 / math.sqrt(4)),  # m = min(min-replies, K)
        ("central", 1, 0.0),
    ],
)
def test_client_noise_share(threat, min_replies, expected):
    assert _plan(threat, min_replies).client_std(4) == pytest.approx(expected)


def test_any_applied_round_carries_at_least_sigma():
    """Distributed shares are sized for min-replies: the released sum's σ never falls below the
    planned σ once a round can be applied (replied ≥ m), whatever dropped out."""
    for m in (1, 2, 3, 4):
        plan = _plan("distributed", m)
        for sampled in range(1, 7):
            for replied in range(plan.shares(sampled), sampled + 1):
                assert plan.released_sigma(sampled, replied) >= plan.sigma * (1 - 1e-12)
                noise_var = replied * plan.client_std(sampled) ** 2  # std of the summed shares
                assert math.sqrt(noise_var) >= plan.sigma * plan.clip * (1 - 1e-12)
    assert _plan("local").released_sigma(4, 1) == _plan("central").released_sigma(4, 1) == 2.0


def test_private_mean_per_threat_model():
    incs = [_state(s) for s in range(3)]
    local = private_mean(incs, THREATS["local"], 1.0, 1.0, expected=6.0)
    assert torch.allclose(local["a"], sum(i["a"] for i in incs) / 3, atol=1e-6)  # mean of replies
    dist = private_mean(incs, THREATS["distributed"], 1.0, 1.0, expected=6.0)
    assert torch.allclose(dist["a"], sum(i["a"] for i in incs) / 6, atol=1e-6)  # fixed denominator p·N
    zeros = [{"a": torch.zeros(100_000)}] * 2
    central = private_mean(zeros, THREATS["central"], 2.0, 0.5, expected=4.0)["a"]
    assert central.std().item() == pytest.approx(2.0 * 0.5 / 4.0, rel=0.02)  # server noise σC / (p·N)


def test_plan_noise_calibrates_for_both_accountants():
    cfg = preset("small", mechanism="dp-fedavg", target_epsilon=3.0, threat_model="central", rounds=20)
    plan = plan_noise(cfg.check())
    assert plan.calibrated and plan.p == cfg.sample_rate
    for name in ("gdp", "pld"):
        assert epsilon_for(name, plan.sigma, plan.p, cfg.rounds, cfg.delta) <= 3.0
    # one accountant is at its target: σ is not larger than needed
    assert max(epsilon_for(n, plan.sigma * 0.99, plan.p, cfg.rounds, cfg.delta) for n in ("gdp", "pld")) > 3.0
    local = plan_noise(cfg.replace(threat_model="local", noise_multiplier=1.5).check())
    assert local.p == 1.0 and local.sigma == 1.5 and not local.calibrated  # no amplification vs the server
    assert plan_noise(preset("small").check()) is None


def test_gaussian_release_without_noise_or_budget_is_refused():
    with pytest.raises(FedloraError, match="noise-multiplier or --target-epsilon"):
        preset("small", mechanism="dp-fedavg").check()


def test_budget_stop_before_the_round_that_would_exceed(tmp_path):
    cfg = preset("small", mechanism="dp-fedavg", noise_multiplier=1.0, threat_model="central")
    plan = plan_noise(cfg.replace(target_epsilon=1.0).check())
    eps = [max(epsilon_for(n, 1.0, plan.p, t, cfg.delta) for n in ("gdp", "pld")) for t in (1, 2, 3)]
    plan = plan_noise(cfg.replace(target_epsilon=(eps[1] + eps[2]) / 2).check())  # room for 2 rounds
    ledger = Ledger.create(tmp_path / "l.sqlite", "client-level", "x", cfg.delta)
    charges = 0
    while not budget_stop(ledger, plan):
        charges += 1
        ledger.charge(Charge("x", charges, plan.sigma, plan.p, 1, plan.p, 2, 1.0, "central", "dp-fedavg"))
    assert charges == 2 and "budget" in budget_stop(ledger, plan)


def test_central_mean_clips_again_on_the_server():
    """Central noise is calibrated to sensitivity C: a reply just over C (the acceptance check's
    round-off allowance) is clipped to C before it enters the sum."""
    over = {"a": torch.zeros(10)}
    over["a"][0] = 0.5 * (1 + 5e-5)
    mean = private_mean([over], THREATS["central"], 1e-12, 0.5, expected=1.0)
    assert global_norm(mean) == pytest.approx(0.5, rel=1e-9)


def test_calibration_includes_the_noised_statistics_round():
    """The statistics round is charged as round 0: σ is calibrated so that it and every round
    together meet the target, and a node's planned epsilon counts it."""
    from client.node.policy import planned_client_epsilon

    base = dict(mechanism="dr-encoder", target_epsilon=6.0, threat_model="central", rounds=5, sample_rate=0.5)
    plain = plan_noise(preset("small", **base).check())
    noised = plan_noise(preset("small", **base, stats_noise_multiplier=2.0).check())
    assert noised.prior == (Event(2.0, 1.0, 1),) and noised.sigma > plain.sigma
    for name in ("gdp", "pld"):
        spent = epsilon_for(name, noised.sigma, 0.5, 5, 1e-5, prior=noised.prior)
        assert spent <= 6.0 * (1 + 1e-9)
    assert epsilon_for("pld", plain.sigma, 0.5, 5, 1e-5, prior=noised.prior) > 6.0  # the old plan overran
    fixed = preset("small", **{**base, "noise_multiplier": 1.2, "target_epsilon": 0.0})
    with_stats = fixed.replace(stats_noise_multiplier=2.0).check()
    assert planned_client_epsilon(with_stats) > planned_client_epsilon(fixed.check())
    with pytest.raises(FedloraError, match="before round 1 alone"):
        plan_noise(preset("small", **base, stats_noise_multiplier=0.3).check())


def test_every_registered_release_kind_resolves_to_its_parts():
    """The one registry names, for every release kind the configuration accepts, a mechanism factory,
    a server half and a client half, each loadable; a kind without a half of its own gets the generic
    one. A run without client-level noise gets ``none``'s: FedAvg's server half."""
    from dataclasses import fields

    from common.config import HELP, RunConfig
    from common.lazy import load_component as load
    from common.privacy.registry import GENERIC_CLIENT, GENERIC_SERVER, RELEASE_KINDS

    assert {f.name: f.metadata["choices"] for f in fields(RunConfig)}["release"] is RELEASE_KINDS
    assert HELP["release"]
    for name, kind in RELEASE_KINDS.items():
        assert callable(load(kind.server or GENERIC_SERVER)) and callable(load(kind.client or GENERIC_CLIENT))
        assert name == "none" or callable(load(kind.mechanism))
    none = load(RELEASE_KINDS["none"].server)(RunConfig(), None)
    assert none.name == "none" and none.events(1) == () and none.noise_std(10) == 0.0


def test_the_central_guarantee_says_what_the_server_receives_under_encode_at_server():
    """--encode-at server sends the raw, unclipped increment to the trusted server: the statement
    must not say it sees only clipped replies."""
    from common.privacy.accounting.statement import client_level

    cfg = (
        preset(
            "minilm-rt", mechanism="dr-encoder", threat_model="central", encode_at="server", codec="identity"
        )
        .replace(target_epsilon=8.0, stats_noise_multiplier=2.0)
        .check()
    )
    line = client_level(plan_noise(cfg), {"eps_gdp": 1.0, "eps_tight": 1.0, "mu": 0.5})
    assert "raw unclipped increment under --encode-at server" in line
    assert "sees every clipped reply" not in line
