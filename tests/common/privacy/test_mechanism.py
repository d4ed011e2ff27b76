"""common/privacy/mechanism.py: one property test over every client-level mechanism (each release's
mechanism, bare and wrapped in adaptive clipping, under every threat model it allows), and the
round interface (a RoundSum) the server aggregates through.

What must hold for any mechanism: a client's release is clipped to the round's C before any noise;
a reply it produced passes its own check; the round sum of the replies is the DP-FedAvg mean of the
closed form (mean of the replies under local noise, sum over p·N otherwise, the server's noise of
std σ·C under central noise); a round charges the plan's event; and the state survives a checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from common.config import RunConfig
from common.privacy.mechanism import CLIP_SLACK, AdaptiveClipping, GaussianMechanism, run_mechanism
from common.privacy.plan import plan_noise
from common.privacy.release import global_norm
from common.privacy.threat import THREATS
from common.wire import CLIP_BIT, InvalidReply

DIM, CLIP, CLIENTS, RATE = 4096, 0.5, 40, 0.25  # p·N = 10


def _cfg(threat: str, adaptive: bool) -> RunConfig:
    return RunConfig(
        mechanism="dp-fedavg",
        threat_model=threat,
        num_clients=CLIENTS,
        sample_rate=RATE,
        clip=CLIP,
        noise_multiplier=0.5,
        min_replies=2,
        adaptive_clip=adaptive,
    ).check()


# secure aggregation's release is encoded, summed and decoded by its own protocol (the server never
# holds a reply): tests/common/privacy/test_secure_release.py and tests/server/test_secure_federation.py
CASES = [
    (t, a)
    for t in THREATS
    for a in (False, True)
    if not (a and THREATS[t].each_reply_private) and not THREATS[t].summed_securely
]


@pytest.mark.parametrize(("threat", "adaptive"), CASES)
def test_every_mechanism_clips_checks_sums_charges_and_restores(threat, adaptive):
    mech = run_mechanism(_cfg(threat, adaptive))
    assert isinstance(mech, AdaptiveClipping if adaptive else GaussianMechanism)
    assert mech.threat is THREATS[threat]
    sampled = 10
    share = mech.noise_std(sampled)
    bound = mech.round_clip(mech.instruction_clip())
    assert bound == CLIP
    big = {"w": torch.full((DIM,), 1.0)}  # norm 64 >> C
    sent, meta = mech.privatize(big, 0.0, bound)  # without noise: exactly the clipped update
    update = {k: v for k, v in sent.items() if k != CLIP_BIT}
    assert global_norm(update) == pytest.approx(CLIP, rel=1e-6)
    assert set(sent) == set(mech.reply_shapes({"w": (DIM,)}))
    assert (CLIP_BIT in sent) == adaptive and (meta.get("clip") == bound if adaptive else meta == {})
    if adaptive:
        assert float(sent[CLIP_BIT][0]) == 0.0  # the update was clipped
    mech.check(sent)
    mech.check(mech.privatize(big, share, bound)[0])  # with its noise share too

    # the round sum, against the closed form; zero updates isolate the noise
    replies = [mech.privatize({"w": torch.full((DIM,), 0.01 * (i + 1))}, 0.0, bound)[0] for i in range(4)]
    total = mech.round_sum(sampled)
    for r in replies:
        total.add(r)
    mean, sigma = total.release()
    plain = sum(r["w"] for r in replies)
    if THREATS[threat].each_reply_private:
        torch.testing.assert_close(mean["w"], plain / 4)
    elif not THREATS[threat].clear_replies:
        torch.testing.assert_close(mean["w"], plain / 10)
    else:  # central: the server's noise, std z_Δ·C over p·N
        std = float((mean["w"] - plain / 10).std()) * 10
        assert std == pytest.approx(mech.plan.server_sigma * CLIP, rel=0.1)
    assert sigma == pytest.approx(mech.plan.released_sigma(sampled, 4))
    assert mech.events(1) == (mech.plan.event,)
    if adaptive:  # four clipped replies of ten expected: the noised fraction moved C
        assert mech.clip != CLIP
    state = mech.state()
    again = run_mechanism(_cfg(threat, adaptive))
    again.restore(state)
    assert again.clip == mech.clip


@pytest.mark.parametrize(("threat", "adaptive"), [c for c in CASES if THREATS[c[0]].clear_replies])
def test_a_reply_over_the_clip_or_with_a_noised_bit_is_refused_under_central_noise(threat, adaptive):
    mech = run_mechanism(_cfg(threat, adaptive))
    over = {"w": torch.full((DIM,), CLIP * (1 + 10 * CLIP_SLACK) / math.sqrt(DIM))}
    if adaptive:
        over[CLIP_BIT] = torch.tensor([1.0])
    with pytest.raises(InvalidReply, match="exceeds the clip"):
        mech.check(over)
    if adaptive:
        with pytest.raises(InvalidReply, match="clip-bit must be 0 or 1"):
            mech.check({"w": torch.zeros(DIM), CLIP_BIT: torch.tensor([0.3])})


def test_no_mechanism_without_a_client_level_release():
    assert run_mechanism(RunConfig(mechanism="fedavg").check()) is None
    assert plan_noise(RunConfig(mechanism="fedavg").check()) is None
