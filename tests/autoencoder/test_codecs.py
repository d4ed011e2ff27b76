"""Codec contract for ae / identity / constant-mean / random-projection, and AE checkpoints."""

import json
import math

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from autoencoder.checkpoint import CHECKPOINT_FORMAT, ae_version, load_checkpoint, save_checkpoint
from autoencoder.codecs import CODECS, Codec, RandomProjectionCodec, fit_pca, make_codec
from autoencoder.layout import Layout
from autoencoder.train import TrainConfig, train_autoencoder
from autoencoder.uformer import AeConfig
from common.errors import FedloraError

SHAPES = {
    "l0.q.A": (7, 3),
    "l0.q.B": (13, 3),
    "l1.q.A": (7, 3),
    "l1.q.B": (13, 3),
    "l1.v.A": (12, 2),
    "l1.v.B": (9, 2),
}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stats():
    g = torch.Generator().manual_seed(0)
    return {k: (torch.randn(s, generator=g) * 0.05, torch.full(s, 0.01)) for k, s in SHAPES.items()}


@pytest.fixture(scope="module")
def trained(stats):
    layout = Layout.from_shapes(SHAPES, AeConfig.tiny().downsample)
    return train_autoencoder(AeConfig.tiny(), layout, [stats], TrainConfig(steps=3, lr=1e-2, samples=2))


def _increment(seed=1, head=True):
    g = torch.Generator().manual_seed(seed)
    state = {k: torch.randn(s, generator=g) * 0.05 for k, s in SHAPES.items()}
    if head:
        state["classifier.weight"] = torch.randn(2, 13, generator=g)  # dense: not encoded
    return state


def _make(name: str, trained) -> Codec:
    """Every codec by name; ``pca`` fitted on 8 random increments (k = 4)."""
    if name != "pca":
        return make_codec(name, trained=trained)
    samples = torch.stack([trained.layout.to_vector(_increment(seed=i)) for i in range(8)])
    return make_codec("pca", layout=trained.layout, samples=samples, latent_size=4)


@pytest.mark.parametrize("name", CODECS)
def test_codec_contract(name, trained):
    codec = _make(name, trained)
    assert isinstance(codec, Codec) and codec.name == name
    state = _increment()
    z = codec.encode(state)
    assert z.shape == (codec.latent_size,) and z.dtype == torch.float32
    torch.testing.assert_close(codec.encode(state), z, rtol=0, atol=0)
    out = codec.decode(z)
    assert {k: tuple(v.shape) for k, v in out.items()} == SHAPES
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in out.values())
    again = codec.decode(z.clone())
    assert all(torch.equal(again[k], out[k]) for k in SHAPES)


@pytest.mark.parametrize("name", CODECS)
def test_codec_rejects_bad_latents_and_states(name, trained):
    codec = _make(name, trained)
    k = codec.latent_size
    for bad in (torch.zeros(k + 1), torch.zeros(1, k), torch.zeros(k, dtype=torch.int64)):
        with pytest.raises(FedloraError):
            codec.decode(bad)
    if k:
        with pytest.raises(FedloraError):
            codec.decode(torch.full((k,), float("nan")))
    state = _increment()
    with pytest.raises(FedloraError):
        codec.encode({n: v for n, v in state.items() if n != "l1.v.B"})
    with pytest.raises(FedloraError):
        codec.encode({**state, "l0.q.A": torch.zeros(3, 7)})


def test_latent_sizes(trained):
    layout = trained.layout
    ae = make_codec("ae", trained=trained)
    assert (
        ae.latent_size == math.prod(trained.latent_shape) == layout.num_pixels // 16
    )  # tiny: 1/16 of the pixels
    assert make_codec("random-projection", trained=trained).latent_size == ae.latent_size
    assert make_codec("identity", layout=layout).latent_size == layout.num_coords
    assert make_codec("constant-mean", trained=trained).latent_size == 0


def test_identity_is_exact_and_linear(trained):
    codec = make_codec("identity", layout=trained.layout)
    a, b = _increment(1), _increment(2)
    out = codec.decode(codec.encode(a))
    assert all(torch.equal(out[k], a[k]) for k in SHAPES)
    torch.testing.assert_close(
        codec.encode({k: a[k] + b[k] for k in SHAPES}), codec.encode(a) + codec.encode(b)
    )


def test_constant_mean_ignores_its_input(trained, stats):
    codec = make_codec("constant-mean", trained=trained)
    first = codec.decode(codec.encode(_increment(1)))
    second = codec.decode(codec.encode(_increment(2)))
    for k in SHAPES:
        assert torch.equal(first[k], second[k])
        torch.testing.assert_close(first[k], stats[k][0])
    explicit = make_codec("constant-mean", layout=trained.layout, mean={k: stats[k][0] for k in SHAPES})
    assert all(torch.equal(explicit.decode(torch.zeros(0))[k], first[k]) for k in SHAPES)


def test_random_projection_is_a_seeded_linear_projection(trained):
    codec = make_codec("random-projection", trained=trained, seed=3)
    a, b = _increment(1), _increment(2)
    za, zb = codec.encode(a), codec.encode(b)
    torch.testing.assert_close(codec.encode({k: a[k] + b[k] for k in SHAPES}), za + zb, atol=1e-6, rtol=1e-5)
    da, db, dab = codec.decode(za), codec.decode(zb), codec.decode(za + zb)
    for k in SHAPES:
        torch.testing.assert_close(dab[k], da[k] + db[k], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(codec.encode(da), za, atol=1e-6, rtol=1e-5)  # encode∘decode = identity
    again = codec.decode(codec.encode(da))  # decode∘encode is a projection: idempotent
    for k in SHAPES:
        torch.testing.assert_close(again[k], da[k], atol=1e-6, rtol=1e-5)
    # an orthogonal projection shrinks; ‖P x‖² / ‖x‖² ≈ k / D
    x = codec.layout.to_vector(a)
    ratio = float(codec.layout.to_vector(da).norm() ** 2 / x.norm() ** 2)
    assert 0 < ratio < 1
    same = make_codec("random-projection", trained=trained, seed=3).encode(a)
    other = make_codec("random-projection", trained=trained, seed=4).encode(a)
    assert torch.equal(same, za) and not torch.allclose(other, za)


def test_random_projection_blocks_and_cache_agree():
    layout = Layout.from_shapes(SHAPES, 4)
    cached = RandomProjectionCodec(layout, 37, seed=1, block=16)
    rebuilt = RandomProjectionCodec(layout, 37, seed=1, block=16, cache_floats=0)
    assert cached._cache is not None and rebuilt._cache is None
    assert sum(cached.out_sizes) == 37 and all(
        1 <= q <= d for q, d in zip(cached.out_sizes, cached.in_sizes, strict=True)
    )
    a = _increment(1)
    torch.testing.assert_close(cached.encode(a), rebuilt.encode(a))
    with pytest.raises(FedloraError):
        RandomProjectionCodec(layout, layout.num_coords + 1)


def test_random_projection_scales_to_many_coordinates():
    # ~2.6e5 coordinates at 1/64: never forms the k × D matrix (3e8 floats)
    shapes = {f"{i}.{f}": (4096, 8) for i in range(4) for f in "AB"}
    layout = Layout.from_shapes(shapes, 64)
    codec = RandomProjectionCodec(layout, layout.num_coords // 64)
    state = {k: torch.randn(s) for k, s in shapes.items()}
    z = codec.encode(state)
    out = codec.decode(z)
    x, y = layout.to_vector(state), layout.to_vector(out)
    assert z.shape == (layout.num_coords // 64,)
    assert float(y.norm() ** 2 / x.norm() ** 2) == pytest.approx(1 / 64, rel=0.2)
    assert float(z.norm() / x.norm()) == pytest.approx(1.0, rel=0.1)


def test_make_codec_errors(trained):
    with pytest.raises(FedloraError):
        make_codec("zip", trained=trained)
    with pytest.raises(FedloraError):
        make_codec("ae", layout=trained.layout)
    with pytest.raises(FedloraError):
        make_codec("random-projection", layout=trained.layout)
    with pytest.raises(FedloraError):
        make_codec("constant-mean", layout=trained.layout)
    with pytest.raises(FedloraError):
        make_codec("identity")


# -- checkpoints -----------------------------------------------------------------------------------------------


def test_checkpoint_round_trip(trained, tmp_path):
    path = tmp_path / "ae.safetensors"
    version = save_checkpoint(path, trained)
    assert version == ae_version(trained) and version.startswith("ae-")
    assert [p.name for p in tmp_path.iterdir()] == ["ae.safetensors"]  # no temporary file left
    loaded, loaded_version = load_checkpoint(path)
    assert loaded_version == version == ae_version(loaded)
    assert loaded.config == trained.config and loaded.layout == trained.layout
    assert loaded.history == trained.history
    a, b = make_codec("ae", trained=trained), make_codec("ae", trained=loaded)
    assert a.version == b.version == version
    state = _increment()
    z = a.encode(state)
    assert torch.equal(b.encode(state), z)
    da, db = a.decode(z), b.decode(z)
    assert all(torch.equal(da[k], db[k]) for k in SHAPES)


def test_checkpoint_refuses_to_overwrite(trained, tmp_path):
    path = tmp_path / "ae.safetensors"
    path.write_bytes(b"keep me")
    with pytest.raises(FedloraError, match="exists"):
        save_checkpoint(path, trained)
    assert path.read_bytes() == b"keep me"
    save_checkpoint(path, trained, overwrite=True)
    assert load_checkpoint(path)[1] == ae_version(trained)


def test_version_is_reproducible_and_changes_with_the_weights(trained, stats):
    same = train_autoencoder(
        trained.config, trained.layout, [stats], TrainConfig(steps=3, lr=1e-2, samples=2)
    )
    assert ae_version(same) == ae_version(trained)
    other = train_autoencoder(
        trained.config, trained.layout, [stats], TrainConfig(steps=3, lr=1e-2, samples=2, seed=1)
    )
    assert ae_version(other) != ae_version(trained)


def test_corrupt_or_foreign_files_are_refused(trained, tmp_path):
    good = tmp_path / "good.safetensors"
    save_checkpoint(good, trained)
    raw = good.read_bytes()

    flipped = bytearray(raw)
    flipped[-5] ^= 0xFF  # inside the tensor data: readable, but the content no longer matches the version
    cases = {
        "flipped": bytes(flipped),
        "truncated": raw[: len(raw) // 2],
        "garbage": b"\x00\x01not a checkpoint" * 10,
        "empty": b"",
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(FedloraError):
            load_checkpoint(tmp_path / name)

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, foreign, metadata={"format": "pt"})
    with pytest.raises(FedloraError, match="not a"):
        load_checkpoint(foreign)
    wrong_layout = tmp_path / "wrong.safetensors"
    with safe_open(good, "pt") as f:
        meta = dict(f.metadata())
    meta["layout"] = json.dumps({"format": "fedlora-layout/1"})
    save_file(load_file(good), wrong_layout, metadata=meta)
    with pytest.raises(FedloraError):
        load_checkpoint(wrong_layout)
    with pytest.raises(FedloraError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.safetensors")
    assert meta["format"] == CHECKPOINT_FORMAT


# -- pca: a basis fitted on (public) increments ---------------------------------------------------------
def _low_rank_samples(layout: Layout, n: int, rank: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples ``m + U c`` (``U: (D, rank)``), plus 2 % isotropic noise, and the ``(D, rank)`` U."""
    g = torch.Generator().manual_seed(seed)
    D = layout.num_coords
    basis = torch.randn(D, rank, generator=g, dtype=torch.float64)
    mean = torch.randn(D, generator=g, dtype=torch.float64)
    coefficients = 3 * torch.randn(n, rank, generator=g, dtype=torch.float64)
    noise = 0.02 * torch.randn(n, D, generator=g, dtype=torch.float64)
    return mean + coefficients @ basis.T + noise, basis


def test_pca_fits_the_subspace_numpy_finds():
    layout = Layout.from_shapes(SHAPES, 4)
    samples, _ = _low_rank_samples(layout, 40, 6)
    codec = fit_pca(layout, samples, 8)
    q = codec.basis.double()
    torch.testing.assert_close(q.T @ q, torch.eye(8, dtype=torch.float64), atol=1e-6, rtol=0)
    # Independent construction: the mean direction, then numpy's eigenvectors of the covariance of
    # the samples with that direction removed.
    x = samples.numpy()
    m = x.mean(0)
    u0 = m / np.linalg.norm(m)
    c = (x - m) - np.outer((x - m) @ u0, u0)
    _, vecs = np.linalg.eigh(c.T @ c)
    ref = np.column_stack([u0, vecs[:, ::-1][:, :7]])
    np.testing.assert_allclose(q.numpy() @ q.numpy().T, ref @ ref.T, atol=1e-5)


def test_pca_is_linear_exact_on_its_subspace_and_captures_what_random_projection_does_not():
    layout = Layout.from_shapes(SHAPES, 4)
    samples, _ = _low_rank_samples(layout, 60, 5)
    codec = fit_pca(layout, samples, 6)
    inside = layout.from_vector(codec.basis @ torch.randn(6))
    torch.testing.assert_close(layout.to_vector(codec.decode(codec.encode(inside))), layout.to_vector(inside))
    z = codec.encode(inside)
    torch.testing.assert_close(codec.encode({k: 2.5 * v for k, v in inside.items()}), 2.5 * z)
    assert abs(float(z.norm()) - float(layout.to_vector(inside).norm())) < 1e-4  # a latent clip = a clip
    projection = RandomProjectionCodec(layout, 6, seed=1)
    for x in samples[:3].float():  # the fitted distribution: pca keeps ~all the energy, random ~k/D
        state = layout.from_vector(x)
        kept = float(layout.to_vector(codec.decode(codec.encode(state))).norm() ** 2 / x.norm() ** 2)
        rand = float(
            layout.to_vector(projection.decode(projection.encode(state))).norm() ** 2 / x.norm() ** 2
        )
        assert kept > 0.99 and rand < 0.2


@pytest.mark.parametrize(
    "k, n, message",
    [(0, 10, "must be in"), (10**6, 10, "must be in"), (11, 10, "exceeds the 10 public increments")],
)
def test_pca_refuses_sizes_it_cannot_fit(k, n, message):
    layout = Layout.from_shapes(SHAPES, 4)
    with pytest.raises(FedloraError, match=message):
        fit_pca(layout, _low_rank_samples(layout, n, 3)[0], k)
