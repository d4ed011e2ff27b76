"""A run's directory is its own (server/run_dir.py): two runs started in the same second without
--out get two directories; two runs racing into one --out cannot both write there; a run that never
starts leaves no empty directory behind."""

from __future__ import annotations

import pytest

from common.config import RunConfig
from common.errors import FedloraError
from server import run_dir as rd
from tests.conftest import run_cli


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rd.time, "strftime", lambda fmt: "20261207-101500")
    cfg = RunConfig()
    first, second, third = (rd.default_run_dir(cfg) for _ in range(3))
    assert first.name.startswith("20261207-101500-") and second.name == f"{first.name}-2"
    assert third.name == f"{first.name}-3" and all(p.is_dir() for p in (first, second, third))


def test_of_two_runs_racing_into_one_directory_the_second_is_refused(tmp_path):
    path, cfg = tmp_path / "run", RunConfig()
    one, two = rd.RunDir(path, cfg), rd.RunDir(path, cfg)  # both checked before either writes
    one.create()
    written = (path / "config.json").read_text()
    with pytest.raises(
        FedloraError, match="already holds a run \\(one started there since this run began\\)"
    ):
        two.create()
    assert (path / "config.json").read_text() == written  # the first run's configuration stands


def test_a_run_that_never_starts_leaves_no_directory(tmp_path, monkeypatch, capsys):
    """The data fails its checks after the run claimed ``runs/<time>-...``: exit 2, one line, and the
    claimed directory is gone (``runs/`` itself stays, empty)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tickets.csv").write_text("ticket,category\nprinter broken,it\n")
    argv = ["simulate", "--preset", "small", "--dataset", "tickets.csv", "--rounds", "1"]
    assert run_cli(argv) == 2
    assert "tickets.csv" in capsys.readouterr().err
    assert (tmp_path / "runs").is_dir() and not any((tmp_path / "runs").iterdir())
