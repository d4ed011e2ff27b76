"""``fedlora bench codec``: every codec on real MiniLM increments from a 2-client in-process round."""

import contextlib
import io
import itertools
import json
import math

import pytest

from common.errors import FedloraError
from server.bench.codec import ORDERS
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

TINY = [
    "--preset",
    "minilm-rt",
    "--num-clients",
    "2",
    "--local-steps",
    "2",
    "--batch-size",
    "8",
    "--max-train-examples",
    "200",
    "--eval-examples",
    "40",
    "--ae-steps",
    "2",
    "--rank",
    "2",  # D = 18,432: the random projection's bases stay cheap on 2 cores
]
CODECS = ("ae", "identity", "constant-mean", "random-projection")
NOISE = ("none", "clip=1", "eps=8")


@pytest.fixture(scope="module")
def result():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run_cli(["bench", "codec", *TINY, "--json"]) == 0
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def by_key(result):
    return {(r["codec"], r["order"], r["noise"]): r for r in result["records"]}


def test_one_record_per_codec_order_noise(result, by_key):
    assert len(result["records"]) == 4 * 3 * 3
    assert set(by_key) == set(itertools.product(CODECS, ORDERS, NOISE))
    assert all(
        set(r) >= {"codec", "order", "noise", "cosine", "rel_l2", "bytes", "compression"}
        for r in by_key.values()
    )
    assert result["unit"] == "client-level" and result["threat_model"] == "local"
    assert result["epsilon"] == 8 and result["delta"] == 1e-5 and result["sigma"] > 0
    assert result["clients"] == 2 and result["ae_steps"] == 2 and result["ae_first_loss"] > 0


def test_identity_is_exact_without_noise(by_key):
    for order in ORDERS:
        rec = by_key[("identity", order, "none")]
        assert rec["cosine"] == pytest.approx(1, abs=1e-6) and rec["rel_l2"] < 1e-6
        assert rec["compression"] == 1


def test_bytes_and_compression(result, by_key):
    k, D = result["latent_size"], result["factor_coords"]
    for order, noise in itertools.product(ORDERS, NOISE):
        assert by_key[("constant-mean", order, noise)]["bytes"] == 0
        assert by_key[("constant-mean", order, noise)]["compression"] is None  # JSON null: nothing sent
        for codec in ("ae", "random-projection"):
            assert by_key[(codec, order, noise)]["bytes"] == 4 * k
            assert by_key[(codec, order, noise)]["compression"] == pytest.approx(D / k)
        assert by_key[("identity", order, noise)]["bytes"] == 4 * D


def test_random_projection_keeps_a_random_subspace_share(result, by_key):
    """A random k-dimensional projection of a fixed x: E‖x − Px‖²/‖x‖² = 1 − k/D, E cos² = k/D."""
    share = result["latent_size"] / result["factor_coords"]
    rec = by_key[("random-projection", "client", "none")]
    assert rec["rel_l2"] == pytest.approx(math.sqrt(1 - share), abs=0.02)
    assert rec["cosine"] == pytest.approx(math.sqrt(share), abs=0.05)


def test_clip_alone_keeps_a_linear_codec_direction(by_key):
    """Clipping scales each coded update: a linear decode keeps each client's direction, nothing else."""
    for codec in ("identity", "random-projection"):
        clipped, clean = by_key[(codec, "client", "clip=1")], by_key[(codec, "client", "none")]
        assert clipped["cosine"] == pytest.approx(clean["cosine"], abs=1e-5)
    assert by_key[("constant-mean", "client", "clip=1")] == {
        **by_key[("constant-mean", "client", "none")],
        "noise": "clip=1",
    }


def test_noise_changes_the_coded_codecs_only(by_key):
    for order in ORDERS:
        for codec in ("identity", "random-projection"):
            assert (
                by_key[(codec, order, "eps=8")]["rel_l2"] > 2 * by_key[(codec, order, "none")]["rel_l2"] + 1
            )
        assert by_key[("ae", order, "eps=8")]["rel_l2"] != by_key[("ae", order, "none")]["rel_l2"]
        # constant-mean decodes its prior mean whatever arrives: the noise only touches dense entries
        assert (
            by_key[("constant-mean", order, "eps=8")]["rel_l2"]
            == by_key[("constant-mean", order, "none")]["rel_l2"]
        )


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["--epsilon", "0"], "--epsilon"),
        (["--epsilon", "nan"], "--epsilon"),
        (["--epsilon", "8,x"], "--epsilon"),
        (["--codec", "ae"], "--codec"),
        (["--start-from", "/nonexistent/run", "--max-train-examples", "100"], "/nonexistent/run"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, word):
    assert run_cli(["bench", "codec", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedlora: error:") and word in err


def test_start_state_from_a_run_checkpoint(tmp_path):
    """``--start-from``: a run directory or its checkpoint; another LoRA shape is refused in one line."""
    import torch

    from common.presets import preset
    from server.bench.codec import start_state
    from server.checkpoint import CHECKPOINT_FILE, LoopState, save
    from server.evaluation import Evaluator

    evaluator = Evaluator(preset("minilm-rt", rank=2, max_train_examples=200, eval_examples=40).check())
    initial, origin = start_state(evaluator, None)
    assert origin.startswith("round 0")
    later = {k: v + 0.5 for k, v in initial.items()}
    save(tmp_path / CHECKPOINT_FILE, later, LoopState(round=3))
    for given in (tmp_path, tmp_path / CHECKPOINT_FILE):
        state, origin = start_state(evaluator, str(given))
        assert origin.endswith("(after round 3)")
        assert all(torch.equal(state[k], later[k]) for k in later)
    other = tmp_path / "other"
    other.mkdir()
    save(other / CHECKPOINT_FILE, {k: v[..., :1] for k, v in later.items()}, LoopState(round=1))
    with pytest.raises(FedloraError, match="another model or LoRA configuration"):
        start_state(evaluator, str(other))


def test_public_prior_codecs_and_central_noise_at_several_epsilons():
    """``--public-fraction``: ``pca`` (k = min(ae latent, public increments)) and ``ae-public`` join the
    table, both fitted on the server's public increments; the pca decode is an orthogonal projection
    (on the decoded mean: rel_l2² + cos² = 1). ``--threat-model central --epsilon 8,3``: one noisy
    setting per ε, the noise on the sum only (a client's own decode carries none)."""
    out = io.StringIO()
    argv = [*TINY, "--public-fraction", "0.2", "--public-increments", "6", "--json"]
    argv += ["--threat-model", "central", "--epsilon", "8,3"]
    with contextlib.redirect_stdout(out):
        assert run_cli(["bench", "codec", *argv]) == 0
    result = json.loads(out.getvalue())
    by = {(r["codec"], r["order"], r["noise"]): r for r in result["records"]}
    assert {c for c, _, _ in by} == {*CODECS, "pca", "ae-public"}
    assert result["public_increments"] == 6 and result["pca_k"] == 6 and result["public_fraction"] == 0.2
    assert by[("pca", "client", "none")]["bytes"] == 4 * 6
    assert by[("ae-public", "client", "none")]["bytes"] == 4 * result["latent_size"]
    mean = by[("pca", "aggregate-then-decode", "none")]
    assert mean["rel_l2"] ** 2 + mean["cosine"] ** 2 == pytest.approx(1, abs=1e-4)
    assert result["ae_public_first_loss"] > 0
    assert result["threat_model"] == "central"
    sigmas = {n["label"]: n["sigma"] for n in result["noise"]}
    assert set(sigmas) == {"eps=8", "eps=3"} and sigmas["eps=3"] > sigmas["eps=8"] > 0
    for eps in ("eps=8", "eps=3"):
        assert by[("identity", "client", eps)]["cosine"] == pytest.approx(
            by[("identity", "client", "clip=1")]["cosine"], abs=1e-6
        )
        noisy, clean = (
            by[("identity", "aggregate-then-decode", eps)],
            by[("identity", "aggregate-then-decode", "clip=1")],
        )
        assert noisy["rel_l2"] > clean["rel_l2"] + 0.5
