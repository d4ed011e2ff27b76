"""common/privacy/participation/threat.py: one property test over every client-level threat model.

Whatever the threat model, an applied round's sum must carry at least the planned noise multiplier σ
(sensitivity C), split as the model says between the clients and the server; a node that trusts no
one may take part exactly where every reply carries its whole noise; and only a model whose server
alone sees the sample (central noise) may amplify by sampling."""

from __future__ import annotations

import math

import pytest

from common.config import THREAT_MODELS
from common.privacy.participation.threat import CLIENT_LEVEL, THREATS, TRUST, ThreatModel

SIGMA, CLIP = 0.8, 0.5


def test_the_registry_is_the_configs_choices():
    assert THREAT_MODELS is THREATS and set(CLIENT_LEVEL) == set(THREATS)  # the live registry
    assert all(isinstance(t, ThreatModel) and t.name == name for name, t in THREATS.items())


@pytest.mark.parametrize("name", list(THREATS))
@pytest.mark.parametrize("m", [1, 3, 10])
def test_an_applied_sum_carries_the_planned_noise(name, m):
    threat = THREATS[name]
    share = threat.client_std(SIGMA, CLIP, m, 1.0)
    if threat.each_reply_private:  # every reply alone carries sigma*C
        assert share == pytest.approx(SIGMA * CLIP)
    elif threat.clear_replies:  # the server adds all of it
        assert share == 0.0 and threat.released_sigma(SIGMA, m, m) == SIGMA
    else:  # m shares of variance (sigma*C)^2/m sum to sigma*C; more replies only add noise
        assert math.sqrt(m) * share == pytest.approx(SIGMA * CLIP)
        assert threat.released_sigma(SIGMA, m, m) == pytest.approx(SIGMA)
        assert threat.released_sigma(SIGMA, m + 1, m) > SIGMA
    if not threat.each_reply_private:  # adaptive clipping's count is noised like the update
        client, server = threat.count_share(1.0, m)
        assert (client == 0) == (share == 0) and (server == 0) == (share > 0)


@pytest.mark.parametrize("name", list(THREATS))
def test_trust_observer_and_amplification_agree(name):
    threat = THREATS[name]
    assert threat.trust in TRUST
    assert (threat.trust == "none") == threat.each_reply_private
    # the sample is hidden from all but the server (central), or from everyone (hidden participation)
    assert threat.guarantee.amplified == (threat.clear_replies or threat.hides_participation)
    # hidden participation's neighbour is a client sending a zero update: zero-out, amplified
    assert (threat.guarantee.relation == "add/remove") == threat.clear_replies
    assert threat.server_sees and threat.guarantee.observer
