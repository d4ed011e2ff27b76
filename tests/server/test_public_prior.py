"""The public subspace: a basis fitted on the server's public increments, applied to the released
mean as post-processing (server/public_prior.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from autoencoder.layout import Layout
from common.errors import FedloraError
from common.models import adapter_shapes
from common.presets import preset
from server import checkpoint, drencoder, public_prior
from server.evaluation import Evaluator
from server.public_prior import BASIS_FILE, PublicSubspace
from server.simulate import simulate
from tests.harness import TINY

PUBLIC = dict(public_fraction=0.25, public_subspace=3, public_increments=4)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(public_subspace=3), "needs public data"),
        (dict(public_fraction=0.2, public_subspace=9, public_increments=8), "exceeds --public-increments 8"),
        (dict(**PUBLIC, prior_refresh=0), "prior-refresh must be"),
    ],
)
def test_bad_public_subspace_options_are_one_line(changes, message):
    with pytest.raises(FedloraError, match=message):
        preset("minilm-rt", **TINY, **changes).check()


@pytest.mark.heavy
def test_a_subspace_larger_than_the_factor_entries_is_one_line_before_any_public_increment(
    tmp_path, monkeypatch
):
    fail = lambda *a: pytest.fail("computed increments")  # noqa: E731
    # both names: server.drencoder binds public_increments at its import, which may happen here
    monkeypatch.setattr(public_prior, "public_increments", fail)
    monkeypatch.setattr(drencoder, "public_increments", fail)
    big = dict(public_fraction=0.25, public_subspace=10**7, public_increments=10**7)
    refused = dict(threat_model="central", noise_multiplier=1.0, clip=1.0)
    cfg = preset("minilm-rt", **TINY, **big, **refused)
    with pytest.raises(FedloraError, match=r"--public-subspace 10000000 exceeds the [\d,]+ LoRA-factor"):
        simulate(cfg.check(), tmp_path / "r")
    assert not (tmp_path / "r" / BASIS_FILE).exists()


def _central_run(tmp_path, **changes) -> tuple:
    """A TINY central-noise federation with the public options; ``(run_dir, start, end)`` states."""
    run_dir = tmp_path / "r"
    cfg = preset(
        "minilm-rt", **TINY, **PUBLIC, threat_model="central", noise_multiplier=1.0, clip=1.0, **changes
    )
    start = Evaluator(cfg.check()).initial_state()
    simulate(cfg.check(), run_dir)
    shapes = {k: tuple(v.shape) for k, v in start.items()}
    end, _, _ = checkpoint.load(run_dir / checkpoint.CHECKPOINT_FILE, shapes)
    return run_dir, start, end


def _assert_in_span(start, end, factors, basis_file) -> None:
    """The factor entries of ``end - start`` lie in the span of the saved basis."""
    layout = Layout.from_shapes({k: tuple(start[k].shape) for k in factors}, 1)
    basis = load_file(str(basis_file))["basis"].double()
    assert basis.shape[0] == layout.num_coords
    delta = layout.to_vector({k: end[k] - start[k] for k in layout.names}).double()
    outside = delta - basis @ (basis.T @ delta)
    assert delta.norm() > 0 and outside.norm() < 1e-4 * delta.norm()


@pytest.mark.integration
def test_the_applied_factor_update_lies_in_the_public_subspace(tmp_path):
    run_dir, start, end = _central_run(tmp_path, mechanism="dp-fedavg")
    dense = [k for k in start if "classifier" in k]
    _assert_in_span(start, end, [k for k in start if k not in dense], run_dir / BASIS_FILE)
    assert load_file(str(run_dir / BASIS_FILE))["basis"].shape[1] == 3
    assert dense and any(not torch.equal(end[k], start[k]) for k in dense)  # the head is not projected


def test_the_basis_is_refitted_every_prior_refresh_rounds_and_reloaded_on_resume(
    tmp_path, monkeypatch, minilm
):
    fits = []

    def fake_increments(evaluator, cfg, state, count, layout):
        fits.append(count)
        return torch.randn(count, layout.num_coords, generator=torch.Generator().manual_seed(len(fits)))

    monkeypatch.setattr(public_prior, "public_increments", fake_increments)
    cfg = preset("minilm-rt", **TINY, **PUBLIC, prior_refresh=2).check()
    layout = Layout.from_shapes(adapter_shapes(minilm.model), 1)
    subspace = PublicSubspace(cfg, None, layout, tmp_path)
    for rnd in range(1, 6):
        subspace.refresh(rnd, {}, lambda _line: None)
        assert subspace.fitted_round == 1 + (rnd - 1) // 2 * 2
    assert len(fits) == 3  # rounds 1, 3 and 5
    resumed = PublicSubspace(cfg.replace(resume=True), None, layout, tmp_path)
    assert resumed.fitted_round == 5 and torch.equal(resumed.codec.basis, subspace.codec.basis)
    resumed.refresh(6, {}, lambda _line: None)
    assert len(fits) == 3  # round 6 uses round 5's basis


@pytest.mark.parametrize("encode_at", ["client", "server"])
@pytest.mark.integration
def test_the_pca_codec_release_sends_k_numbers_and_decodes_into_the_public_subspace(tmp_path, encode_at):
    """``dr-encoder --codec pca``: no statistics round, the basis is broadcast like an encoder, each
    reply is a k-number latent (plus the dense head), the applied factor update lies in the basis.
    ``--encode-at server``: no basis goes out, each reply is the raw increment, the same span."""
    import json

    from server.drencoder import PCA_FILE, STATS_FILE

    run_dir, start, end = _central_run(tmp_path, mechanism="dr-encoder", codec="pca", encode_at=encode_at)
    assert not (run_dir / STATS_FILE).exists() and not (run_dir / BASIS_FILE).exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    info = summary["dr_encoder"]
    assert info["codec"] == "pca" and info["latent_size"] == 3 and "public" in info["prior"]
    assert info["encode_at"] == encode_at
    assert not [n for n in summary["not_covered"] if "statistics" in n]  # nothing sent in the clear
    dense = [k for k in start if "classifier" in k]
    assert info["coded_bytes"] == 4 * 3 + 4 * sum(start[k].numel() for k in dense)
    _assert_in_span(start, end, [k for k in start if k not in dense], run_dir / PCA_FILE)
    raw = 4 * sum(t.numel() for t in start.values())
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (train,) = [r for r in map(json.loads, lines) if r.get("phase") == "train"]
    up, down = train["bytes_up"] / train["replied"], train["bytes_down"] / train["sampled"]
    if encode_at == "server":  # raw increments up, only the global adapter down
        assert up > raw and down < 2 * raw
    else:  # latents up, the basis down with the adapter
        assert up < raw / 10 and down > 2 * raw


def test_a_tampered_pca_broadcast_is_refused():
    from autoencoder.broadcast import basis_version, codec_from_payload, pca_payload
    from autoencoder.codecs import PcaCodec

    layout = Layout.from_shapes({"l.q.A": (6, 2), "l.q.B": (5, 2)}, 1)
    q, _ = torch.linalg.qr(torch.randn(layout.num_coords, 3, generator=torch.Generator().manual_seed(0)))
    codec = PcaCodec(layout, q, version=basis_version(q))
    tensors, meta = pca_payload(codec)
    again = codec_from_payload(tensors, meta)
    assert again.name == "pca" and again.version == codec.version and torch.equal(again.basis, codec.basis)
    with pytest.raises(FedloraError, match="not version"):
        codec_from_payload({"basis": tensors["basis"] * 2}, meta)
    with pytest.raises(FedloraError, match="does not fit"):
        codec_from_payload({"basis": tensors["basis"][:-1]}, meta)


@pytest.mark.slow
def _refitted_every_round(tmp_path, **codec):
    """A 2-round central-noise dr-encoder run with a public-prior ``codec`` refitted every round; its
    directory."""
    run_dir = tmp_path / "r"
    cfg = preset(
        "minilm-rt",
        **{**TINY, "rounds": 2},
        **PUBLIC,
        prior_refresh=1,
        mechanism="dr-encoder",
        threat_model="central",
        noise_multiplier=1.0,
        clip=1.0,
        sample_rate=1.0,
        **codec,
    ).check()
    simulate(cfg, run_dir)
    return run_dir


@pytest.mark.slow  # make test-all: make test keeps the PCA codec's release and the basis refit on resume
@pytest.mark.integration
def test_the_pca_codec_is_refitted_every_prior_refresh_rounds_and_rebroadcast(tmp_path):
    from server.drencoder import PCA_FILE

    run_dir = _refitted_every_round(tmp_path, codec="pca")
    assert int(load_file(str(run_dir / PCA_FILE))["round"].item()) == 2
    cached = {p.name for p in (run_dir / "nodes" / "shared" / "encoders").glob("*.safetensors")}
    assert len(cached) == 2 and all(
        name.startswith("pca-") for name in cached
    )  # both versions reached the nodes


@pytest.mark.heavy
def test_the_autoencoder_on_the_public_prior_trains_on_the_given_increments():
    """``--ae-prior public``: every training batch is made of the given increments (drawn with
    replacement), the prior's moments are theirs, and the homogeneous latent is calibrated on them."""
    from autoencoder.synthetic import empirical_stats
    from autoencoder.train import TrainConfig, _drawer, train_autoencoder
    from autoencoder.uformer import AeConfig

    layout = Layout.from_shapes({"l.q.A": (12, 2), "l.q.B": (20, 2)}, AeConfig.tiny().downsample)
    samples = torch.randn(5, layout.num_coords, generator=torch.Generator().manual_seed(0))
    stats = empirical_stats(layout, samples)
    mean = layout.to_vector({k: v[0] for k, v in stats.items()})
    std = layout.to_vector({k: v[1] for k, v in stats.items()})
    assert torch.allclose(mean, samples.mean(0), atol=1e-6)
    assert torch.allclose(std, samples.std(0, correction=0), atol=1e-6)
    draw = _drawer(layout, [stats], samples, torch.Generator().manual_seed(1))
    for step in range(4):
        batch = layout.to_vector(draw(step, 3))
        assert batch.shape == (3, layout.num_coords)
        assert all(any(torch.equal(row, s) for s in samples) for row in batch)  # real rows, not synthetic
    config = TrainConfig(steps=3, lr=1e-2, samples=2, latent="homogeneous")
    trained = train_autoencoder(AeConfig.tiny(), layout, [stats], config, samples=samples)
    assert len(trained.history["loss"]) == 3 and trained.latent_norm > 0
    nu = float(samples.double().pow(2).mean(0).sum().sqrt())  # the prior's expected norm, as calibrated
    assert trained.latent_gain == pytest.approx(nu / trained.latent_norm, rel=1e-5)
    with pytest.raises(FedloraError, match="samples must be"):
        train_autoencoder(AeConfig.tiny(), layout, [stats], config, samples=samples[:, :-1])


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(mechanism="dr-encoder", ae_prior="public"), "needs public data"),
        (
            dict(mechanism="dr-encoder", ae_prior="public", codec="identity", public_fraction=0.2),
            "has no autoencoder",
        ),
    ],
)
def test_bad_ae_prior_options_are_one_line(changes, message):
    with pytest.raises(FedloraError, match=message):
        preset("minilm-rt", **TINY, threat_model="central", noise_multiplier=1.0, **changes).check()


@pytest.mark.integration
def test_the_ae_codec_on_the_public_prior_skips_the_statistics_round_and_is_refitted(tmp_path):
    """``dr-encoder --codec ae --ae-prior public``: nothing is sent in the clear, the autoencoder is
    fitted on public increments before round 1 and again every ``prior-refresh`` rounds, and every
    version reaches the nodes."""
    import json

    from server.drencoder import AE_FILE, STATS_FILE, latest_public_ae

    run_dir = _refitted_every_round(tmp_path, codec="ae", ae_prior="public", ae_steps=2)
    assert not (run_dir / STATS_FILE).exists() and not (run_dir / AE_FILE).exists()
    assert latest_public_ae(run_dir)[0] == 2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "public" in summary["dr_encoder"]["prior"]
    assert not [n for n in summary["not_covered"] if "statistics" in n]
    cached = list((run_dir / "nodes" / "shared" / "encoders").glob("*.safetensors"))
    assert len(cached) == 2  # both encoders reached the nodes
