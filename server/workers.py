"""A pool of client worker processes for ``fedlora simulate``: every core trains clients.

Each worker is a process holding its own resident model (the ClientApp's per-process model
cache), one torch thread, and a ``Context`` for every node (the same ``node_config`` the in-process
grid gives). A round's messages go to a shared queue; an idle worker takes the next one, runs the real
ClientApp on it and sends the reply back; the server receives the replies in the order it sent the
messages. Under the sequential engine results do not depend on the number of workers: a client's
local training is seeded by (seed, round, partition) alone, and its DP noise comes from OS entropy in
any case. Under the batched engine each worker trains its share of a round as one cohort
(client/cohort.py), whose dropout draws and rounding depend on that share: the same distribution.

Workers are forked from a forkserver (Linux, macOS; spawned elsewhere) that imports torch and the
ClientApp's modules once: a worker starts in milliseconds, not the ~10 s of a fresh interpreter's
imports on a 2-core CPU, and a process that starts several pools (a test session) pays them once. The
forkserver never runs torch (no OpenMP pool or CUDA context to inherit), and each worker takes the
server's working directory and environment of when its pool started, as a spawned one would.

Ctrl-C at a terminal signals the whole process group; the workers ignore SIGINT from their start
(inherited from the forkserver, itself started with SIGINT ignored, or across a spawn's exec): the
server's process alone takes the interrupt and stops them (:meth:`WorkerPoolGrid.close` with
``abort``), so no worker prints a traceback, and the run continues with ``--resume`` as after a crash.

Messages cross the process boundary as Flower's own protobuf (``message_to_proto``), never pickled.
A node's ``context.state`` lives here, as Flower's simulation keeps it beside the node: it travels
with each of the node's messages and comes back with the reply (whichever worker ran it), so a
node's state persists across messages (secure aggregation keeps its secrets there between stages).
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import multiprocessing.forkserver
import os
import queue
import select
import signal
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.serde import (
    ProtoMessage,
    ProtoRecordDict,
    message_from_proto,
    message_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)

from common import timing
from common.cores import available_cores
from common.device import resolve_device
from common.errors import FedloraError
from common.lazy import load_component
from common.signals import handlers_while
from server.inprocess import InProcessGrid, call_app, clients_bar, is_train_round

log = logging.getLogger("fedlora.workers")

#: (sequence number, destination node, bytes of the phase times, bytes of the node's state)
_HEADER = struct.Struct("<qqqq")
_STOP = b""


def resolve_workers(workers: int, device: str = "cpu") -> int:
    """``workers`` 0 → one per GPU on CUDA (each process holds a whole model on its device), else
    one per available core; otherwise as given (1: clients run in this process)."""
    if workers:
        return workers
    if resolve_device(device).type == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    return available_cores()


class WorkerPoolGrid(InProcessGrid):
    """An :class:`InProcessGrid` whose ClientApp calls run in ``workers`` worker processes."""

    def __init__(
        self,
        client_ref: str,
        num_nodes: int,
        run_config: dict,
        workers: int,
        run_id: int = 1,
        state_root: Path | None = None,
        cohort_ref: str = "",
    ) -> None:
        """``cohort_ref``: the batched engine's handler (client/cohort_round.py): a round's train
        messages then go to the workers as one cohort per worker, not one message per task."""
        super().__init__(_unused, num_nodes, run_config, run_id, True, state_root)
        self._cohorts = bool(cohort_ref)
        ctx = _context(client_ref, cohort_ref)
        self._tasks, self._done = ctx.Queue(), ctx.Queue()
        nodes = {node: dict(c.node_config) for node, c in self.contexts.items()}
        server, environ = os.getpid(), dict(os.environ)
        self._procs = [
            ctx.Process(
                target=_serve,
                args=(
                    self._tasks,
                    self._done,
                    (client_ref, cohort_ref),
                    nodes,
                    dict(run_config),
                    run_id,
                    (server, k, environ),
                ),
                daemon=True,
                name=f"fedlora-worker-{k}",
            )
            for k in range(workers)
        ]
        # a forkserver's workers inherit SIGINT ignored; a spawned one starts with it ignored
        try:
            with _sigint_ignored() if ctx.get_start_method() == "spawn" else nullcontext():
                for proc in self._procs:
                    proc.start()
        except BaseException:  # Ctrl-C while they start: stop those started before this process's
            # exit unlinks the queues' semaphores (a worker still reading its arguments would print
            # a FileNotFoundError traceback)
            self._procs = [proc for proc in self._procs if proc.pid is not None]
            self.close(abort=True)
            raise

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        self.provision()
        ids, sent, tasks = [], {}, []
        for seq, msg in enumerate(messages):
            msg_id, delivered = self.address(msg, copy_content=False)  # serialised below: a copy
            ids.append(msg_id)
            if delivered is None:
                continue
            node = delivered.metadata.dst_node_id
            sent[seq] = delivered
            state = _state_bytes(self.contexts[node].state)
            message = message_to_proto(delivered).SerializeToString()
            tasks.append(_HEADER.pack(seq, node, 0, len(state)) + state + message)
        if self._cohorts and is_train_round(list(sent.values())):
            share = -(-len(tasks) // len(self._procs))  # a round's train messages: one cohort per worker
            tasks = [tasks[i : i + share] for i in range(0, len(tasks), share)]
        for task in tasks:
            self._tasks.put(task)
        replies = {}
        with clients_bar(list(sent.values())) as progress:
            while len(replies) < len(sent):
                seq, reply, state = self._receive()
                replies[seq] = reply
                self.contexts[sent[seq].metadata.dst_node_id].state = state
                progress.update(1)
        for seq in sorted(sent):  # the order the messages were sent in
            reply = replies[seq]
            if reply.has_error() and self.raise_errors:
                raise FedloraError(f"node {sent[seq].metadata.dst_node_id}: {reply.error.reason}")
            reply = Message(reply.content, reply_to=sent[seq]) if reply.has_content() else reply
            reply.metadata.__dict__["_message_id"] = f"{ids[seq]}-reply"
            self._replies[ids[seq]] = reply
        return ids

    def _receive(self) -> tuple[int, Message, RecordDict]:
        while True:
            try:
                data = self._done.get(timeout=5.0)
                break
            except queue.Empty:
                if dead := [p.name for p in self._procs if not p.is_alive()]:
                    raise FedloraError(f"client worker(s) {', '.join(dead)} died") from None
        seq, _, size, state_size = _HEADER.unpack_from(data)
        timing.add(json.loads(data[_HEADER.size : _HEADER.size + size]))
        rest = data[_HEADER.size + size :]
        state = _state_from(rest[:state_size])
        return seq, message_from_proto(ProtoMessage.FromString(rest[state_size:])), state

    def close(self, abort: bool = False) -> None:
        """Stop the workers (idempotent): each finishes its task and stops; with ``abort`` (an
        interrupt or an error in the server) they are terminated at once, and this process no longer
        waits to hand them the tasks still queued (it would wait forever: nobody reads them)."""
        if abort:
            self._tasks.cancel_join_thread()
            for proc in self._procs:
                proc.terminate()
        else:
            for _ in self._procs:
                self._tasks.put(_STOP)
        for proc in self._procs:
            proc.join(timeout=5 if abort else 30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        self._procs = []

    def __enter__(self) -> WorkerPoolGrid:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close(abort=kind is not None)


def _context(*refs: str) -> mp.context.BaseContext:
    """The forkserver context, its server preloading torch and the modules of ``refs`` (``""``: none)
    and started with SIGINT ignored, which its workers inherit; spawn where there is no forkserver.
    The forkserver is this process's for good: a later pool reuses it (what it preloaded stays)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", *(ref.partition(":")[0] for ref in refs if ref)])
    with _sigint_ignored():
        multiprocessing.forkserver.ensure_running()
    # Wait for its preloading (seconds) with a process that carries nothing: a Ctrl-C meanwhile
    # leaves the forkserver to start that one after this process is gone. A worker, started then
    # instead, would find its queues' semaphores unlinked by this process's exit and print a
    # FileNotFoundError traceback.
    probe = ctx.Process(target=_nothing, daemon=True, name="fedlora-forkserver-probe")
    probe.start()
    probe.join()
    return ctx


def _nothing() -> None:
    """The forkserver probe's target (:func:`_context`)."""


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored in this process while the forkserver (or a spawned worker) starts, so that it
    starts with it ignored (an ignored signal stays ignored across exec and fork; a handler does
    not). An interrupt in these milliseconds is lost (the user presses Ctrl-C again); off the main
    thread, where the handler cannot be changed, the workers ignore it from :func:`_serve` on."""
    with handlers_while({signal.SIGINT: signal.SIG_IGN}):
        yield


def _unused(msg: Message, ctx: Context) -> Message:
    raise RuntimeError("a worker pool grid runs its ClientApp in its workers")


def _serve(
    tasks,
    done,
    refs: tuple[str, str],
    nodes: dict[int, dict],
    run_config: dict,
    run_id: int,
    worker: tuple[int, int, dict[str, str]],
) -> None:
    """A worker, ``worker = (server pid, index, server's os.environ)``: one torch thread (on CUDA, GPU
    ``index`` of several), the ClientApp and the batched engine's cohort handler (``refs``; "" for
    none), a Context per node, in the server's environment (multiprocessing sets the working
    directory); answers until told to stop or until the server's process is gone. SIGINT is ignored:
    the server stops it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server, index, environ = worker
    os.environ.clear()
    os.environ.update(environ)
    import torch
    from flwr.supercore.task_identity import TaskIdentity
    from tqdm import tqdm

    # tqdm's default lock is a multiprocessing one (a named semaphore): a worker terminated on an
    # interrupt would leave it to the resource tracker's "leaked semaphore" warning
    tqdm.set_lock(threading.RLock())

    torch.set_num_threads(1)
    if str(run_config.get("device", "auto")) != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(index % torch.cuda.device_count())  # "cuda" is then this worker's GPU
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 1
    app = load_component(refs[0])
    cohort = load_component(refs[1]) if refs[1] else None
    contexts = {
        node: Context(run_id=run_id, node_id=node, node_config=cfg, state=RecordDict(), run_config=run_config)
        for node, cfg in nodes.items()
    }
    threading.Thread(target=_exit_with, args=(server,), daemon=True, name="orphan-watch").start()
    while (data := tasks.get()) != _STOP:
        received = [_task(one, contexts) for one in (data if isinstance(data, list) else [data])]
        timing.reset()
        if isinstance(data, list):  # a cohort (the batched engine): one call, one outcome per node
            outcomes = cohort([msg for _, _, msg in received], [contexts[node] for _, node, _ in received])
        else:
            outcomes = [call_app(app, received[0][2], contexts[received[0][1]])]
        for (seq, node, msg), outcome in zip(received, outcomes, strict=True):
            if isinstance(outcome, Exception):  # answered as Flower answers a ClientApp that raised
                log.warning("node %d failed: %s", node, outcome)
                outcome = Message(Error(code=0, reason=f"{type(outcome).__name__}: {outcome}"), reply_to=msg)
            phases = json.dumps({k: v for k, v in timing.totals().items() if v}).encode()
            timing.reset()  # a cohort's phases travel with its first reply
            state = _state_bytes(contexts[node].state)
            reply_bytes = message_to_proto(outcome).SerializeToString()
            done.put(_HEADER.pack(seq, node, len(phases), len(state)) + phases + state + reply_bytes)


def _task(data: bytes, contexts: dict[int, Context]) -> tuple[int, int, Message]:
    """``(sequence number, node, message)`` of one task, the node's state restored from it."""
    seq, node, _, state_size = _HEADER.unpack_from(data)
    contexts[node].state = _state_from(data[_HEADER.size : _HEADER.size + state_size])
    return seq, node, message_from_proto(ProtoMessage.FromString(data[_HEADER.size + state_size :]))


def _state_bytes(state: RecordDict) -> bytes:
    """A node's ``context.state`` as Flower's protobuf (empty: nothing kept)."""
    return recorddict_to_proto(state).SerializeToString() if len(state) else b""


def _state_from(data: bytes) -> RecordDict:
    return recorddict_from_proto(ProtoRecordDict.FromString(data)) if data else RecordDict()


def _exit_with(server: int, every: float = 1.0) -> None:
    """Exit this worker at once when the ``server`` process is gone: killed, it sends no stop, and it
    may have died half-way through writing a task, which would leave the worker blocked for ever
    reading the rest of it (the worker holds the pipe's write end too: no EOF). A normal exit would
    also wait for the reply queue's feeder thread, which no reader will drain. Everything a worker
    must keep (its nodes' ledgers) is committed to disk before a reply is sent.

    The server is watched itself, not this process's parent: a forked worker's parent is the
    forkserver, which outlives the server while any worker lives (each holds its liveness pipe). A
    pidfd (Linux) becomes readable when the process exits and cannot name a reused pid; elsewhere
    the pid is polled every ``every`` seconds."""
    try:
        watch = os.pidfd_open(server)
    except (AttributeError, OSError):  # no pidfd here, or the server is already gone (ESRCH)
        watch = None
    if watch is not None:
        select.select([watch], [], [])
    else:
        while _alive(server):
            time.sleep(every)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's (a reused pid)
        return True
    return True


__all__ = ["WorkerPoolGrid", "resolve_workers"]
