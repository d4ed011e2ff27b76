"""common/privacy/mechanisms/mechanism.py: one property test over every client-level mechanism (each release's
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
from common.privacy.mechanisms.mechanism import CLIP_SLACK, AdaptiveClipping, GaussianMechanism, run_mechanism
from common.privacy.mechanisms.release import global_norm
from common.privacy.participation.threat import THREATS
from common.privacy.planning.plan import plan_noise
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


# through secure aggregation the release is the Skellam mechanism's integers:
# test_the_skellam_mechanism_clips_checks_sums_charges_and_restores below
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


@pytest.mark.parametrize("threat", [t for t in THREATS if THREATS[t].summed_securely])
def test_the_skellam_mechanism_clips_checks_sums_charges_and_restores(threat):
    """The same properties of the release a transport of integers carries: what leaves a client is
    its clipped update plus its share (its words decode to within the share's noise of the clip,
    never the raw update), passes its own check, a foreign reply does not; the round's sum decodes
    to the closed form (sum over p·N plus the summed shares, σ of the survivors' charge); a round
    charges the plan's event; the clip survives a checkpoint."""
    import os

    import numpy as np

    from common.privacy.mechanisms.skellam_mechanism import WORDS, SkellamMechanism

    cfg = RunConfig(
        mechanism="dp-fedavg",
        threat_model=threat,
        num_clients=CLIENTS,
        sample_rate=RATE,
        clip=CLIP,
        target_epsilon=8.0,
        min_replies=21 if THREATS[threat].hides_participation else 6,  # a majority of who is asked
        max_participations=0 if THREATS[threat].hides_participation else 2,
    ).check()
    assert cfg.release_kind == "skellam"
    base = run_mechanism(cfg, DIM)
    assert isinstance(base, SkellamMechanism) and base.threat is THREATS[threat]
    mech = base.for_round(os.urandom(32), {"w": (DIM,)})
    bound = mech.round_clip(mech.instruction_clip())
    share = mech.noise_std(10)
    assert bound == CLIP and share == pytest.approx(mech.secure.share_std)
    big = {"w": torch.full((DIM,), 1.0)}  # norm 64 >> C
    sent, meta = mech.privatize(big, share, bound)
    assert set(sent) == set(mech.reply_shapes({"w": (DIM,)})) == {WORDS} and meta == {}
    mech.check(sent)
    for foreign in ({WORDS: sent[WORDS].double()}, {WORDS: sent[WORDS][:-1]}, {**sent, "w": big["w"]}):
        with pytest.raises(InvalidReply):
            mech.check(foreign)
    alone = mech.round_sum(10)
    alone.add(sent)
    decoded = alone.release()[0]["w"] * mech.expected_count  # one client: its clipped update + its share
    assert global_norm({"w": decoded - torch.full((DIM,), CLIP / math.sqrt(DIM))}) < 6 * share * math.sqrt(
        DIM
    )

    updates = [{"w": torch.full((DIM,), 0.01 * (i + 1))} for i in range(4)]  # norms 0.64 .. 2.56 > C
    replies = [mech.privatize(u, share, bound)[0] for u in updates]
    total = mech.round_sum(10)
    for r in replies:
        total.add(r)
    mean, sigma = total.release()
    plain = sum(torch.full((DIM,), CLIP / math.sqrt(DIM)) for _ in updates) / mech.expected_count
    error = (mean["w"] - plain).double()
    assert float(error.std()) == pytest.approx(math.sqrt(4) * share / mech.expected_count, rel=0.15)
    assert sigma == pytest.approx(mech.released_event(4).sigma)
    summed = mech.round_sum(10)  # the transport's form: the one sum mod 2^b it unmasked
    summed.add_sum(np.asarray(total.total), 4)
    torch.testing.assert_close(summed.release()[0]["w"], mean["w"])
    assert mech.events(1) == (mech.plan.event,)
    again = run_mechanism(cfg, DIM)
    again.restore(mech.state())
    assert again.clip == mech.clip == CLIP
