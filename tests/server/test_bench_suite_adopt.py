"""``fedlora bench suite --adopt/--stored-only``: a run made by hand counts as a plan run only when it
computed the same thing, and a report from stored runs names every command it lacks; the generative
section's shares pair each private seed with the non-private run of the same seed."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from common.cli import main
from common.models.precision import resolve_precision
from server.bench.suite.adopt import adopt, differences, plan_config
from server.bench.suite.cli import Scope, suite
from server.bench.suite.plan import Arm, Run, profile, runs
from server.bench.suite.sections import cross_silo, generative, instruction


def _client_runs() -> list[Run]:
    return [r for r in runs(profile("tiny")) if r.section == "client-level"]


def _summary(accuracy: float) -> dict:
    return {
        "before": {"accuracy": 0.5, "loss": 0.7},
        "after": {"accuracy": accuracy, "loss": 0.6, "top_class_share": 0.6},
        "privacy": "none (no client-level release)",
        "bytes_up_per_round": 1e6,
        "wall_time_s": 12.5,
        "rounds_completed": 1,
    }


#: the stamp of a run made at an earlier commit (what ``summary.json`` carries since runs record it)
MADE = {"date": "2026-11-20", "commit": "ccccccc", "device": "cpu (2 cores, x86_64)"}


def _stored(tmp: Path, name: str, config: dict, accuracy: float = 0.61, made: dict | None = MADE) -> Path:
    """A finished run directory as ``fedlora simulate`` leaves it (config and summary; ``made``
    None: a run from before runs stamped their summary)."""
    d = tmp / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    (d / "summary.json").write_text(json.dumps({**_summary(accuracy), **({"made": made} if made else {})}))
    return d


def test_only_a_run_with_the_same_configuration_is_adopted(tmp_path):
    fedavg, dp = _client_runs()
    planned = plan_config(fedavg)
    assert plan_config(dp)["mechanism"] == "dp-fedavg" and planned["seed"] == 0
    same = _stored(tmp_path, "same", {**planned, "out_dir": "/elsewhere", "workers": 7})  # not identity
    other_lr = _stored(tmp_path, "lr", {**planned, "lr": planned["lr"] * 2})
    predates = _stored(tmp_path, "old", {k: v for k, v in planned.items() if k != "lora_dropout"})
    assert differences(planned, json.loads((other_lr / "config.json").read_text())) == ["lr"]
    assert "lora_dropout" in differences(planned, json.loads((predates / "config.json").read_text()))
    lines: list[str] = []
    took = adopt([fedavg, dp], [other_lr, predates, same], tmp_path / "runs", lines.append)
    assert took == [fedavg.key] and lines == [f"[suite] adopt {fedavg.key}: {same}"]
    record = json.loads((tmp_path / "runs" / fedavg.key / "command.json").read_text())
    assert record == {"command": fedavg.command, "wall_s": 12.5, "made": MADE, "adopted_from": str(same)}
    # a second adoption leaves a run that already has its output alone
    assert adopt([fedavg], [same], tmp_path / "runs", lines.append) == []


def test_an_adopted_run_keeps_the_date_and_commit_it_was_made_at(tmp_path):
    """Not the adopting invocation's: a run from before runs stamped their summary has its output's
    date, this machine, and its commit marked as not recorded."""
    import datetime
    import os

    from common.provenance import device

    fedavg, _ = _client_runs()
    old = _stored(tmp_path, "old", plan_config(fedavg), made=None)
    stamp = datetime.datetime(2026, 11, 3, 12, 0, tzinfo=datetime.UTC).timestamp()
    os.utime(old / "summary.json", (stamp, stamp))
    assert adopt([fedavg], [old], tmp_path / "runs", lambda _: None) == [fedavg.key]
    record = json.loads((tmp_path / "runs" / fedavg.key / "command.json").read_text())
    assert record["made"] == {"date": "2026-11-03", "commit": "not recorded", "device": device()}


def test_precision_auto_is_what_it_resolves_to_here(tmp_path):
    planned = plan_config(_client_runs()[0])
    assert planned["precision"] == "auto"
    here = resolve_precision("auto", "cpu")
    other = "fp32" if here == "bf16" else "bf16"
    assert not differences(planned, {**planned, "precision": here})
    assert differences(planned, {**planned, "precision": other}) == ["precision"]


def test_stored_only_runs_nothing_and_lists_what_is_missing(tmp_path):
    fedavg, dp = _client_runs()
    kept = _stored(tmp_path, "kept", plan_config(fedavg), accuracy=0.625)
    out = tmp_path / "out"
    results = suite("tiny", out, ["client-level"], lambda _: None, [kept], stored_only=True)
    meta = results["suite"]
    assert meta["runs"] == 1 and meta["adopted"] == [str(kept)] and meta["missing"] == [" ".join(dp.command)]
    (row,) = results["sections"][0]["rows"]
    assert row["arm"] == fedavg.arm.label and row["accuracy after (mean ± std)"] == "0.625 (n = 1)"
    md = (out / "RESULTS.md").read_text()
    assert "## Not run yet" in md and f"$ {' '.join(dp.command)}" in md and "--adopt" in md
    assert not (out / "runs" / dp.key).exists()  # nothing ran


def _lm(before: float, after: float, epsilon: float | None) -> dict:
    privacy = {"eps_tight": epsilon, "delta": "1e-05"} if epsilon else None
    return {
        "before": {"perplexity": math.exp(before), "loss": before},
        "after": {"perplexity": math.exp(after), "loss": after},
        "client_privacy": privacy,
        "privacy": f"client-level eps {epsilon}" if epsilon else "none",
        "wall_time_s": 600.0,
        "rounds_completed": 5,
    }


def test_generative_shares_pair_each_seed_with_its_own_non_private_run():
    plain, private = Arm("np"), Arm("dp ε=8", (), 8.0)
    done = [
        {"run": Run("generative", f"g-{arm.label}-{seed}", (), arm=arm, seed=seed), "output": out}
        for arm, seed, out in (
            (plain, 0, _lm(4.4, 4.2, None)),  # drop 0.2
            (plain, 1, _lm(4.5, 4.1, None)),  # drop 0.4
            (private, 0, _lm(4.4, 4.3, 8.0)),  # 0.1 / 0.2
            (private, 1, _lm(4.5, 4.2, 8.0)),  # 0.3 / 0.4
        )
    ]
    for d in done:
        d.update(error=None, wall_s=1.0, dir="")
    rows = {r["arm"]: r for r in generative(done)["rows"]}
    assert rows["np"]["share of the non-private drop (same seed)"] == "n/a"
    assert rows["dp ε=8"]["share of the non-private drop (same seed)"] == "0.625 ± 0.177"
    assert rows["dp ε=8"]["log-perplexity drop (mean ± std)"] == "0.200 ± 0.141"
    assert rows["dp ε=8"]["ε (PLD)"] == "8.00" and rows["np"]["min / round"] == "2.0"


def _mc(before: float, after: float, epsilon: float | None, tmp_path: Path, key: str) -> tuple[dict, str]:
    """A multiple-choice run's summary (two sets) and its run directory (two rounds of 4 replies)."""
    run_dir = tmp_path / key
    run_dir.mkdir()
    lines = [{"round": r, "bytes_up": 8_000_000, "replied": 4} for r in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    scores = {
        when: {"accuracy": a, "exact_match": a - 0.1, "acc_norm": a, "accuracy/mmlu": a, "accuracy/piqa": a}
        for when, a in (("before", before), ("after", after))
    }
    for when, loss in (("before", 0.5), ("after", 0.5 - (after - before))):  # the answers' loss
        scores[when] |= {"loss": loss, "perplexity": math.exp(loss)}
    summary = {
        **_lm(1.0, 1.0, epsilon),
        **scores,
        "bytes_up_per_round": 32e6,
        "bytes_down_per_round": 48e6,
        "rounds_completed": 2,
        "eval_examples": 195,
    }
    return summary, str(run_dir)


def test_the_dp_tracks_gains_pair_each_seed_with_its_own_non_private_run(tmp_path):
    plain, private = Arm("np"), Arm("dp ε=8", (), 8.0)
    done = []
    for arm, seed, before, after in (
        (plain, 0, 0.30, 0.40),  # gain 0.10
        (plain, 1, 0.35, 0.55),  # gain 0.20
        (private, 0, 0.30, 0.35),  # 0.05 / 0.10
        (private, 1, 0.35, 0.50),  # 0.15 / 0.20
    ):
        key = f"i-{arm.label}-{seed}"
        output, run_dir = _mc(before, after, arm.target_epsilon, tmp_path, key)
        run = Run("instruction", key, (), arm=arm, seed=seed)
        done.append({"run": run, "output": output, "error": None, "wall_s": 1.0, "dir": run_dir})
    sec = instruction(done)
    rows = {r["arm"]: r for r in sec["rows"]}
    assert rows["np"]["gain over the base (mean ± std)"] == "0.150 ± 0.071"
    assert rows["np"]["share of the non-private gain (same seed)"] == "n/a"
    assert rows["dp ε=8"]["share of the non-private gain (same seed)"] == "0.625 ± 0.177"
    assert rows["dp ε=8"]["accuracy of the base model"] == "0.325"
    assert rows["dp ε=8"]["exact match, generated (base → after)"] == "0.225 → 0.325"
    assert rows["dp ε=8"]["share of the non-private answer log-perplexity drop"] == "0.625 ± 0.177"
    assert rows["np"]["answers' perplexity (base → after)"] == "1.649 → 1.421"
    assert rows["np"]["communication (GB, total)"] == "0.16"  # (32 + 48) MB x 2 rounds
    assert rows["np"]["up per client and round (MB)"] == "2.00"  # 16 MB over 8 replies
    assert rows["dp ε=8"]["ε (PLD)"] == "8.00" and rows["np"]["min / round"] == "5.0"
    assert (
        "np, accuracy per set (base → after, mean over seeds): mmlu 0.32 → 0.48, piqa 0.32 → 0.48"
        in sec["notes"]
    )
    # a seed whose non-private run gained nothing gives no share (a ratio to ~0 or below means nothing)
    for d in done:
        if d["run"].arm is plain:
            d["output"]["after"]["accuracy"] = d["output"]["before"]["accuracy"] - 0.01
    rows = {r["arm"]: r for r in instruction(done)["rows"]}
    assert rows["dp ε=8"]["share of the non-private gain (same seed)"] == "n/a: no clear non-private gain"
    # nor a mean gain within its seeds' spread: +0.09 and -0.07 average +0.01, two standard errors 0.16
    for d, gain in zip([d for d in done if d["run"].arm is plain], (0.09, -0.07), strict=True):
        d["output"]["after"]["accuracy"] = d["output"]["before"]["accuracy"] + gain
    rows = {r["arm"]: r for r in instruction(done)["rows"]}
    assert rows["dp ε=8"]["share of the non-private gain (same seed)"] == "n/a: no clear non-private gain"


def test_the_silo_rows_of_the_dp_track_pair_with_the_silo_non_private_run(tmp_path):
    """The benchmark cross-silo is its own federation: its private arm's share is over the silo's
    non-private gain (not the cross-device one), its ε the largest node's sample-level ε."""
    done = []
    xdev, silo, silo_dp = Arm("np"), Arm("silo np"), Arm("silo dp ε=3", (), 3.0)
    for key, arm, before, after in (
        ("instruction-0-s0", xdev, 0.30, 0.50),  # cross-device gain 0.20
        ("instruction-silo-0-s0", silo, 0.30, 0.40),  # silo gain 0.10
        ("instruction-silo-1-s0", silo_dp, 0.30, 0.35),  # 0.05: half the silo's gain
    ):
        output, run_dir = _mc(before, after, None, tmp_path, key)
        if arm is silo_dp:
            output["node_privacy"] = _silo(1.0, 1.0, [2.999, 2.998])["node_privacy"]
            output["sample_privacy"] = "sample-level (dp-adamw) per node"
        run = Run("instruction", key, (), arm=arm, seed=0)
        done.append({"run": run, "output": output, "error": None, "wall_s": 1.0, "dir": run_dir})
    sec = instruction(done)
    rows = {r["arm"]: r for r in sec["rows"]}
    assert rows["silo dp ε=3"]["share of the non-private gain (same seed)"] == "0.500 (n = 1)"
    assert rows["silo dp ε=3"]["ε (PLD)"] == "3.00" and rows["silo dp ε=3"]["δ"] == 1e-05
    assert rows["np"]["ε (PLD)"] == "n/a" and rows["np"]["δ"] == "n/a"
    assert "guarantee: sample-level (dp-adamw) per node" in sec["notes"]
    rows = {r["arm"]: r for r in instruction([d for d in done if d["run"].arm is not silo])["rows"]}
    assert rows["silo dp ε=3"]["share of the non-private gain (same seed)"] == "n/a: no non-private run yet"


def _silo(before: float, after: float, epsilons: list[float]) -> dict:
    """A ``simulate`` summary of a cross-silo run: each node's sample-level ledger."""
    nodes = [{"node": k, "eps_tight": e, "delta": 1e-05} for k, e in enumerate(epsilons)]
    private = {"node_privacy": nodes, "sample_privacy": "sample-level (prism) per node"} if nodes else {}
    return {"before": {"perplexity": before}, "after": {"perplexity": after}, **private}


def _alone(before: float, after: float) -> dict:
    """A ``train-local`` result of one play alone."""
    return {"before": before, "perplexity": after, "privacy": {"epsilon": 2.999, "delta": 1e-05}}


def test_cross_silo_counts_a_seed_only_when_the_federation_is_below_every_node_alone():
    fed, plain = Arm("prism ε=3", ("--mechanism", "prism"), 3.0), Arm("fedavg", ("--mechanism", "fedavg"))
    plays = [Arm(f"play {k} alone", ("--node", str(k)), 3.0) for k in range(2)]
    cases = [
        (fed, 0, _silo(80.0, 76.0, [2.9999, 3.0])),  # below 77 and 78
        (fed, 1, _silo(90.0, 85.0, [3.0, 3.0])),  # not below play 1's 84
        (fed, 2, _silo(90.0, 70.0, [3.0, 3.0])),  # seed 2 has one play alone: not counted
        (plain, 0, _silo(80.0, 70.0, [])),
        (plays[0], 0, _alone(80.0, 77.0)),
        (plays[1], 0, _alone(80.0, 78.0)),
        (plays[0], 1, _alone(90.0, 86.0)),
        (plays[1], 1, _alone(90.0, 84.0)),
        (plays[0], 2, _alone(90.0, 86.0)),
    ]
    done = [
        {"run": Run("cross-silo", f"c-{i}", arm.argv, arm=arm, seed=seed), "output": out, "error": None}
        for i, (arm, seed, out) in enumerate(cases)
    ]
    done[0]["wall_s"] = 600.0
    rows = {r["arm"]: r for r in cross_silo(done)["rows"]}
    assert rows["prism ε=3"]["seeds below every node alone"] == "1 / 2"
    assert rows["prism ε=3"]["ε per node (PLD)"] == "3.00" and rows["prism ε=3"]["δ"] == 1e-05
    assert rows["prism ε=3"]["min / run"] == "10.0"
    drops = [math.log(80 / 76), math.log(90 / 85), math.log(90 / 70)]
    mean, std = sum(drops) / 3, (sum((d - sum(drops) / 3) ** 2 for d in drops) / 2) ** 0.5
    assert rows["prism ε=3"]["log-perplexity drop (mean ± std)"] == f"{mean:.3f} ± {std:.3f}"
    assert rows["fedavg"]["ε per node (PLD)"] == "n/a" and rows["fedavg"]["δ"] == "n/a"
    assert rows["fedavg"]["seeds below every node alone"] == "1 / 1"
    assert rows["play 1 alone"]["seeds below every node alone"] == "n/a"
    assert rows["play 1 alone"]["perplexity after (mean ± std)"] == "81.000 ± 4.243"
    # seed 0 is the only seed with a non-private federation: ln(80/76) / ln(80/70), by hand
    assert (
        rows["prism ε=3"]["share of the non-private drop (same seed)"]
        == f"{math.log(80 / 76) / math.log(80 / 70):.3f} (n = 1)"
    )
    assert rows["fedavg"]["share of the non-private drop (same seed)"] == "n/a"
    # a node alone is measured against the same non-private federation (seeds 1, 2 have none)
    alone0 = math.log(80 / 77) / math.log(80 / 70)
    assert rows["play 0 alone"]["share of the non-private drop (same seed)"] == f"{alone0:.3f} (n = 1)"


def test_adopting_an_unfinished_directory_is_one_line(tmp_path, capsys):
    assert (
        main(["bench", "suite", "--profile", "tiny", "--out", str(tmp_path / "o"), "--adopt", str(tmp_path)])
        != 0
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a finished run directory" in err[0]
    assert not (tmp_path / "o").exists()


def test_a_miniature_profile_cannot_overwrite_the_repositorys_results(tmp_path, capsys):
    docs = Path(__file__).resolve().parents[2] / "docs"
    before = (docs / "RESULTS.md").read_bytes()
    argv = ["bench", "suite", "--profile", "tiny", "--out", str(tmp_path / "o"), "--docs", str(docs)]
    assert main(argv) != 0
    assert "full profile's report" in capsys.readouterr().err
    assert (docs / "RESULTS.md").read_bytes() == before and not (tmp_path / "o").exists()


def test_a_what_if_row_says_so_and_runs_its_own_seeds():
    arms = [r for r in runs(profile("full")) if r.section == "generative"]
    what_if = [r for r in arms if "--noise-cohort" in r.argv]
    assert [r.seed for r in what_if] == [0] and "WHAT-IF" in what_if[0].arm.label
    assert {r.seed for r in arms if r not in what_if} == {0, 1, 2}
    out = _lm(4.4, 4.3, 8.0)
    out["client_privacy"]["what_if"] = "valid for a population of 10,000 clients ... "
    arm = Arm("w", (), 8.0)
    done = [{"run": Run("generative", "w", (), arm=arm, seed=0), "output": out, "error": None, "wall_s": 1.0}]
    (row,) = generative(done)["rows"]
    assert row["ε (PLD)"] == "8.00 (what-if)"


@pytest.mark.heavy
def test_a_train_local_run_made_by_hand_is_adopted_by_its_resolved_configuration(tmp_path):
    """``train-local`` writes its resolved configuration (and its own options) to config.json: the
    suite adopts that run for the plan's identical command, not for one with another seed."""
    (local,) = [r for r in runs(profile("tiny")) if r.argv[0] == "train-local"]
    made = tmp_path / "by-hand"
    assert main([*local.command[1:], "--out", str(made)]) == 0
    stored = json.loads((made / "config.json").read_text())
    assert not differences(plan_config(local), stored) and stored["train_local"]["node"] == 0
    other = Run(local.section, "other", local.argv, arm=local.arm, seed=1)
    took = adopt([other, local], [made], tmp_path / "runs", lambda line: None)
    assert took == [local.key]
    record = json.loads((tmp_path / "runs" / local.key / "command.json").read_text())
    assert record["wall_s"] == json.loads((made / "result.json").read_text())["seconds"]
    assert (tmp_path / "runs" / local.key / "result.json").exists()


def test_one_section_updates_that_section_and_keeps_the_others(tmp_path, monkeypatch):
    """Issue 52: a suite invocation of one section remakes it and carries every other section of the
    same profile's report unchanged, each under the commit and date it was made at."""
    fedavg, _ = _client_runs()
    kept = _stored(tmp_path, "kept", plan_config(fedavg), accuracy=0.625)
    out, quiet = tmp_path / "out", lambda _: None
    monkeypatch.setattr("common.provenance.commit", lambda: "aaaaaaa")
    first = suite("tiny", out, ["client-level", "communication"], quiet, [kept], stored_only=True)
    client = first["sections"][0]
    assert client["made"] == MADE and client["rows"]  # its one run's own stamp
    monkeypatch.setattr("common.provenance.commit", lambda: "bbbbbbb")
    second = suite("tiny", out, ["communication"], quiet, stored_only=True)
    names = [s["name"] for s in second["sections"]]
    assert names == ["client-level", "communication"]  # the report's order, not the invocation's
    assert second["sections"][0] == client  # carried as it was, its commit included
    assert second["sections"][1]["made"] == MADE  # the newest stamp of the runs it reads, not now's
    md = (out / "RESULTS.md").read_text()
    assert "at commit ccccccc" in md and "at commit aaaaaaa" not in md and "0.625 (n = 1)" in md
    # another profile's report is never mixed in
    third = suite("quick", out, ["communication"], quiet, stored_only=True)
    assert [s["name"] for s in third["sections"]] == ["communication"]


def test_the_report_regenerates_byte_for_byte_from_the_committed_records(tmp_path, monkeypatch):
    """Issue 52: with records (``--docs``), deleting every run directory and running the same command
    again, at another commit, makes the same RESULTS.md; a record of another command is not taken."""
    fedavg, dp = _client_runs()
    kept = _stored(tmp_path, "kept", plan_config(fedavg), accuracy=0.625)
    (kept / "metrics.jsonl").write_text(
        json.dumps({"round": 1, "bytes_up": 4000, "replied": 2, "loss": 0.6, "big": [0] * 50}) + "\n"
    )
    out, records, quiet = tmp_path / "out", tmp_path / "records", lambda _: None
    monkeypatch.setattr("common.provenance.commit", lambda: "aaaaaaa")
    suite(
        "tiny",
        out,
        ["client-level", "communication"],
        quiet,
        [kept],
        stored_only=True,
        scope=Scope(records=records),
    )
    first = (out / "RESULTS.md").read_text()
    record = json.loads((records / f"{fedavg.key}.json").read_text())
    # what the report reads, and the held-out curve; nothing else of the line
    assert record["metrics"] == [{"round": 1, "bytes_up": 4000, "replied": 2, "loss": 0.6}]
    assert record["made"] == MADE and record["adopted_from"] == str(kept)
    assert (records / f"{fedavg.key}.json").stat().st_size < 10_000 and not (
        records / f"{dp.key}.json"
    ).exists()

    shutil.rmtree(out)
    monkeypatch.setattr("common.provenance.commit", lambda: "bbbbbbb")
    again = suite(
        "tiny", out, ["client-level", "communication"], quiet, stored_only=True, scope=Scope(records=records)
    )
    assert (out / "RESULTS.md").read_text() == first
    assert (
        again["suite"]["runs"] == 1 and "2,000" in first
    )  # bytes per reply (4,000 over 2) came from the record

    record["command"] = [*record["command"], "--rounds", "9"]  # the plan changed since the record
    (records / f"{fedavg.key}.json").write_text(json.dumps(record))
    shutil.rmtree(out)
    changed = suite("tiny", out, ["client-level"], quiet, stored_only=True, scope=Scope(records=records))
    assert changed["suite"]["runs"] == 0 and len(changed["suite"]["missing"]) == 2


def test_the_records_folder_is_not_ignored_by_git():
    """The records are what a fresh clone regenerates docs/RESULTS.md from: a ``runs/`` ignore rule
    (run directories) must not swallow ``docs/results/runs/``."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    probe = subprocess.run(["git", "check-ignore", "-q", "docs/results/runs/any.json"], cwd=repo)
    assert probe.returncode == 1  # 1: not ignored (0 would be ignored)


def test_a_section_names_every_commit_of_its_newest_runs_recorded_ones_first():
    """Runs of one date made at two commits, one from before runs stamped themselves: the section
    names both (a run of an older date names none); no stamp at all: the invocation's; no finished
    run: none (a section that is not run yet was not made today)."""
    from server.bench.suite.cli import _made

    fedavg, dp = _client_runs()
    cpu = "cpu (2 cores, x86_64)"
    done = [
        {"run": fedavg, "made": {"date": "2026-11-29", "commit": "not recorded", "device": cpu}},
        {"run": dp, "made": {"date": "2026-11-29", "commit": "4771a3f", "device": cpu}},
        {"run": dp, "made": {"date": "2026-11-28", "commit": "0000000", "device": cpu}},
    ]
    made = _made(done, "client-level", {"date": "2026-12-01", "commit": "now", "device": cpu})
    assert made == {"date": "2026-11-29", "commit": "4771a3f, not recorded", "device": cpu}
    assert _made([{"run": fedavg}], "client-level", {"commit": "now"}) == {"commit": "now"}
    assert _made(done[:0], "client-level", {"commit": "now"}) is None


def test_docs_results_md_is_what_the_committed_records_make(tmp_path, monkeypatch):
    """Issue 52, on the repository itself: docs/RESULTS.md is byte for byte what
    ``fedlora bench suite --stored-only --docs docs`` makes from the committed records alone, in a
    directory with no run, at another commit and on another machine (the page names where its runs
    were made, not who regenerates it); it shows the same figures and nothing older."""
    repo = Path(__file__).resolve().parents[2]
    docs = tmp_path / "docs"
    shutil.copytree(repo / "docs" / "results" / "runs", docs / "results" / "runs")
    (docs / "results" / "stale.png").write_bytes(b"\x89PNG")  # a figure no section draws any more
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("common.provenance.commit", lambda: "fffffff")
    monkeypatch.setattr("common.provenance.device", lambda: "cuda (NVIDIA H200)")
    assert main(["bench", "suite", "--stored-only", "--docs", "docs"]) == 0
    assert (docs / "RESULTS.md").read_bytes() == (repo / "docs" / "RESULTS.md").read_bytes()
    figures = sorted(p.name for p in (docs / "results").glob("*.png"))
    assert figures == sorted(p.name for p in (repo / "docs" / "results").glob("*.png"))


def _score(accuracy: float, items: int = 753) -> dict:
    """``fedlora evaluate --json`` of an adapter (what runner.SCORES files hold)."""
    metrics = {"accuracy": accuracy, "exact_match": accuracy, "acc_norm": accuracy, "loss": 0.5}
    return {"adapter": "final", "eval_examples": items, "metrics": {**metrics, "perplexity": math.exp(0.5)}}


def test_the_dp_track_shows_every_item_where_every_seed_of_an_arm_was_scored_again(tmp_path):
    """An arm whose every seed carries its scores (runner.SCORES) shows them against the federation's
    base-model score; an arm with a seed not yet scored keeps its own subset figures, and a share
    across the two item sets is refused."""
    plain, private = Arm("np"), Arm("dp ε=8", (), 8.0)
    done = []
    for arm, seed, after, scored in (
        (plain, 0, 0.40, 0.33),
        (plain, 1, 0.50, 0.35),
        (private, 0, 0.35, 0.32),
    ):
        key = f"i-{arm.label}-{seed}"
        output, run_dir = _mc(0.30, after, arm.target_epsilon, tmp_path, key)
        scores = {"evaluation.json": _score(scored)} | (
            {"evaluation-base.json": _score(0.31)} if seed else {}
        )
        run = Run("instruction", key, (), arm=arm, seed=seed, rescore=("--eval-examples", "100000"))
        done.append({"run": run, "output": output, "scores": scores, "error": None, "dir": run_dir})
    sec = instruction(done)
    rows = {r["arm"]: r for r in sec["rows"]}
    assert rows["np"]["held-out items"] == "753" and rows["np"]["accuracy of the base model"] == "0.310"
    assert rows["np"]["gain over the base (mean ± std)"] == "0.030 ± 0.014"  # 0.02 and 0.04
    assert rows["dp ε=8"]["share of the non-private gain (same seed)"] == "0.500 (n = 1)"  # 0.01 / 0.02
    assert any("fedlora evaluate --run RUN --eval-examples 100000" in n for n in sec["notes"])
    del done[1]["scores"]["evaluation.json"]  # seed 1 of the non-private arm not scored yet
    rows = {r["arm"]: r for r in instruction(done)["rows"]}
    assert (
        rows["np"]["held-out items"] == "195"
        and rows["np"]["gain over the base (mean ± std)"] == "0.150 ± 0.071"
    )
    assert rows["dp ε=8"]["held-out items"] == "753"
    assert (
        rows["dp ε=8"]["share of the non-private gain (same seed)"]
        == "n/a: not scored on the non-private arm's items"
    )


def test_a_rescored_run_s_scores_are_recorded_restored_and_adopted_later(tmp_path):
    """A record keeps a run's scores (not the run's local path or configuration) and restores them;
    scores made since a run was adopted are taken from the directory it was adopted from."""
    from server.bench.suite.records import restore, save
    from server.bench.suite.runner import finished

    run = Run("instruction", "instruction-0-s0", ("simulate", "--preset", "smollm2-instruct-xdev"), seed=0)
    run = Run(run.section, run.key, run.argv, seed=0, rescore=("--eval-examples", "100000"))
    stored = _stored(tmp_path, "made-by-hand", plan_config(run))
    runs_dir = tmp_path / "suite" / "runs"
    assert adopt([run], [stored], runs_dir, print) == [run.key]
    assert finished(run, runs_dir)["scores"] == {}
    score = {**_score(0.33), "run": str(stored), "config": {"seed": 0}}
    (stored / "evaluation.json").write_text(json.dumps(score))
    lines: list[str] = []
    assert adopt([run], [stored], runs_dir, lines.append) == [run.key]
    assert lines == [f"[suite] adopt evaluation.json of {run.key}: {stored}"]
    found = finished(run, runs_dir)
    assert found["scores"]["evaluation.json"] == score
    records = tmp_path / "records"
    save([{"run": run, **found}], records, MADE)
    kept = json.loads((records / f"{run.key}.json").read_text())["scores"]["evaluation.json"]
    assert kept == _score(0.33)  # no local path, no configuration
    shutil.rmtree(runs_dir)
    assert restore([run], records, runs_dir) == [run.key]
    assert finished(run, runs_dir)["scores"] == {"evaluation.json": _score(0.33)}
