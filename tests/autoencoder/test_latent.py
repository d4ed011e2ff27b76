"""The ``homogeneous`` autoencoder latent: calibrated gain, positively homogeneous decode, checkpoint and
broadcast (autoencoder/train.py ``calibrate_latent``)."""

import dataclasses

import pytest
import torch
from safetensors import safe_open

from autoencoder.broadcast import encoder_from_payload, encoder_payload
from autoencoder.checkpoint import ae_version, load_checkpoint, save_checkpoint
from autoencoder.codecs import make_codec
from autoencoder.layout import Layout
from autoencoder.synthetic import sample_gradients
from autoencoder.train import TrainConfig, train_autoencoder
from autoencoder.uformer import AeConfig
from common.errors import FedloraError

SHAPES = {"l0.q.A": (7, 3), "l0.q.B": (13, 3), "l1.v.A": (12, 2), "l1.v.B": (9, 2)}
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stats():
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(s, generator=g) * 0.05, torch.full(s, 0.02)) for k, s in SHAPES.items()}


def _train(stats, latent):
    layout = Layout.from_shapes(SHAPES, AeConfig.tiny().downsample)
    cfg = TrainConfig(steps=3, lr=1e-2, samples=2, latent=latent)
    return train_autoencoder(AeConfig.tiny(), layout, [stats], cfg)


@pytest.fixture(scope="module")
def raw(stats):
    return _train(stats, "raw")


@pytest.fixture(scope="module")
def homogeneous(stats):
    return _train(stats, "homogeneous")


def _latent(codec, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(codec.latent_size, generator=g)


def test_decode_is_positively_homogeneous(homogeneous):
    codec = make_codec("ae", trained=homogeneous)
    z = _latent(codec, 1)
    base = codec.decode(z)
    for c in (0.05, 0.5, 3.0):
        scaled = codec.decode(c * z)
        for k in SHAPES:
            torch.testing.assert_close(scaled[k], c * base[k], rtol=1e-4, atol=1e-7)
    assert all(not t.any() for t in codec.decode(0 * z).values())


def test_raw_decode_is_not_homogeneous(raw):
    """The paper's latent: a shrunk latent (a clip) decodes to something else than a shrunk increment."""
    codec = make_codec("ae", trained=raw)
    z = _latent(codec, 2)
    base, small = codec.decode(z), codec.decode(0.05 * z)
    err = sum(float((small[k] - 0.05 * base[k]).norm()) for k in SHAPES)
    assert err > 1e-3 * sum(float(base[k].norm()) for k in SHAPES)


def test_calibrated_latent_is_as_long_as_the_increment(homogeneous, stats):
    """Fresh prior draws: mean latent norm ≈ ν = sqrt(Σ (m² + s²)) (closed form from the statistics)."""
    nu = float(sum((m**2 + s**2).sum() for m, s in stats.values()).sqrt())
    codec = make_codec("ae", trained=homogeneous)
    draws = sample_gradients(stats, SHAPES, 32, torch.Generator().manual_seed(7))
    norms = [float(codec.encode({k: v[i] for k, v in draws.items()}).norm()) for i in range(32)]
    assert sum(norms) / len(norms) == pytest.approx(nu, rel=0.15)
    assert homogeneous.latent_gain != 1 and homogeneous.latent_norm > 0
    assert homogeneous.history["latent"] == {"gain": homogeneous.latent_gain, "norm": homogeneous.latent_norm}


def test_homogeneous_decode_equals_raw_decode_at_the_calibrated_length(homogeneous):
    as_raw = make_codec("ae", trained=dataclasses.replace(homogeneous, latent_gain=1.0, latent_norm=0.0))
    codec = make_codec("ae", trained=homogeneous)
    u = _latent(codec, 3)
    u = u * (homogeneous.latent_norm / u.norm())
    a, b = codec.decode(homogeneous.latent_gain * u), as_raw.decode(u)
    for k in SHAPES:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)


def test_checkpoint_and_broadcast_keep_the_latent(raw, homogeneous, tmp_path):
    path = tmp_path / "h.safetensors"
    version = save_checkpoint(path, homogeneous)
    loaded, loaded_version = load_checkpoint(path)
    assert loaded_version == version == ae_version(homogeneous) != ae_version(raw)
    assert (loaded.latent_gain, loaded.latent_norm) == pytest.approx(
        (homogeneous.latent_gain, homogeneous.latent_norm)
    )
    save_checkpoint(tmp_path / "r.safetensors", raw)
    with safe_open(tmp_path / "r.safetensors", "pt") as f:  # the paper's latent: no extra tensor
        assert "latent" not in set(f.keys())
    state = {k: torch.full(s, 0.01) for k, s in SHAPES.items()}
    server = make_codec("ae", trained=loaded)
    tensors, meta = encoder_payload(homogeneous, version)
    client = encoder_from_payload(tensors, meta)
    torch.testing.assert_close(client.encode(state), server.encode(state))
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(FedloraError, match=r"latent gain|malformed"):
            encoder_from_payload(tensors, {**meta, "latent_gain": bad})


def test_unknown_latent_mode():
    with pytest.raises(FedloraError, match="unknown latent mode"):
        TrainConfig(latent="scaled")
