"""What a deployment does when one of its processes exits during the run.

The SuperLink carries the run: if it exits, the run has failed and everything is stopped. A
SuperNode is one client among many: its exit is reported and the run goes on, the ServerApp's round
loop deciding (the SuperLink answers the lost node's instructions with "Node Unavailable", a dropout;
a round with fewer than ``min-replies`` usable replies is withheld). With ``--restart-nodes`` the
node is started again on its partition and state directory (its release ledger carries over), and
joins the rounds sampled after it connects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from server.deploy.deployment import Deployment, RunFailed
from server.deploy.flower import start_supernode
from server.deploy.processes import Proc, track


@dataclass
class Supervisor:
    """Call :meth:`check` periodically while the run goes on; it raises :class:`RunFailed` when a
    critical process (the SuperLink) has exited."""

    dep: Deployment
    reported: set[int] = field(default_factory=set)  # PIDs whose exit was handled
    lost: list[str] = field(default_factory=list)  # names of SuperNodes that exited, in order

    def check(self) -> None:
        track(self.dep)
        for proc in list(self.dep.procs):
            code = proc.poll()
            if code is None or proc.pid in self.reported:
                continue
            self.reported.add(proc.pid)
            if proc.critical:
                raise RunFailed(f"{proc.name} exited with code {code} during the run: {proc.exit_reason()}")
            if proc.partition is not None:
                self._node_exited(proc, code)

    def _node_exited(self, proc: Proc, code: int) -> None:
        self.lost.append(proc.name)
        nodes = self.dep.opts.nodes
        alive = sum(1 for p in self.dep.procs if p.partition is not None and p.poll() is None)
        self.dep.say(
            f"[deploy] {proc.name} exited with code {code} during the run ({proc.exit_reason()}); "
            f"{alive} of {nodes} SuperNodes running: the run goes on, rounds short of min-replies are withheld"
        )
        if self.dep.opts.restart_nodes:
            new = start_supernode(self.dep, proc.partition, nodes, name=proc.name)
            self.dep.say(f"[deploy] restarted {proc.name} (pid {new.pid}) on partition {proc.partition}")


def supervisor(dep: Deployment) -> Callable[[], None]:
    """The check to call while the run goes on."""
    return Supervisor(dep).check


__all__ = ["Supervisor", "supervisor"]
