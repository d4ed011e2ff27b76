"""The durable ledger: SQLite WAL, charges committed before use, totals against independent
accountants, and refusal (never overwrite) of existing, corrupt or foreign files."""

import hashlib
import json
import math
import sqlite3

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from opacus.accountants.analysis.gdp import compute_eps_poisson

from common.errors import FedloraError
from common.privacy.accounting.accountants import Event
from common.privacy.accounting.ledger import Ledger
from tests.conftest import run_cli
from tests.harness import ledger_charge

DELTA = 1e-5


_charge = ledger_charge


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def ledger(tmp_path):
    led = Ledger.create(tmp_path / "ledger.sqlite", "client-level", "run r1", DELTA, target_epsilon=5.0)
    yield led
    led.close()


def test_wal_and_a_charge_is_durable_before_it_is_settled(ledger):
    assert ledger._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    ledger.charge(_charge(1))
    # a second, independent connection (another process after a crash) sees the committed charge
    other = sqlite3.connect(ledger.path)
    assert other.execute("SELECT round, status FROM charges").fetchall() == [(1, "charged")]
    other.close()
    ledger.settle("r1", 1, "applied", replied=2)
    assert ledger.rows()[0]["status"] == "applied" and ledger.rows()[0]["replied"] == 2


def test_running_totals_match_opacus_gdp_and_dp_accounting_pld(ledger):
    plan = [(1.2, 0.5), (0.9, 0.3), (2.0, 1.0)]
    for rnd, (sigma, p) in enumerate(plan, 1):
        ledger.charge(_charge(rnd, sigma, p))
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    mu2 = 0.0
    for row, (sigma, p) in zip(ledger.rows(), plan, strict=True):
        mu2 += p * p * math.expm1(sigma**-2)
        pld.compose(
            dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(sigma))
            if p < 1
            else dp_event.GaussianDpEvent(sigma)
        )
        assert row["mu"] == pytest.approx(math.sqrt(mu2), rel=1e-9)
        assert row["eps_tight"] == pytest.approx(pld.get_epsilon(DELTA), rel=1e-6)
    # homogeneous history: the row's eps_gdp is Opacus's compute_eps_poisson
    led2 = Ledger.create(ledger.path.with_name("h.sqlite"), "client-level", "x", DELTA)
    for rnd in range(1, 4):
        led2.charge(_charge(rnd, 1.1, 0.2))
    assert led2.rows()[-1]["eps_gdp"] == pytest.approx(
        compute_eps_poisson(steps=3, noise_multiplier=1.1, sample_rate=0.2, delta=DELTA), rel=1e-6
    )


def test_a_round_is_never_charged_twice(ledger):
    ledger.charge(_charge(1))
    with pytest.raises(FedloraError, match="already charged"):
        ledger.charge(_charge(1, sigma=5.0))
    assert len(ledger.rows()) == 1


def test_uncovered_releases_are_recorded_once_and_reported(ledger):
    ledger.note_uncovered("r1", 0, "statistics in the clear")
    ledger.note_uncovered("r1", 0, "statistics in the clear")  # a resumed run notes it again: kept once
    ledger.charge(_charge(1))
    report = ledger.report()
    assert report["uncovered"] == [{"run": "r1", "round": 0, "what": "statistics in the clear"}]
    assert report["rounds"][0]["guarantee"].startswith("add/remove one client")  # central noise
    assert ledger.spent() == {k: report[k] for k in ("mu", "eps_gdp", "eps_tight")}  # no charge


def test_a_ledger_without_the_uncovered_table_still_opens_and_reports(ledger):
    """Ledgers written before the table existed (node ledgers outlive upgrades)."""
    ledger.charge(_charge(1))
    with sqlite3.connect(ledger.path) as conn:
        conn.execute("DROP TABLE uncovered")
    reopened = Ledger.open(ledger.path, "client-level")
    assert reopened.report()["uncovered"] == [] and len(reopened.rows()) == 1
    reopened.note_uncovered("r1", 0, "x")
    assert [u["what"] for u in reopened.uncovered()] == ["x"]


def test_a_charge_composes_every_event_its_mechanism_names(ledger):
    """Two events in one round (e.g. a correlated-noise or secure-aggregation round) are both
    charged, survive a reopen, and give the totals of a ledger that charged them as two rounds."""
    two = (Event(1.2, 0.5), Event(0.9, 0.3, 2))
    totals = ledger.charge(_charge(1, 1.2, 0.5, events=two))
    ledger.charge(_charge(2, 2.0, 1.0))  # no events: its headline event alone
    reopened = Ledger.open(ledger.path, "client-level")
    assert reopened.events() == [*two, Event(2.0, 1.0)]
    flat = Ledger.create(ledger.path.with_name("flat.sqlite"), "client-level", "x", DELTA)
    for rnd, (sigma, p, count) in enumerate([(1.2, 0.5, 1), (0.9, 0.3, 2)], 1):
        flat.charge(_charge(rnd, sigma, p, count=count))
    assert totals == flat.spent() and reopened.rows()[0]["eps_tight"] == flat.rows()[-1]["eps_tight"]
    assert (
        totals["eps_tight"]
        > Ledger.create(ledger.path.with_name("one.sqlite"), "client-level", "y", DELTA).charge(
            _charge(1, 1.2, 0.5)
        )["eps_tight"]
    )


def test_a_ledger_without_the_events_table_reads_each_charge_as_its_headline_event(ledger):
    ledger.charge(_charge(1, events=(Event(1.2, 0.5),)))
    ledger.charge(_charge(2, 0.9, 0.3))
    with sqlite3.connect(ledger.path) as conn:
        conn.execute("DROP TABLE events")
    reopened = Ledger.open(ledger.path, "client-level")
    assert reopened.events() == [Event(1.2, 0.5), Event(0.9, 0.3)]
    reopened.charge(_charge(3, events=(Event(1.1, 0.2),)))  # the table comes back on demand
    assert reopened.events()[-1] == Event(1.1, 0.2)


def test_spent_with_a_hypothetical_event_does_not_write(ledger):
    ledger.charge(_charge(1))
    projected = ledger.spent(_charge(2).event)
    assert projected["eps_gdp"] > ledger.rows()[-1]["eps_gdp"] and len(ledger.rows()) == 1


def test_create_never_overwrites(ledger):
    ledger.charge(_charge(1))
    digest = _digest(ledger.path)
    with pytest.raises(FedloraError, match="never overwritten"):
        Ledger.create(ledger.path, "client-level", "run r1", DELTA)
    assert _digest(ledger.path) == digest


@pytest.mark.parametrize(
    ("writer", "message"),
    [
        (lambda p: p.write_bytes(b"not a database at all" * 100), "not a readable fedlora ledger"),
        (lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\xff" * 2000), "not a readable fedlora ledger"),
        (
            lambda p: sqlite3.connect(p).execute("CREATE TABLE other (x)").connection.commit(),
            "not a readable",
        ),
    ],
    ids=["garbage", "corrupt-sqlite", "foreign-sqlite"],
)
def test_corrupt_or_foreign_files_are_refused_untouched(tmp_path, writer, message):
    path = tmp_path / "ledger.sqlite"
    writer(path)
    digest = _digest(path)
    with pytest.raises(FedloraError, match=message):
        Ledger.open(path, "client-level")
    assert _digest(path) == digest
    assert run_cli(["privacy", "ledger", str(path)]) == 2
    assert _digest(path) == digest


def test_other_unit_or_owner_is_refused(ledger):
    ledger.charge(_charge(1))
    with pytest.raises(FedloraError, match="client-level ledger, expected sample-level"):
        Ledger.open(ledger.path, "sample-level")
    with pytest.raises(FedloraError, match="belongs to 'run r1'"):
        Ledger.open(ledger.path, "client-level", owner="run other")
    assert len(Ledger.open(ledger.path, "client-level", owner="run r1").rows()) == 1


def test_ledger_cli_json_and_report(ledger, tmp_path, capsys):
    for rnd in (1, 2):
        ledger.charge(_charge(rnd))
        ledger.settle("r1", rnd, "applied", replied=3)
    assert (
        run_cli(["privacy", "ledger", str(ledger.path), "--json", "--report-dir", str(tmp_path / "rep")]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["unit"] == "client-level" and [r["round"] for r in report["rounds"]] == [1, 2]
    assert report["epsilon"] == max(report["eps_gdp"], report["eps_tight"])
    assert json.loads((tmp_path / "rep" / "privacy.json").read_text())["rounds"] == report["rounds"]
    assert (tmp_path / "rep" / "privacy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ledger_cli_states_the_guarantee_and_what_it_does_not_cover(ledger, capsys):
    ledger.note_uncovered("r1", 0, "statistics sent in the clear")
    ledger.charge(_charge(1))
    assert run_cli(["privacy", "ledger", str(ledger.path)]) == 0
    out = capsys.readouterr().out
    assert "guarantee: add/remove one client; against everyone but the server" in out
    assert "NOT covered by this epsilon: run r1 round 0: statistics sent in the clear" in out


def test_a_secure_aggregation_round_charges_skellam_events_accounted_by_rdp(ledger, capsys):
    """Skellam events (secure aggregation's distributed discrete noise) are stored with their
    sensitivities, survive a reopen, and make RDP the ledger's tight accountant: its ε_tight is the
    RDP accountant's over the same history, Gaussian rounds included, and the report says so."""
    from common.privacy.accounting.accountants import RdpAccountant, SkellamEvent

    skellam = SkellamEvent(0.9, 1.0, 1, 1.0e6, 1000.0)
    ledger.charge(_charge(1, 1.2, 0.5))
    totals = ledger.charge(_charge(2, 0.9, 1.0, events=(skellam,)))
    reopened = Ledger.open(ledger.path, "client-level")
    assert reopened.events() == [Event(1.2, 0.5), skellam]
    rdp = RdpAccountant()
    for e in (Event(1.2, 0.5), skellam):
        rdp.compose(e)
    assert totals["eps_tight"] == pytest.approx(rdp.epsilon(DELTA))
    assert reopened.report()["accountants"]["tight"].startswith("RDP (Skellam")
    assert Ledger.open(ledger.path.with_name("ledger.sqlite"), "client-level").spent() == totals
    plain = Ledger.create(ledger.path.with_name("plain.sqlite"), "client-level", "x", DELTA)
    plain.charge(_charge(1))
    assert plain.report()["accountants"]["tight"] == "PLD (pessimistic)"
    reopened.close()
    ledger.close()
    assert run_cli(["privacy", "ledger", str(ledger.path)]) == 0  # the one-line summary names RDP first
    out = capsys.readouterr().out
    assert f"epsilon {totals['eps_tight']:.4g} (rdp;" in out and "is no bound here" in out


def test_an_events_table_of_an_older_file_gains_the_sensitivity_columns(ledger):
    ledger.charge(_charge(1, events=(Event(1.2, 0.5),)))
    with sqlite3.connect(ledger.path) as conn:  # the events table as the first files had it
        conn.execute("ALTER TABLE events DROP COLUMN l1")
        conn.execute("ALTER TABLE events DROP COLUMN l2")
    reopened = Ledger.open(ledger.path, "client-level")
    assert reopened.events() == [Event(1.2, 0.5)]
    from common.privacy.accounting.accountants import SkellamEvent

    skellam = SkellamEvent(0.9, 1.0, 1, 1.0e6, 1000.0)
    reopened.charge(_charge(2, 0.9, 1.0, events=(skellam,)))
    assert reopened.events() == [Event(1.2, 0.5), skellam]


def _rdp_epsilon(*events):
    from common.privacy.accounting.accountants import RdpAccountant

    acc = RdpAccountant()
    for e in events:
        acc.compose(e)
    return acc.epsilon(DELTA)


def test_charges_that_name_their_participants_compose_per_client(ledger):
    """Secure aggregation charges each round to the clients in it (p = 1): every client composes only
    its own rounds, and the totals are the worst client's, checked against the RDP accountant run
    on each client's history by hand."""
    from common.privacy.accounting.accountants import SkellamEvent

    strong, weak = SkellamEvent(2.0, 1.0, 1, 1.0e6, 1000.0), SkellamEvent(1.5, 1.0, 1, 1.0e6, 1000.0)
    secure = dict(threat_model="secure-aggregation", p=1.0)
    big = 2**64 - 5  # Flower node ids are unsigned 64-bit
    ledger.charge(_charge(1, 2.0, events=(strong,), participants=(1, 2, 3, big), **secure))
    ledger.charge(_charge(2, 1.5, events=(weak,), participants=(2, 4), **secure))
    ledger.charge(_charge(3, 2.0, events=(strong,), participants=(3,), **secure))
    assert ledger.participations() == {1: 1, 2: 2, 3: 2, 4: 1, big: 1}
    worst = max(_rdp_epsilon(strong, weak), _rdp_epsilon(strong, strong))  # node 2 or node 3
    assert ledger.spent()["eps_tight"] == pytest.approx(worst)
    assert ledger.rows()[-1]["eps_tight"] == pytest.approx(worst)
    # a hypothetical round for node 4 alone: its history (weak) plus it; the others' unchanged
    assert ledger.spent(strong, nodes=(4,))["eps_tight"] == pytest.approx(worst)
    assert ledger.spent(weak, weak, nodes=(4,))["eps_tight"] == pytest.approx(_rdp_epsilon(weak, weak, weak))
    # all-client charges (no participants) count for everyone
    everyone = SkellamEvent(3.0, 1.0, 1, 1.0e6, 1000.0)
    ledger.charge(_charge(4, 3.0, events=(everyone,), **secure))
    assert ledger.spent()["eps_tight"] == pytest.approx(
        max(_rdp_epsilon(strong, weak, everyone), _rdp_epsilon(strong, strong, everyone))
    )


def test_a_charged_round_narrows_to_its_survivors_before_it_is_used(ledger):
    """The charge committed before a secure round (every sampled client, the fewest survivors'
    noise) narrows to the clients whose inputs were summed and the noise their shares carry; a
    settled round, or one that is not the last charge, is never changed."""
    from common.privacy.accounting.accountants import SkellamEvent

    planned, realised = SkellamEvent(1.5, 1.0, 1, 1.0e6, 1000.0), SkellamEvent(1.8, 1.0, 1, 1.0e6, 1000.0)
    secure = dict(threat_model="secure-aggregation", p=1.0)
    ledger.charge(_charge(1, 1.5, events=(planned,), participants=(1, 2, 3), **secure))
    totals = ledger.narrow("r1", 1, (realised,), (1, 2))
    assert ledger.participations() == {1: 1, 2: 1}
    assert ledger.events() == [realised]
    assert totals["eps_tight"] == pytest.approx(_rdp_epsilon(realised))
    row = ledger.row("r1", 1)
    assert (row["sigma"], row["eps_tight"], row["status"]) == (1.8, totals["eps_tight"], "charged")
    ledger.settle("r1", 1, "applied")
    with pytest.raises(FedloraError, match="settled or not the last charge"):
        ledger.narrow("r1", 1, (planned,), (1,))
