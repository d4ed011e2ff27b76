"""The transport a round's replies travel by: the server half that the run's threat model declares
(common/privacy/participation/threat.py ``ThreatModel.transport``, its ``TransportSpec.server``): the
plain exchange, in which the server receives each reply (server/round.py), SecAgg+, in which it
learns only the survivors' sum (server/secure_round.py), or a registered one
(``register_threat``). :func:`server.round.run_round` is the same for every one."""

from __future__ import annotations

from common.lazy import load_component
from common.privacy.participation.threat import THREATS
from server.round import Transport


def transport_for(threat_model: str) -> Transport:
    """The server half of the transport the run's threat model declares."""
    return load_component(THREATS[threat_model].transport.server)


__all__ = ["transport_for"]
