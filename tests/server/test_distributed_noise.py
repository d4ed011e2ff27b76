"""Distributed noise says what its aggregate reveals (issue 30, finding 3): the sum of r replies
carries noise variance r·σ²C²/m, so the number of replies is readable from the aggregate; the
guarantee is therefore zero-out adjacency with participation visible, accounted without sampling
amplification (p = 1), at every population size."""

from __future__ import annotations

import json
import math

import pytest
import torch

from client.releases import release_mechanism
from common.presets import preset
from common.privacy.accounting.ledger import Ledger
from common.privacy.participation.threat import CLIENT_LEVEL
from common.privacy.planning.plan import plan_noise
from common.wire import TrainInstruction
from server.releases import make_release
from tests.harness import TINY, federate

DIM = 40_000  # coordinates of the toy update: enough for the energy to pin the count


def _cfg(**kw):
    settings = dict(
        **{**TINY, "num_clients": 4},
        mechanism="dp-fedavg",
        threat_model="distributed",
        noise_multiplier=1.0,
        clip=1.0,
        min_replies=1,
        sample_rate=0.5,
    )
    return preset("minilm-rt", **{**settings, **kw}).check()


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at δ by the closed form δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth, Su
    2022, Cor. 2.13), solved by bisection: the exact ε of T Gaussian releases at σ (μ = √T/σ)."""
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        d = phi(-mid / mu + mu / 2) - math.exp(mid) * phi(-mid / mu - mu / 2)
        lo, hi = (mid, hi) if d > delta else (lo, mid)
    return hi


def test_the_aggregate_reveals_how_many_replied():
    """Through the real client release and server aggregate: zero updates from r of 4 sampled
    clients; the aggregate's energy gives r back exactly (so participation is not hidden)."""
    cfg = _cfg()
    plan = plan_noise(cfg)
    release = make_release(cfg, plan)
    share = release.noise_std(4)
    ins = TrainInstruction(1, {}, noise_std=share)
    zero = {"w": torch.zeros(DIM)}
    for replied in (1, 2, 3, 4):
        replies = [release_mechanism(zero, ins, cfg, torch.device("cpu"), None)[0] for _ in range(replied)]
        total = release.round_sum(4)
        for reply in replies:
            total.add(reply)
        mean, _ = total.release()
        energy = float(mean["w"].square().mean()) * cfg.expected_cohort**2
        assert round(energy / share**2) == replied


def test_distributed_noise_is_zero_out_and_unamplified_at_every_population():
    g = CLIENT_LEVEL["distributed"]
    assert g.relation == "zero-out" and not g.amplified and "number of replies is visible" in g.adjacency
    for clients, rate in ((4, 0.5), (1000, 0.1)):
        assert plan_noise(_cfg(num_clients=clients, sample_rate=rate)).p == 1.0


@pytest.mark.integration
def test_a_four_client_distributed_run_states_and_charges_what_its_aggregate_reveals(tmp_path):
    out = tmp_path / "run"
    cfg = _cfg(rounds=2, out_dir=str(out))
    federate(cfg)
    summary = json.loads((out / "summary.json").read_text())
    assert "zero-out adjacency" in summary["privacy"] and "number of replies is visible" in summary["privacy"]
    assert "add/remove" not in summary["privacy"]
    assert summary["client_privacy"]["relation"] == "zero-out"
    ledger = Ledger.open(out / "ledger.sqlite", "client-level")
    rows = ledger.rows()
    assert [r["p"] for r in rows] == [1.0, 1.0] and {r["sample_rate"] for r in rows} == {0.5}
    # two releases at sigma 1 without amplification: exactly mu = sqrt(2) GDP; PLD agrees with the closed form
    exact = _gaussian_epsilon(math.sqrt(2) / 1.0, cfg.delta)
    assert ledger.spent()["eps_tight"] == pytest.approx(exact, rel=2e-2)
    ledger.close()
