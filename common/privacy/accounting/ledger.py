"""Durable privacy ledger: one SQLite (WAL) row per charged round, committed before the round's
result is used or released.

A ledger file has one unit: ``client-level`` (the server's, one row per federated round; neighbours
differ by one client) or ``sample-level`` (a node's, one row per local round of DP-optimizer steps;
neighbours differ by one example). Each row is a charge of ``count`` Gaussian mechanisms with noise
multiplier σ at Poisson rate p, plus what the round did (sampled, replied, clip C, threat model,
mechanism) and the running μ (CLT GDP), ε_gdp and ε_tight (PLD) at the ledger's δ after that row.

A charge stores the accounting events its mechanism names (common/privacy/mechanisms/mechanism.py
``Mechanism.events``) in the ``events`` table, one row each (kind, σ, p, count), and the totals
compose every charge's events: a mechanism may charge several events per round (correlated noise,
a secure-aggregation round). The charge's own σ, p and count are its headline event, the one its
report shows; a charge with no ``events`` rows (every ledger written before the table existed) is
that one event. ``kind`` names the mechanism an event is of (common/privacy/accounting/accountants.py):
``gaussian``, or ``skellam`` (secure aggregation's distributed discrete noise, its σ the Gaussian
equivalent, with its sensitivities in ``l1`` / ``l2``). A history of Gaussian events has the PLD as
its tight accountant; one with a Skellam event has RDP (Agarwal et al.'s bound), and the report
names which.

Releases of client data that no row covers (statistics sent in the clear) are recorded in the
``uncovered`` table, so that every report of the ledger says what its ε does not cover.

The file is never overwritten: :meth:`Ledger.create` refuses an existing path and :meth:`Ledger.open`
refuses a file that is not a ledger, has another unit, or belongs to another owner (run or node).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from common.config import THREAT_MODELS
from common.errors import FedloraError
from common.privacy.accounting.accountants import (
    Accountant,
    Event,
    GdpAccountant,
    PldAccountant,
    RdpAccountant,
    event_from,
)
from common.privacy.participation.threat import CLIENT_LEVEL, SAMPLE_LEVEL, Guarantee, what_if_label

SCHEMA = "fedlora-ledger/1"
UNITS = ("client-level", "sample-level")
#: status of a row: ``charged`` (committed, result not yet used), then ``applied`` (its result was
#: used), ``interrupted`` (the process died before using it; the charge stands) or ``withheld``.
STATUSES = ("charged", "applied", "interrupted", "withheld")

_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE charges (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    sigma REAL NOT NULL,
    p REAL NOT NULL,
    count INTEGER NOT NULL,
    sample_rate REAL NOT NULL,
    sampled INTEGER NOT NULL,
    replied INTEGER,
    clip REAL NOT NULL,
    threat_model TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    status TEXT NOT NULL,
    mu REAL NOT NULL,
    eps_gdp REAL NOT NULL,
    eps_tight REAL NOT NULL,
    time REAL NOT NULL,
    UNIQUE (run, round)
);
"""
# Added after the first ledgers were written: created on demand, absent from older files.
_EVENTS = """
CREATE TABLE IF NOT EXISTS events (
    charge INTEGER NOT NULL REFERENCES charges (seq),
    kind TEXT NOT NULL,
    sigma REAL NOT NULL,
    p REAL NOT NULL,
    count INTEGER NOT NULL,
    l1 REAL,
    l2 REAL
);
"""
_EVENT_COLUMNS = ("l1", "l2")  # added after the events table: absent from older files
#: the tight accountant of a history and its label, by whether every event has a PLD
TIGHT: dict[bool, tuple[type[Accountant], str]] = {
    True: (PldAccountant, "PLD (pessimistic)"),
    False: (RdpAccountant, "RDP (Skellam: Agarwal et al. 2021; sampling: Steinke 2022)"),
}


def tight_accountant(events: list[Event]) -> tuple[type[Accountant], str]:
    """The tight accountant of ``events`` and its label (:data:`TIGHT`)."""
    return TIGHT[all(e.has_pld for e in events)]


# Secure aggregation: the nodes a round's events apply to (a charge without rows applies to every
# client). Per-client composition: the totals are the worst client's (docs/secure-aggregation.md).
_PARTICIPANTS = """
CREATE TABLE IF NOT EXISTS participants (
    charge INTEGER NOT NULL REFERENCES charges (seq),
    node TEXT NOT NULL  -- Flower's node ids are unsigned 64-bit: beyond SQLite's INTEGER
);
"""

_UNCOVERED = """
CREATE TABLE IF NOT EXISTS uncovered (
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    what TEXT NOT NULL,
    time REAL NOT NULL,
    UNIQUE (run, round, what)
);
"""


@dataclass(frozen=True)
class Charge:
    """What one round spends. ``sigma`` is the noise multiplier of the released quantity (noise std
    / clip) under ``threat_model``; ``p`` the Poisson rate the accountant may use (1 where sampling
    gives no amplification, e.g. local noise seen by the server); ``sample_rate`` the configured one."""

    run: str
    round: int
    sigma: float
    p: float
    count: int
    sample_rate: float
    sampled: int
    clip: float
    threat_model: str
    mechanism: str
    events: tuple[Event, ...] = ()  # what the mechanism charges (empty: the headline event alone)
    participants: tuple[int, ...] = ()  # the only clients charged (empty: every client, at rate p)

    def __post_init__(self) -> None:
        Event(self.sigma, self.p, self.count)  # validates σ, p and count
        if self.threat_model not in THREAT_MODELS:
            raise ValueError(f"threat model must be one of {', '.join(THREAT_MODELS)}")
        if not self.clip > 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")

    @property
    def event(self) -> Event:
        """The headline event: the σ, p and count a report shows."""
        return Event(self.sigma, self.p, self.count)

    @property
    def charged(self) -> tuple[Event, ...]:
        """Every event this charge composes into the ledger's totals."""
        return self.events or (self.event,)


class Ledger:
    """An open ledger file. Use :meth:`create` or :meth:`open`; every write is one transaction."""

    def __init__(self, path: Path, conn: sqlite3.Connection, meta: dict[str, str]) -> None:
        self.path, self._conn = path, conn
        self.unit, self.owner = meta["unit"], meta["owner"]
        self.delta = float(meta["delta"])
        self.validity = meta.get("validity", "")  # a what-if ledger: where its ε holds
        self.population = meta.get("population", "")  # ... and for whom, in a few words

    @classmethod
    def create(
        cls,
        path: Path,
        unit: str,
        owner: str,
        delta: float,
        target_epsilon: float = 0.0,
        what_if: tuple[str, str] = ("", ""),
        *,
        sync: str = "full",
    ) -> Ledger:
        """A new ledger at ``path``; refuses a path that exists (nothing is ever overwritten).
        ``what_if``: (validity, population) of a what-if noise cohort, where the charges hold when
        not for the run itself and that population in a few words, for one-line outputs; ``sync``:
        the level its commits are made at (:data:`SYNC_LEVELS`), its creation included."""
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}")
        if not 0 < delta < 1:
            raise FedloraError(f"delta must be in (0, 1), got {delta}")
        validity, population = what_if
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            open(path, "xb").close()  # exclusive create: fails if anything is there
        except FileExistsError:
            raise FedloraError(f"ledger {path} already exists; it is never overwritten") from None
        conn = connect(path, sync)
        meta = {
            "schema": SCHEMA,
            "unit": unit,
            "owner": owner,
            "delta": repr(delta),
            "target_epsilon": repr(target_epsilon),  # 0 = no budget
            "created": repr(time.time()),
            **({"validity": validity, "population": population} if validity else {}),
        }
        with conn:
            conn.executescript(_TABLES + _UNCOVERED + _EVENTS)
            conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        return cls(path, conn, meta)

    @classmethod
    def open(
        cls, path: Path, unit: str | None = None, owner: str | None = None, *, sync: str = "full"
    ) -> Ledger:
        """An existing ledger (of ``unit`` and ``owner``, when given), committing at ``sync``
        (:data:`SYNC_LEVELS`); a clear error otherwise."""
        if not path.is_file():
            raise FedloraError(f"no ledger at {path}")
        try:  # validate read-only first: a foreign database must not even get a WAL switch
            with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as ro:
                if ro.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                    raise sqlite3.DatabaseError("integrity check failed")
                meta = dict(ro.execute("SELECT key, value FROM meta").fetchall())
                ro.execute("SELECT seq, run, round, sigma, p, count, status, mu FROM charges LIMIT 1")
            ro.close()
        except sqlite3.DatabaseError as exc:
            raise FedloraError(f"{path} is not a readable fedlora ledger ({exc})") from None
        if meta.get("schema") != SCHEMA:
            raise FedloraError(f"{path}: ledger schema {meta.get('schema')!r}, expected {SCHEMA!r}")
        if meta.get("unit") not in UNITS or (unit is not None and meta.get("unit") != unit):
            raise FedloraError(f"{path} is a {meta.get('unit')} ledger, expected {unit}")
        if owner is not None and meta.get("owner") != owner:
            raise FedloraError(f"{path} belongs to {meta.get('owner')!r}, not to {owner!r}")
        return cls(path, connect(path, sync), meta)

    def close(self) -> None:
        self._conn.close()

    # --- reading -----------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        return self._select("")

    def row(self, run: str, rnd: int) -> dict | None:
        found = self._select("WHERE run = ? AND round = ?", run, rnd)
        return found[0] if found else None

    def uncovered(self) -> list[dict]:
        """Releases this ledger's ε does not cover: ``{"run", "round", "what"}``, oldest first."""
        if not self._has("uncovered"):
            return []
        cur = self._conn.execute("SELECT run, round, what FROM uncovered ORDER BY time, rowid")
        return [{"run": r, "round": n, "what": w} for r, n, w in cur.fetchall()]

    def events(self) -> list[Event]:
        """Every charged event, in order (a charge without ``events`` rows is its headline event)."""
        return [e for _, events in self._by_charge() for e in events]

    def participants(self) -> dict[int, frozenset[int]]:
        """charge seq -> the nodes it applies to, for the charges that name them (secure aggregation)."""
        if not self._has("participants"):
            return {}
        found: dict[int, set[int]] = {}
        for seq, node in self._conn.execute("SELECT charge, node FROM participants"):
            found.setdefault(seq, set()).add(int(node))
        return {seq: frozenset(nodes) for seq, nodes in found.items()}

    def participations(self) -> dict[int, int]:
        """node -> the charges that name it (how often it took part, as charged)."""
        counts: dict[int, int] = {}
        for nodes in self.participants().values():
            for node in nodes:
                counts[node] = counts.get(node, 0) + 1
        return counts

    def last_rounds(self) -> dict[int, int]:
        """node -> the last round whose charge names it (the min-separation rule's table: written in
        the charge's transaction, before the round's instructions go out)."""
        rounds = {r["seq"]: r["round"] for r in self.rows()}
        last: dict[int, int] = {}
        for seq, nodes in self.participants().items():
            for node in nodes:
                last[node] = max(last.get(node, 0), rounds[seq])
        return last

    def _by_charge(self) -> list[tuple[int, list[Event]]]:
        """(charge seq, its events) in order."""
        stored: dict[int, list[Event]] = {}
        if self._has("events"):
            extra = "".join(f", {c}" for c in _EVENT_COLUMNS if c in self._event_columns())
            cur = self._conn.execute(
                f"SELECT charge, kind, sigma, p, count{extra} FROM events ORDER BY rowid"
            )
            for seq, _kind, *fields in cur.fetchall():
                stored.setdefault(seq, []).append(event_from(fields))
        return [(r["seq"], stored.get(r["seq"], [_event(r)])) for r in self.rows()]

    def _event_columns(self) -> set[str]:
        return {row[1] for row in self._conn.execute("PRAGMA table_info(events)")}

    def _has(self, table: str) -> bool:
        return (
            self._conn.execute("SELECT name FROM sqlite_master WHERE name = ?", (table,)).fetchone()
            is not None
        )

    def _select(self, where: str, *params: object) -> list[dict]:
        cur = self._conn.execute(f"SELECT * FROM charges {where} ORDER BY seq", params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def spent(self, *extra: Event, nodes: tuple[int, ...] = ()) -> dict[str, float]:
        """``mu``, ``eps_gdp`` and ``eps_tight`` at the ledger's δ, after the ``extra`` events (none:
        as is) charged to ``nodes`` (empty: to every client). Once a charge names its participants
        (secure aggregation), each client composes only the charges it took part in and each total
        is the largest over the clients: a bound for every one of them."""
        named = self.participants()
        if not named and not nodes:
            return _totals(self.events() + list(extra), self.delta)
        everyone: list[Event] = []
        own: dict[int, list[Event]] = {node: [] for node in nodes}
        chosen = set(nodes)
        for seq, events in self._by_charge():
            for node in named.get(seq, ()):
                own.setdefault(node, []).extend(events)
            if seq not in named:
                everyone.extend(events)
        worst = dict.fromkeys(("mu", "eps_gdp", "eps_tight"), 0.0)
        histories = {  # clients with the same history (every client, under hidden participation) share it
            tuple(everyone + events + (list(extra) if not chosen or node in chosen else []))
            for node, events in own.items()
        }
        for history in histories:
            totals = _totals(list(history), self.delta)
            worst = {k: max(v, totals[k]) for k, v in worst.items()}
        return worst

    # --- writing -----------------------------------------------------------------------------
    def charge(self, charge: Charge) -> dict[str, float]:
        """Commit ``charge`` (status ``charged``) and return the running totals it leads to."""
        totals = self.spent(*charge.charged, nodes=charge.participants)
        values = {**asdict(charge), "replied": None, "status": "charged", **totals, "time": time.time()}
        del values["events"], values["participants"]
        try:
            with self._conn:
                cur = self._conn.execute(
                    f"INSERT INTO charges ({', '.join(values)}) VALUES ({', '.join('?' * len(values))})",
                    list(values.values()),
                )
                # one transaction: the charge, its events and participants, or none of them
                self._write_events(cur.lastrowid, charge.events, charge.participants)
        except sqlite3.IntegrityError:
            raise FedloraError(f"round {charge.round} of run {charge.run} is already charged") from None
        return totals

    def _write_events(self, seq: int, events: tuple[Event, ...], participants: tuple[int, ...]) -> None:
        """Store charge ``seq``'s events and participants (inside the caller's transaction)."""
        if events:
            self._conn.execute(_EVENTS)
            for column in set(_EVENT_COLUMNS) - self._event_columns():  # an older file
                self._conn.execute(f"ALTER TABLE events ADD COLUMN {column} REAL")
            self._conn.executemany(
                "INSERT INTO events (charge, kind, sigma, p, count, l1, l2) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(seq, e.kind, *[*e.fields(), None, None][:5]) for e in events],
            )
        if participants:
            self._conn.execute(_PARTICIPANTS)
            self._conn.executemany(
                "INSERT INTO participants (charge, node) VALUES (?, ?)", [(seq, str(n)) for n in participants]
            )

    def narrow(self, run: str, rnd: int, events: tuple[Event, ...], participants: tuple[int, ...]) -> dict:
        """Replace a ``charged`` round's events and participants by what it turned out to release
        (secure aggregation: the survivors, and the noise their shares carry), before its result
        is used; the caller must only ever narrow (fewer nodes, each event no weaker). Returns the
        new running totals, stored in the row."""
        row = self._row_or_fail(run, rnd)
        if row["status"] != "charged" or row["seq"] != self.rows()[-1]["seq"]:
            raise FedloraError(f"round {rnd} of run {run} is settled or not the last charge: not narrowed")
        head = events[0]
        with self._conn:
            for table in ("events", "participants"):
                if self._has(table):
                    self._conn.execute(f"DELETE FROM {table} WHERE charge = ?", (row["seq"],))
            self._write_events(row["seq"], events, participants)
            totals = self.spent()
            self._conn.execute(
                "UPDATE charges SET sigma = ?, p = ?, count = ?, mu = ?, eps_gdp = ?, eps_tight = ? WHERE seq = ?",
                [
                    head.sigma,
                    head.p,
                    head.count,
                    totals["mu"],
                    totals["eps_gdp"],
                    totals["eps_tight"],
                    row["seq"],
                ],
            )
        return totals

    def note_uncovered(self, run: str, rnd: int, what: str) -> None:
        """Record (once) that round ``rnd`` of ``run`` releases ``what`` outside the guarantee;
        committed before the release, like a charge."""
        with self._conn:
            self._conn.execute(_UNCOVERED)
            self._conn.execute(
                "INSERT OR IGNORE INTO uncovered VALUES (?, ?, ?, ?)", (run, rnd, what, time.time())
            )

    def settle(self, run: str, rnd: int, status: str, replied: int | None = None) -> None:
        """Record how a charged round ended (its charge is unchanged)."""
        if status not in STATUSES[1:]:
            raise ValueError(f"status must be one of {', '.join(STATUSES[1:])}")
        self._update(self._row_or_fail(run, rnd), status=status, replied=replied)

    def _row_or_fail(self, run: str, rnd: int) -> dict:
        row = self.row(run, rnd)
        if row is None:
            raise FedloraError(f"round {rnd} of run {run} was never charged")
        return row

    def _update(self, row: dict, **values: object) -> None:
        values = {k: v for k, v in values.items() if v is not None}
        with self._conn:
            self._conn.execute(
                f"UPDATE charges SET {', '.join(f'{k} = ?' for k in values)} WHERE seq = ?",
                [*values.values(), row["seq"]],
            )

    def hold_to(self, accountants: tuple[str, ...]) -> None:
        """Record the accountants the run's budget holds to when they are not the default pair (gdp
        and pld): ``("pld",)`` for a plan whose releases are Gaussians at p = 1 (correlated noise
        under min-sep), where the CLT μ-GDP does not apply. Read by :meth:`report`."""
        if tuple(accountants) != ("gdp", "pld"):
            with self._conn:
                self._conn.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('budget', ?)", (",".join(accountants),)
                )

    def report(self) -> dict:
        """The ledger as one JSON-able dict: meta, rows and the current totals."""
        meta = dict(self._conn.execute("SELECT key, value FROM meta").fetchall())
        rows = [{**r, "guarantee": self.guarantee(r["threat_model"]).label()} for r in self.rows()]
        last = rows[-1] if rows else {"mu": 0.0, "eps_gdp": 0.0, "eps_tight": 0.0}
        events = self.events()
        tight, tight_label = tight_accountant(events)
        # with Skellam noise the CLT mu-GDP is no bound, and a run that holds to pld alone (meta
        # ``budget``) does not take it: the ε is then the tight one alone
        both = tight is PldAccountant and meta.get("budget", "gdp,pld") == "gdp,pld"
        epsilon = max(last["eps_gdp"], last["eps_tight"]) if both else last["eps_tight"]
        return {
            "ledger": str(self.path),
            **meta,
            "what_if": what_if_label(self.validity),  # "" for a run's own ε
            "accountants": {"gdp": "CLT mu-GDP (DR-Encoder paper)", "tight": tight_label},
            "tight_accountant": tight().name,  # "pld" or "rdp"
            "epsilon": epsilon,
            "mu": last["mu"],
            "eps_gdp": last["eps_gdp"],
            "eps_tight": last["eps_tight"],
            "guarantees": sorted({r["guarantee"] for r in rows}),
            # secure aggregation: the most charges any one client took part in (absent otherwise)
            **({"most_participations": max(taken.values())} if (taken := self.participations()) else {}),
            "uncovered": self.uncovered(),
            "rounds": rows,
        }

    def guarantee(self, threat_model: str) -> Guarantee:
        """What a row of this ledger's unit and ``threat_model`` guarantees."""
        return SAMPLE_LEVEL if self.unit == "sample-level" else CLIENT_LEVEL[threat_model]


def _event(row: dict) -> Event:
    return Event(row["sigma"], row["p"], row["count"])


def _replay(acc: Accountant, events: list[Event]) -> Accountant:
    for e in events:
        acc.compose(e)
    return acc


def _totals(events: list[Event], delta: float) -> dict[str, float]:
    """Running μ, ε_gdp and ε_tight of ``events`` at ``delta`` (ε_tight: the PLD, or RDP when an event
    has no PLD, :data:`TIGHT`). The accountants compose commutatively, so the history is keyed as a
    multiset: a node's ledger repeats its rows, and every node of a simulation has the same history
    at the same round."""
    merged: dict[Event, int] = {}
    for e in events:
        key = replace(e, count=1)
        merged[key] = merged.get(key, 0) + e.count
    return dict(_totals_of(tuple(merged.items()), delta))


@lru_cache(maxsize=256)
def _totals_of(history: tuple[tuple[Event, int], ...], delta: float) -> tuple:
    events = [replace(e, count=count) for e, count in history if count]
    gdp_acc = _replay(GdpAccountant(), events)
    tight = _replay(tight_accountant(events)[0](), events)
    return (("mu", gdp_acc.mu), ("eps_gdp", gdp_acc.epsilon(delta)), ("eps_tight", tight.epsilon(delta)))


#: how a ledger commits (SQLite's ``synchronous`` in WAL mode, https://sqlite.org/pragma.html#pragma_synchronous):
#: ``full`` (the default) syncs every commit to disk, so a committed charge survives power loss;
#: ``normal`` survives a crash of the process but not of the machine (no sync per commit)
SYNC_LEVELS = ("full", "normal")
#: the node-config key a node reads its ledgers' level from (client/node/state.py). The in-process
#: simulation sets ``normal`` for its nodes: one disk stands in for every node's own, and N nodes'
#: syncs would queue one after another on it
LEDGER_SYNC = "ledger-sync"


def check_sync(level: str) -> str:
    """``level`` if it is one of :data:`SYNC_LEVELS`, else a one-line error naming :data:`LEDGER_SYNC`."""
    if level not in SYNC_LEVELS:
        raise FedloraError(f"{LEDGER_SYNC} must be one of {', '.join(SYNC_LEVELS)}, got {level!r}")
    return level


def connect(path: Path, sync: str = "full") -> sqlite3.Connection:
    """A WAL connection committing at ``sync``: ``full`` (the default) makes a committed charge
    survive power loss, not only a crash of the process (the ledgers, and a node's signing record,
    client/node/signed.py)."""
    level = check_sync(sync).upper()
    conn = sqlite3.connect(path, timeout=30.0)  # `with conn:` = one transaction
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={level}")
    return conn


__all__ = [
    "LEDGER_SYNC",
    "SCHEMA",
    "STATUSES",
    "SYNC_LEVELS",
    "THREAT_MODELS",
    "UNITS",
    "Charge",
    "Ledger",
    "check_sync",
    "connect",
]
