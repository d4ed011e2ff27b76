"""A Flower ``Grid`` that delivers messages to ClientApps in this process (no Ray, no SuperLink).

Each node gets its own ``Context`` (``partition-id``, ``num-partitions``, persistent ``state``),
exactly what Flower's simulation engine provides, and each message's content is deep-copied on
the way in and out so nothing is shared by reference between server and clients.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from flwr.app import ConfigRecord, Context, Error, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from tqdm.auto import tqdm

from common.privacy.accounting.ledger import LEDGER_SYNC
from common.privacy.participation.participation import SIMULATION, SKIP_IDLE
from common.progress import LogBar, bar
from common.secagg import identity

log = logging.getLogger("fedlora.inprocess")

#: (a round's train messages, their nodes' contexts) -> each node's reply or what it raised
CohortHandler = Callable[[list[Message], list[Context]], list[Message | Exception]]

SERVER_NODE_ID = 0
FIRST_NODE_ID = 1001


def clients_bar(messages: list[Message]) -> tqdm | LogBar:
    """The terminal's bar of one exchange's clients (common/progress.py), named by its round and
    message type: ``round 3 train``."""
    head = messages[0].metadata if messages else None
    desc = f"round {head.group_id} {head.message_type}" if head else "clients"
    return bar(len(messages), desc, "client")


def tqdm_clients(messages: list[Message]) -> Iterable[Message]:
    """``messages``, each counted on :func:`clients_bar` once its node has answered."""
    with clients_bar(messages) as progress:
        for msg in messages:
            yield msg
            progress.update(1)


def call_app(
    app: Callable[[Message, Context], Message], msg: Message, context: Context
) -> Message | Exception:
    """The ClientApp's reply to ``msg``, or what it raised (the grid answers it as Flower does)."""
    try:
        return app(msg, context)
    except Exception as exc:
        return exc


def is_train_round(messages: list[Message]) -> bool:
    """Whether ``messages`` are a round's train messages (what the batched engine takes as a cohort;
    a transport's further stages, ``train.<stage>``, and queries go one by one)."""
    return bool(messages) and all(m.metadata.message_type == "train" for m in messages)


class InProcessGrid(Grid):
    """Delivers each pushed message to ``client_app`` synchronously and keeps the reply."""

    def __init__(
        self,
        client_app: Callable[[Message, Context], Message],
        num_nodes: int,
        run_config: dict,
        run_id: int = 1,
        raise_errors: bool = True,
        state_root: Path | None = None,
        cohort: CohortHandler | None = None,
    ) -> None:
        """``cohort``: trains a round's train messages together (the batched engine), else each
        message goes to ``client_app``. ``state_root``: node k keeps its state (ledgers, signing
        record) and its identity key (secure aggregation, common/secagg/identity.py) in
        ``state_root/node-k``, beside the roster of every node's public key
        (``state_root/roster.pub``); the encoders the nodes receive are cached once, in
        ``state_root/shared``; without ``state_root``, all of it in a temporary folder. The nodes' ledgers
        commit at ``ledger-sync = normal`` (client/node/state.py): they survive a crash of this
        process but not of the machine (the server's own ledger commits at ``full``). A run's
        ``idle-training skip`` becomes each node's :data:`SKIP_IDLE`, in its ``context.state`` (never
        its node config, which a deployed node's operator sets): only a simulation writes it."""
        self.client_app = client_app
        self.cohort = cohort
        self.raise_errors = raise_errors
        self._run = Run.create_empty(run_id)
        # the operator's step, done before the first message (nothing is written before the run's
        # checks): every node gets an identity key, and every node the roster of them all
        # without a state root: a temporary folder, removed with this grid (or at exit)
        self._scratch = None if state_root else tempfile.TemporaryDirectory(prefix="fedlora-nodes-")
        keys = Path(state_root or self._scratch.name)
        skip_idle = run_config.get("idle-training") == "skip"
        self._identities = ([keys / f"node-{k}" / "identity" for k in range(num_nodes)], keys / "roster.pub")
        self.contexts = {
            FIRST_NODE_ID + k: Context(
                run_id=run_id,
                node_id=FIRST_NODE_ID + k,
                node_config={
                    "partition-id": k,
                    "num-partitions": num_nodes,
                    LEDGER_SYNC: "normal",  # one disk for every node: their syncs would queue
                    identity.IDENTITY_KEY: str(keys / f"node-{k}" / "identity"),
                    identity.ROSTER: str(keys / "roster.pub"),
                    "state-dir": str(keys / f"node-{k}"),
                    "encoder-cache": str(keys / "shared"),
                },
                state=RecordDict({SIMULATION: ConfigRecord({SKIP_IDLE: skip_idle})}),
                run_config=dict(run_config),
            )
            for k in range(num_nodes)
        }
        self.offline: set[int] = set()  # nodes that never answer (for dropout tests)
        self._replies: dict[str, Message] = {}
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SERVER_NODE_ID, 1

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def address(self, msg: Message, copy_content: bool = True) -> tuple[str, Message | None]:
        """Give ``msg`` a message id; returns it with the message its node receives (its own copy of
        the content unless ``copy_content`` is false), or ``None`` when the node is offline."""
        msg_id = str(uuid.uuid4())
        msg.metadata.__dict__["_message_id"] = msg_id
        node = msg.metadata.dst_node_id
        if node in self.offline:
            return msg_id, None
        content = copy.deepcopy(msg.content) if copy_content else msg.content
        delivered = Message(content, node, msg.metadata.message_type, group_id=msg.metadata.group_id)
        delivered.metadata.__dict__["_message_id"] = msg_id
        return msg_id, delivered

    def provision(self) -> None:
        """Every node's identity key and the roster, written once, before the first message."""
        if self._identities is not None:
            identity.provision(*self._identities)
            self._identities = None

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver ``messages``: one by one to the ClientApp, or, with a ``cohort`` handler, a
        round's train messages to it in one call (client/cohort_round.py)."""
        self.provision()
        ids, pending = [], []
        for msg in messages:
            msg_id, delivered = self.address(msg)
            ids.append(msg_id)
            if delivered is not None:
                pending.append((msg_id, delivered))
        delivered = [d for _, d in pending]
        if self.cohort is not None and is_train_round(delivered):
            with clients_bar(delivered) as progress:
                outcomes = self.cohort(delivered, [self.contexts[d.metadata.dst_node_id] for d in delivered])
                progress.update(len(delivered))
        else:
            outcomes = (
                call_app(self.client_app, d, self.contexts[d.metadata.dst_node_id])
                for d in tqdm_clients(delivered)
            )
        for (msg_id, msg), outcome in zip(pending, outcomes, strict=True):
            reply = self._reply(msg, outcome)
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self._replies[msg_id] = reply
        return ids

    def _reply(self, msg: Message, outcome: Message | Exception) -> Message:
        """The reply the server receives: its own copy of the content, or, for a node that raised,
        the error Flower answers (raised here with ``raise_errors``)."""
        if isinstance(outcome, Exception):
            if self.raise_errors:
                raise outcome
            log.warning("node %d failed: %s", msg.metadata.dst_node_id, outcome, exc_info=outcome)
            return Message(Error(code=0, reason=f"{type(outcome).__name__}: {outcome}"), reply_to=msg)
        if outcome.has_content():
            return Message(copy.deepcopy(outcome.content), reply_to=msg)
        return outcome

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
