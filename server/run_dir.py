"""A run's directory: config, per-round metrics (JSONL), checkpoint, ledger, final PEFT adapter,
summary; where a new run goes and how a run's configuration is identified."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from common.atomic import write_text
from common.config import RunConfig
from common.errors import FedloraError
from common.models import AdapterState, ModelBundle, load_adapter_state
from common.models.portable import save_adapter
from common.privacy.accounting.ledger import Ledger
from common.provenance import made
from server.checkpoint import CHECKPOINT_FILE
from server.curves import Board, check_tensorboard, draw_curves

NODE_LEDGER = "sample-ledger.sqlite"  # client/node/state.py (the server does not import the client)


#: options that do not change what a run computes: where it is stored, whether it resumes, how many
#: processes train its clients (server/workers.py) and how (the engine, whether idle nodes of hidden
#: participation train: the same distribution of replies), whether TensorBoard gets its metrics too,
#: and whether an evaluation may be read from server/eval_cache.py (the same evaluation, computed before)
NOT_IDENTITY = (
    "out_dir",
    "resume",
    "workers",
    "engine",
    "idle_training",
    "cohort_tokens",
    "tensorboard",
    "eval_cache",
)


def _node_index(ledger_path: Path) -> int:
    return int(ledger_path.parent.name.removeprefix("node-"))


def default_run_dir(cfg: RunConfig) -> Path:
    """``runs/<time>-<model>-<dataset>``, created empty for this run alone: a run started in the same
    second gets ``-2``, ``-3``, ... (:func:`release_empty` removes it when the run never starts)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{stamp}-{cfg.model.replace('/', '_')}-{Path(cfg.dataset).name}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for k in range(1, 1000):
        path = base if k == 1 else base.with_name(f"{base.name}-{k}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FedloraError(f"no free run directory beside {base}; pass --out")


def release_empty(path: Path) -> None:
    """Remove the run directory ``path`` if nothing was written into it (a run that never started)."""
    with contextlib.suppress(OSError):
        path.rmdir()  # only an empty directory


def fingerprint(cfg: RunConfig | dict) -> str:
    """Identity of a run's configuration (where it is stored and whether it resumes do not count);
    a dict is a stored ``config.json`` (a run started by an earlier version keeps its identity)."""
    values = cfg if isinstance(cfg, dict) else asdict(cfg)
    values = {k: v for k, v in values.items() if k not in NOT_IDENTITY}
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


class RunDir:
    """Files of one run. A new run never writes into a directory that already holds a run; a
    resumed one only into a directory whose stored configuration is the same. The constructor only
    checks; :meth:`create` writes the configuration (call it once the model and data are known good)."""

    def __init__(self, path: Path, cfg: RunConfig) -> None:
        self.path, self.cfg = path, cfg
        if cfg.tensorboard and (why := check_tensorboard()):
            raise FedloraError(why)
        self._board: Board | None = None
        self.run_id = fingerprint(cfg)  # a resumed run: its stored configuration's, below
        self.metrics_path = path / "metrics.jsonl"
        self.ledger_path = path / "ledger.sqlite"
        self.checkpoint_path = path / CHECKPOINT_FILE
        stored = path / "config.json"
        if path.exists() and not path.is_dir():
            raise FedloraError(f"--out {path} is a file, not a run directory; choose another --out")
        if not cfg.resume:
            if stored.exists() or self.ledger_path.exists():
                raise FedloraError(
                    f"run directory {path} already holds a run; choose another --out (out-dir)"
                )
            return
        if not stored.is_file():
            raise FedloraError(f"nothing to resume: {path} holds no run")
        try:
            old = json.loads(stored.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise FedloraError(f"{stored} is unreadable ({exc})") from None
        new = asdict(cfg)
        # an option missing from the stored configuration did not exist when the run started: the
        # run had its default (every option added later defaults to the earlier behaviour)
        defaults = asdict(RunConfig())
        changed = sorted(k for k in new if k not in NOT_IDENTITY and old.get(k, defaults[k]) != new[k])
        if changed:
            raise FedloraError(f"cannot resume {path}: configuration differs in {', '.join(changed)}")
        self.run_id = fingerprint(old)

    def create(self) -> None:
        """Write the configuration of a new run (a resumed run keeps its own). Of two runs started
        into the same directory, the second to get here is refused: its configuration is claimed
        exclusively."""
        if not self.cfg.resume:
            self.path.mkdir(parents=True, exist_ok=True)
            try:
                write_json(self.path / "config.json", asdict(self.cfg), exclusive=True)
            except FileExistsError:
                raise FedloraError(
                    f"run directory {self.path} already holds a run (one started there since this run "
                    "began); choose another --out (out-dir)"
                ) from None

    def log(self, record: dict) -> None:
        """Append one JSON line and fsync it (a crash loses at most the line being written); with
        ``--tensorboard`` its numbers go to ``tensorboard/`` too (server/curves.py)."""
        with open(self.metrics_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if self.cfg.tensorboard:
            self._board = self._board or Board(self.path / "tensorboard")
            self._board.log(record)

    def draw_curves(self, metric: str, target_epsilon: float) -> Path:
        """``curves.png``: the held-out ``metric``, the train loss and ε by round, from every metrics
        line (a resumed run's included); closes the TensorBoard writer, if any (the run is over)."""
        if self._board is not None:
            self._board.close()
            self._board = None
        nodes = {node: series for node, series in self.node_epsilons()}
        return draw_curves(
            self.metrics_path,
            self.path / "curves.png",
            metric,
            target_epsilon,
            nodes,
            self.cfg.sample_epsilon,
        )

    def records(self) -> list[dict]:
        """The metrics lines written so far (a torn last line from a crash is skipped)."""
        if not self.metrics_path.exists():
            return []
        lines = []
        for text in self.metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                line = json.loads(text)
            except ValueError:
                continue
            if isinstance(line, dict):
                lines.append(line)
        return lines

    def logged_rounds(self) -> set[int]:
        """Rounds that already have a metrics line (a torn last line from a crash is ignored)."""
        rounds = set()
        for line in self.records():
            try:
                rounds.add(int(line["round"]))
            except (ValueError, KeyError, TypeError):
                continue
        return rounds

    @property
    def adapter_path(self) -> Path:
        return self.path / "adapter"

    def save_adapter(
        self,
        bundle: ModelBundle,
        state: AdapterState,
        pooling: str,
        card: str,
        label_names: Sequence[str] = (),
    ) -> Path:
        """A portable PEFT adapter with its model card and the dataset's class names
        (common/models/portable.py), published atomically."""
        load_adapter_state(bundle.model, state)
        final, tmp = self.adapter_path, self.path / ".adapter.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        save_adapter(bundle, tmp, pooling, card, label_names)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        return final

    def node_epsilons(self) -> list[tuple[int, tuple[list[int], list[float]]]]:
        """Each simulated node's sample-level ε after each of its charged rounds (its ledger's running
        tight ε; a round charged again, after an interruption, at its last charge)."""
        out = []
        for path in self._node_ledgers():
            ledger = Ledger.open(path, "sample-level")
            try:
                by_round = {int(r["round"]): float(r["eps_tight"]) for r in ledger.rows()}
            finally:
                ledger.close()
            rounds = sorted(by_round)
            out.append((_node_index(path), (rounds, [by_round[r] for r in rounds])))
        return out

    def _node_ledgers(self) -> list[Path]:
        return sorted((self.path / "nodes").glob("node-*/" + NODE_LEDGER), key=_node_index)

    def node_privacy(self) -> list[dict]:
        """Each simulated node's sample-level ledger totals (``nodes/node-k``, where ``fedlora simulate``
        keeps node state; a deployment's nodes keep theirs on their own machines: empty here)."""
        rows = []
        for path in self._node_ledgers():
            ledger = Ledger.open(path, "sample-level")
            try:
                totals = ledger.report()
            finally:
                ledger.close()
            node = _node_index(path)
            keys = ("eps_tight", "eps_gdp", "mu", "delta")
            rows.append({"node": node, **{k: float(totals[k]) for k in keys}, "ledger": str(path)})
        return rows

    def write_summary(self, summary: dict) -> None:
        """``summary.json``: ``summary`` and when, at which commit and where the run was made."""
        self._write_json("summary.json", {**summary, "made": made()})

    def _write_json(self, name: str, obj: dict) -> None:
        write_json(self.path / name, obj)


def write_json(path: Path, obj: dict, exclusive: bool = False) -> None:
    """``obj`` as indented JSON at ``path``, atomically (a crash leaves the old file or the new one;
    ``exclusive``: FileExistsError when ``path`` exists)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n", exclusive=exclusive)
