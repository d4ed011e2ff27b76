"""``--eval-cache`` (server/eval_cache.py): an evaluation read back is the one computed, keyed by
everything it depends on, and a run's round 0 reads it."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from common.presets import preset
from server import eval_cache
from server.simulate import simulate
from tests.harness import TINY, records

SETTINGS = {"model": "m", "precision": "fp32", "max_length": 16}
EXAMPLES = [("a text", 0), ("another", 1)]


def _state() -> dict[str, torch.Tensor]:
    return {"b": torch.zeros(2, 3), "a": torch.arange(6, dtype=torch.float32).reshape(3, 2)}


def test_the_key_is_stable_and_changes_with_every_input():
    key = eval_cache.cache_key(SETTINGS, EXAMPLES, _state())
    assert key == eval_cache.cache_key(dict(reversed(SETTINGS.items())), list(EXAMPLES), _state())
    changed = _state()
    changed["b"][1, 2] = 1e-30  # one tensor entry, one ulp-sized change
    others = [
        eval_cache.cache_key({**SETTINGS, "max_length": 17}, EXAMPLES, _state()),
        eval_cache.cache_key(SETTINGS, [("a text", 1), ("another", 1)], _state()),
        eval_cache.cache_key(SETTINGS, [("a tex", 0), ("another", 1)], _state()),
        eval_cache.cache_key(SETTINGS, EXAMPLES[::-1], _state()),
        eval_cache.cache_key(SETTINGS, EXAMPLES, changed),
        eval_cache.cache_key(SETTINGS, EXAMPLES, {**_state(), "b": torch.zeros(3, 2)}),  # shape
        eval_cache.cache_key(SETTINGS, EXAMPLES, {**_state(), "b": torch.zeros(2, 3, dtype=torch.bfloat16)}),
        eval_cache.cache_key(SETTINGS, [("a textanother", 0)], _state()),  # no ambiguity in concatenation
    ]
    assert len({key, *others}) == len(others) + 1


def test_the_task_s_code_is_part_of_the_key(tmp_path, monkeypatch):
    """An edit to a task's module or to a base's (the scorer) changes its digest, so an evaluation the
    old code computed is not read back."""
    from common.tasks.chat import ChatTask
    from common.tasks.multiple_choice import MultipleChoiceTask

    digest = eval_cache.code_digest(MultipleChoiceTask)
    assert digest == eval_cache.code_digest(MultipleChoiceTask) != eval_cache.code_digest(ChatTask)
    module = tmp_path / "edited.py"
    module.write_text("class Task:\n    pass\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("common._edited_task", module)
    loaded = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, loaded)
    spec.loader.exec_module(loaded)
    before = eval_cache.code_digest(loaded.Task)
    module.write_text("class Task:\n    pass  # edited\n")
    assert eval_cache.code_digest(loaded.Task) != before


def test_an_entry_reads_back_and_a_bad_one_is_absent(tmp_path):
    assert eval_cache.read(tmp_path, "k") is None
    eval_cache.write(tmp_path / "c", "k", {"accuracy": 0.5, "loss": 1.25}, 12.5)
    assert eval_cache.read(tmp_path / "c", "k") == ({"accuracy": 0.5, "loss": 1.25}, 12.5)
    for bad in ("", "{", '{"metrics": 1, "seconds": 2}', '{"metrics": {"a": "x"}, "seconds": 1}'):
        (tmp_path / "bad.json").write_text(bad)
        assert eval_cache.read(tmp_path, "bad") is None
    assert not list((tmp_path / "c").glob(".*tmp"))


@pytest.mark.timeout(600)
def test_round_0_of_a_second_arm_is_read_from_the_cache_and_is_the_same(tmp_path, capsys):
    """Two arms of one seed (non-private, then client-level DP): the second run's round 0 is read, and
    equals what the first computed; the final evaluations (other adapters) are computed. A run with
    another seed (another initial adapter and held-out sample) computes its own."""
    cache = tmp_path / "cache"
    base = {**TINY, "eval_cache": str(cache), "precision": "fp32", "sample_rate": 1.0}
    first = simulate(preset("small", **base).check(), tmp_path / "np")
    assert "read from --eval-cache" not in capsys.readouterr().out
    assert len(list(cache.glob("*.json"))) == 2  # round 0 and the trained adapter
    dp = preset("small", **base, mechanism="dp-fedavg", noise_multiplier=1.0, threat_model="central")
    second = simulate(dp.check(), tmp_path / "dp8")
    assert f"(untrained adapter; read from --eval-cache {cache})" in capsys.readouterr().out
    r0 = [records(run)[0] for run in (first, second)]
    assert r0[1].pop("evaluation") == "cached" and "evaluation" not in r0[0]
    assert r0[0] == r0[1]
    summaries = [json.loads((run / "summary.json").read_text()) for run in (first, second)]
    assert summaries[0]["before"] == summaries[1]["before"]
    assert summaries[0]["after"] != summaries[1]["after"]
    assert summaries[0]["cached_evaluation_s"] == 0 < summaries[1]["cached_evaluation_s"]
    assert len(list(cache.glob("*.json"))) == 3
    # resumed (here after its last round), the run still states the cached seconds of its first session
    simulate(dp.replace(resume=True).check(), second)
    resumed = json.loads((second / "summary.json").read_text())
    assert resumed["cached_evaluation_s"] == summaries[1]["cached_evaluation_s"]
    simulate(preset("small", **{**base, "seed": 6}).check(), tmp_path / "other-seed")
    assert "read from --eval-cache" not in capsys.readouterr().out
    assert len(list(cache.glob("*.json"))) == 5
