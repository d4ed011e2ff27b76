"""An adapter increment through the Skellam mechanism (common/privacy/mechanisms/skellam_mechanism.py): released
by each client as words mod 2^b with the plan's numbers, summed mod 2^b, decoded to the mean of the
clipped increments plus the predicted noise, in the adapter's own shapes; and a node's check of a
SecAgg+ round's parameters against its own release (client/secure.py)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch

from client.secure import check_params
from common.privacy.mechanisms.discrete import modular_sum
from common.privacy.mechanisms.skellam_mechanism import WORDS, SkellamMechanism
from common.privacy.planning.plan import NoisePlan
from common.privacy.planning.secure_plan import SecureTarget, plan_secure
from server.secure_round import round_params

SHAPES = {"layer.lora_A": (8, 120), "layer.lora_B": (120, 8), "head": (2,)}
DIM = sum(math.prod(s) for s in SHAPES.values())


def _release(clients: int = 8, seed: bytes = b"seed") -> SkellamMechanism:
    """The mechanism of a plan for 5 to ``clients`` survivors (k 4, t 3), its sum over ``clients``."""
    secure = plan_secure(SecureTarget(8.0, 1e-5, 3), DIM, 1.0, (5, clients), (4, 3))
    plan = NoisePlan(secure.sigma, 1.0, 1.0, "secure-aggregation", 8.0, 1e-5, True, 5, family=secure)
    return SkellamMechanism(plan, clients, seed, SHAPES)


def _words(release: SkellamMechanism, update: dict[str, torch.Tensor]) -> np.ndarray:
    return release.privatize(update, release.secure.share_std, 1.0)[0][WORDS].numpy()


def _update(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen) * (0.01 + 0.02 * seed) for name, shape in SHAPES.items()}


def _clipped(update: dict[str, torch.Tensor], clip: float) -> dict[str, torch.Tensor]:
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in update.values()))
    return {k: t * min(1.0, clip / norm) for k, t in update.items()}


def test_the_decoded_mean_is_the_clipped_mean_plus_the_planned_noise_in_the_adapters_shapes():
    clients = 8
    release = _release(clients, os.urandom(16))
    updates = [_update(i) for i in range(clients)]  # norms from below to well above the clip
    total = modular_sum([_words(release, u).astype(np.uint64) for u in updates], release.secure.bits)
    summed = release.round_sum(clients)
    summed.add_sum(total, clients)
    mean, sigma = summed.release()
    assert {k: tuple(v.shape) for k, v in mean.items()} == SHAPES
    truth = {k: sum(_clipped(u, 1.0)[k] for u in updates) / clients for k in SHAPES}
    error = torch.cat([(mean[k] - truth[k]).reshape(-1) for k in SHAPES]).double()
    p = release.secure
    predicted = math.sqrt(clients * p.share_variance) / p.scale / clients  # 8 shares of μ/m
    assert error.std().item() == pytest.approx(predicted, rel=0.15)  # rounding adds < 1 % here
    assert abs(error.mean().item()) < 6 * predicted / math.sqrt(DIM)
    assert sigma == release.released_event(clients).sigma


def test_other_rounds_rotate_differently_and_a_foreign_adapter_is_refused():
    release = _release()
    assert not torch.equal(
        release.for_round(b"round 1", SHAPES).signs(), release.for_round(b"round 2", SHAPES).signs()
    )
    with pytest.raises(ValueError, match="not the plan's adapter"):
        release.privatize({"other": torch.zeros(DIM)}, 0.0, 1.0)
    with pytest.raises(ValueError, match="the plan is for"):
        release.for_round(b"seed", {"layer.lora_A": (8, 120)})


def _params(release: SkellamMechanism, nodes=(1, 2, 3, 4, 5, 6), **change):
    from dataclasses import replace

    return replace(round_params(release, 1, nodes, os.urandom(16), 0), **change)


def test_a_node_checks_the_rounds_protocol_values_against_its_own_plan():
    """Before anything is trained or sent: the node among the round's nodes, the cohort bound, the
    plan's neighbours and threshold for that many nodes (the transport's), its bits, its length and
    its noise share (the release's); each refusal is one line."""
    from common.errors import FedloraError

    release = _release()
    share = release.secure.share_std
    good = _params(release)
    check_params(release, good, 3, share)
    bad = {
        "not among": (good, 9, share),
        "cohort bound": (_params(release, tuple(range(1, 10))), 3, share),
        r"the plan.s are \(4, 3\)": (_params(release, k=5), 3, share),
        "bits per coordinate": (_params(release, bits=release.secure.bits + 1), 3, share),
        "coordinates": (_params(release, length=release.secure.padded * 2), 3, share),
        "noise share": (good, 3, share / 2),
    }
    for why, (params, node, std) in bad.items():
        with pytest.raises(FedloraError, match=why) as err:
            check_params(release, params, node, std)
        assert "\n" not in str(err.value) and str(err.value).startswith("node policy: secure aggregation")


def test_a_small_round_links_every_node_and_keeps_the_threshold_rule():
    from common.privacy.planning.secure_plan import round_graph

    plan = _release().words  # k 4, t 3
    assert round_graph(plan, 8) == (4, 3)
    assert round_graph(plan, 4) == (3, 3)  # k = n - 1; t 3 still in (k/2, k]
    assert round_graph(plan, 3) == (2, 2)  # t 3 > k: the largest rule-abiding threshold's floor(k/2) + 1
    for n in range(2, 9):
        k, t = round_graph(plan, n)
        assert 2 * t > k >= t >= 1 and k <= n - 1


def test_the_charge_of_a_sum_is_the_noise_its_shares_carry():
    """r shares of variance μ/m sum to a Skellam of variance r·μ/m: at m survivors the plan's σ, above
    it more noise (a smaller ε), never less."""
    release = _release()
    p = release.secure
    at_m = release.released_event(p.min_survivors)
    assert at_m.sigma == pytest.approx(p.sigma) and at_m.mu == pytest.approx(p.mu)
    assert (at_m.p, at_m.l1, at_m.l2) == (1.0, p.l1, p.l2)
    assert release.released_event(p.min_survivors + 3).mu == pytest.approx(
        (p.min_survivors + 3) * p.share_variance
    )
    assert release.noise_std(8) == pytest.approx(math.sqrt(p.share_variance) / p.scale)


def test_a_zero_update_is_encoded_with_the_full_work_and_comes_out_as_its_share_alone(monkeypatch):
    """A zero update (a hidden coin that did not come up) goes through the full clip, rotation and
    rounding, so its timing does not show it, and its message is its Skellam share alone."""
    from common.privacy.mechanisms import discrete

    release = _release()
    zero = {name: torch.zeros(shape) for name, shape in SHAPES.items()}
    share = np.arange(release.secure.padded, dtype=np.int64) - 7  # a fixed stand-in for the noise
    monkeypatch.setattr(discrete, "skellam_noise", lambda length, variance: share[:length].copy())
    calls = []
    real = discrete.hadamard_transform
    monkeypatch.setattr(discrete, "hadamard_transform", lambda x: calls.append(1) or real(x))
    message = _words(release, zero)
    assert calls
    assert np.array_equal(message, discrete.wrap(share, release.secure.bits).astype(np.int64))
