"""The one registry of client-level release kinds: for each, its mechanism (what both halves run:
the noise, the clip, the sum's post-processing, its state), its server half and its client half.

Each part is a component reference, ``"module:attr"`` as Flower names a ClientApp, loaded when a run
uses it: this module imports none of them, so it sits below every mechanism and both packages, and
no import circle runs through it. An empty server or client half is the generic one, which asks the
mechanism everything (server/releases/base.py ``Release``, client/releases.py
``release_mechanism``): a new release kind is its mechanism and one :func:`register_release` call,
or, from another package, one entry point (:data:`PLUGIN_GROUPS`), which every process finds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.errors import FedloraError

#: the release of correlated noise (banded matrix-factorization DP-FTRL, common/privacy/planning/ftrl_plan.py)
CORRELATED = "dp-ftrl"
#: the generic halves: a release kind without one of its own runs through these
GENERIC_SERVER = "server.releases.base:Release"
GENERIC_CLIENT = "client.releases:release_mechanism"


@dataclass(frozen=True)
class ReleaseKind:
    """``mechanism``: a factory ``(noise plan, run config) -> Mechanism`` or its reference (empty: no
    client-level release); ``planner``: ``(run config, adapter size) -> NoisePlan`` or its reference,
    the kind's own noise plan (empty: the independent Gaussian release's, common/privacy/planning/plan.py);
    ``server`` / ``client``: the halves' references (empty: the generic ones);
    ``encodes``: the release carries the run's codec's latent (``--codec``: its prior, statistics
    round and public subspace apply); ``integer_valued``: its release is a vector of integers mod 2^b,
    which a transport that sums only such vectors carries (common/privacy/participation/threat.py ``TransportSpec``);
    ``integer_form``: the kind that a run of this one becomes through such a transport (empty: none)."""

    mechanism: str | Callable = ""
    planner: str | Callable = ""
    server: str = ""
    client: str = ""
    encodes: bool = False
    integer_valued: bool = False
    integer_form: str = ""
    check: str = ""  # what a run of this kind must also hold: ``(run config) -> None``'s reference


RELEASE_KINDS: dict[str, ReleaseKind] = {
    "none": ReleaseKind(server="server.releases.none:no_release", client="client.releases:release_none"),
    # through a transport of integers (secure aggregation) the Gaussian release becomes its discrete
    # counterpart, planned for the transport's fewest survivors
    "gaussian": ReleaseKind("common.privacy.mechanisms.mechanism:gaussian_mechanism", integer_form="skellam"),
    "skellam": ReleaseKind(
        "common.privacy.mechanisms.skellam_mechanism:skellam_mechanism",
        planner="common.privacy.mechanisms.skellam_mechanism:skellam_noise",
        integer_valued=True,
    ),
    # the Gaussian mechanism on the codec's latent; its halves encode and decode around it
    "dr-encoder": ReleaseKind(
        "common.privacy.mechanisms.mechanism:gaussian_mechanism",
        server="server.releases.dr_encoder:DrEncoderRelease",
        client="client.releases:release_dr_encoder",
        encodes=True,
        check="common.config:check_dr_encoder",
    ),
    # banded correlated noise, planned for its participation rule: the client clips (the generic
    # half); the server adds the noise
    CORRELATED: ReleaseKind(
        "common.privacy.mechanisms.ftrl_mechanism:banded_ftrl",
        planner="common.privacy.mechanisms.ftrl_mechanism:correlated_noise",
        server="server.releases.correlated:CorrelatedRelease",
        check="common.privacy.mechanisms.ftrl_mechanism:check_run",
    ),
}
_BUILT_IN = frozenset(RELEASE_KINDS)
#: the entry-point groups through which an installed package adds release kinds (its mechanism
#: factory, and optionally its planner, each named by the kind): every process that imports this
#: module, a subprocess node or a deployed SuperNode's ClientApp included, sees them, as pip-installed
#: Flower mods and pytest plugins are found; nothing of the package is imported until a run uses it
PLUGIN_GROUPS = ("fedlora.releases", "fedlora.release_planners")


def _installed_kinds() -> dict[str, ReleaseKind]:
    """The release kinds installed packages declare (:data:`PLUGIN_GROUPS`), by their references."""
    from importlib.metadata import entry_points

    found = entry_points()  # one scan of the installed packages, both groups read from it
    mechanisms, planners = ({ep.name: ep.value for ep in found.select(group=g)} for g in PLUGIN_GROUPS)
    return {name: ReleaseKind(ref, planners.get(name, "")) for name, ref in mechanisms.items()}


for _name, _kind in _installed_kinds().items():  # a built-in name stays the built-in kind
    RELEASE_KINDS.setdefault(_name, _kind)


def release_kind(name: str) -> ReleaseKind:
    """The registered release kind ``name`` (the run config has checked it)."""
    return RELEASE_KINDS[name]


def carried_kind(name: str, integers_only: bool) -> str:
    """The release kind a run of kind ``name`` runs through a transport (``integers_only``: one that
    sums integer vectors only): its integer form there, when it has one; else itself."""
    return (RELEASE_KINDS[name].integer_form or name) if integers_only else name


def register_release(name: str, mechanism: str | Callable, planner: str | Callable = "") -> None:
    """Add a release kind whose ``mechanism`` factory (or its reference) builds its mechanism, planned
    by its own ``planner`` (empty: as the Gaussian release): ``--release name`` is then accepted, and
    both halves run it through their generic ones."""
    if name in RELEASE_KINDS:
        raise FedloraError(f"release '{name}' is already registered")
    RELEASE_KINDS[name] = ReleaseKind(mechanism, planner)


def unregister_release(name: str) -> None:
    """Undo :func:`register_release` (a test's teardown)."""
    if name in RELEASE_KINDS and name not in _BUILT_IN:
        del RELEASE_KINDS[name]


__all__ = [
    "CORRELATED",
    "GENERIC_CLIENT",
    "GENERIC_SERVER",
    "PLUGIN_GROUPS",
    "RELEASE_KINDS",
    "ReleaseKind",
    "carried_kind",
    "register_release",
    "release_kind",
    "unregister_release",
]
