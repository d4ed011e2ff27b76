"""The transports a round's replies travel by, by the name a threat model declares
(common/privacy/participation/threat.py ``ThreatModel.transport``): the plain exchange, in which the server
receives each reply (server/round.py), and SecAgg+, in which it learns only the survivors' sum
(server/secure_round.py). :func:`server.round.run_round` is the same for both."""

from __future__ import annotations

from common.privacy.participation.threat import THREATS, TRANSPORTS_DECLARED
from server.round import Transport, exchange_replies
from server.secure_round import secagg_round

#: transport name -> the round's transport
TRANSPORTS: dict[str, Transport] = {"exchange": exchange_replies, "secagg+": secagg_round}

assert set(TRANSPORTS) == set(TRANSPORTS_DECLARED), "every declared transport has a server half"


def transport_for(threat_model: str) -> Transport:
    """The transport the run's threat model declares."""
    return TRANSPORTS[THREATS[threat_model].transport.name]


__all__ = ["TRANSPORTS", "transport_for"]
