"""The dp-ftrl mechanism's secret stream (common/privacy/mechanisms/ftrl_mechanism.py): persisted before a mean is
used, continued after a crash exactly as an uninterrupted run would, refused when it cannot be."""

from __future__ import annotations

import stat

import numpy as np
import pytest
import torch
from scipy.linalg import solve_triangular

from common.errors import FedloraError
from common.presets import preset
from common.privacy.mechanisms import ftrl_mechanism
from common.privacy.mechanisms.ftrl_mechanism import NOISE_FILE, BandedFtrl
from common.privacy.mechanisms.mechanism import run_mechanism
from common.privacy.planning.factorization import toeplitz
from common.privacy.planning.plan import plan_noise

SHAPES = {"a": (3, 2), "b": (4,)}
CFG = dict(mechanism="dp-ftrl", threat_model="central", target_epsilon=8.0, clip=0.5, num_clients=8,
           sample_rate=0.25, rounds=12)  # fmt: skip


@pytest.fixture()
def seeded(monkeypatch):
    """z_t from one seeded generator (the test's, so two runs can be compared), recorded in order."""
    drawn: list[dict] = []
    gen = torch.Generator().manual_seed(0)

    def normal(shapes):
        z = {k: torch.randn(tuple(s), generator=gen, dtype=torch.float64) for k, s in shapes.items()}
        drawn.append(z)
        return z

    monkeypatch.setattr(ftrl_mechanism, "standard_normal", normal)
    return drawn


def _mechanism() -> BandedFtrl:
    mech = run_mechanism(preset("minilm-rt", **CFG).check())
    assert isinstance(mech, BandedFtrl)
    return mech


def _release(mech: BandedFtrl, rnd: int) -> dict[str, torch.Tensor]:
    """Round ``rnd``'s released mean of a zero update from one client: (σC / pN) · w_{rnd−1}."""
    mech.before_round(rnd)
    total = mech.round_sum(1)
    total.add({k: torch.zeros(s) for k, s in SHAPES.items()})
    mean, _ = total.release()
    return mean


def _noise(mech: BandedFtrl, mean: dict) -> np.ndarray:
    scale = mech.plan.sigma * mech.clip / mech.inner.expected_count
    return np.concatenate([mean[k].double().flatten().numpy() / scale for k in sorted(mean)])


def test_the_released_noise_is_c_inverse_z_and_its_file_is_secret(tmp_path, seeded):
    mech = _mechanism()
    mech.open_state(tmp_path, 1, SHAPES)
    noise = np.stack([_noise(mech, _release(mech, r)) for r in range(1, 7)])
    z = np.stack([np.concatenate([d[k].flatten().numpy() for k in sorted(d)]) for d in seeded])
    c = np.asarray(mech.plan.family.coefs)
    np.testing.assert_allclose(noise, solve_triangular(toeplitz(c, 6), z, lower=True), atol=1e-5)
    path = tmp_path / NOISE_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    mech.close_state()
    assert not path.exists()


def test_a_resumed_stream_continues_the_uninterrupted_one(tmp_path, seeded):
    """Rounds 1-3, a crash after round 4's noise was persisted but before its checkpoint (round 4
    interrupted, its w consumed, not redrawn), then rounds 5-6 by a new process; round 7 skipped
    (its index drawn and discarded). The z's used are those of one uninterrupted stream."""
    first = _mechanism()
    first.open_state(tmp_path, 1, SHAPES)
    for r in range(1, 4):
        _release(first, r)
    checkpoint = first.state()  # committed after round 3
    _release(first, 4)  # persisted, then the crash
    resumed = _mechanism()
    resumed.restore(checkpoint)
    resumed.open_state(tmp_path, 5, SHAPES)
    assert resumed.stream.index == 4  # w_3 consumed, not redrawn
    late = [_noise(resumed, _release(resumed, r)) for r in (5, 6, 8)]
    z = np.stack([np.concatenate([d[k].flatten().numpy() for k in sorted(d)]) for d in seeded])
    assert len(z) == 8  # one z per index 0..7, none drawn twice
    dense = solve_triangular(toeplitz(np.asarray(resumed.plan.family.coefs), 8), z, lower=True)
    np.testing.assert_allclose(np.stack(late), dense[[4, 5, 7]], atol=1e-5)


def test_a_missing_or_foreign_stream_is_refused_untouched(tmp_path, seeded):
    mech = _mechanism()
    mech.open_state(tmp_path, 1, SHAPES)
    for r in range(1, 3):
        _release(mech, r)
    before = (tmp_path / NOISE_FILE).read_bytes()
    ahead = _mechanism()
    ahead.restore({"clip": 0.5, "noise_index": 0})
    with pytest.raises(FedloraError, match="not the same run's stream"):
        ahead.open_state(tmp_path, 2, SHAPES)  # the file is at index 2, the run resumes at round 2
    assert (tmp_path / NOISE_FILE).read_bytes() == before
    lost = _mechanism()
    lost.restore({"clip": 0.5, "noise_index": 2})
    with pytest.raises(FedloraError, match="is missing"):
        lost.open_state(tmp_path / "elsewhere", 3, SHAPES)
    lost.open_state(tmp_path / "elsewhere", 13, SHAPES)  # a finished run of 12 rounds: nothing to draw


def test_one_band_cyclic_poisson_charges_what_dp_fedavg_does():
    """b = 1 is DP-FedAvg: the same σ, the same event every round, Poisson sampling at p."""
    base = dict(
        threat_model="central", target_epsilon=4.0, clip=0.5, num_clients=20, sample_rate=0.2, rounds=10
    )
    ftrl = plan_noise(
        preset("minilm-rt", mechanism="dp-ftrl", participation="cyclic-poisson", bands=1, **base).check()
    )
    fedavg = plan_noise(preset("minilm-rt", mechanism="dp-fedavg", **base).check())
    assert ftrl.sigma == fedavg.sigma and ftrl.p == fedavg.p
    assert all(ftrl.round_events(r) == fedavg.round_events(r) for r in range(1, 11))
    assert ftrl.planned_epsilon(10) == pytest.approx(fedavg.planned_epsilon(10))
