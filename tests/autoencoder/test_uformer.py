"""Uformer autoencoder: shapes through the layout, window attention against a naive reference, training."""

import math

import pytest
import torch

import autoencoder.uformer as uformer
from autoencoder.layout import Layout
from autoencoder.train import TrainConfig, train_autoencoder
from autoencoder.uformer import AeConfig, LeWinBlock, Uformer, relative_position_index, window_mask
from common.errors import FedloraError

ODD = {
    "l0.q.A": (7, 3),
    "l0.q.B": (13, 3),
    "l1.q.A": (7, 3),
    "l1.q.B": (13, 3),
    "l1.v.A": (5, 2),
    "l1.v.B": (13, 2),
}


pytestmark = pytest.mark.usefixtures("one_thread")


def _factors(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) for k, s in shapes.items()}


@pytest.mark.parametrize(
    ("config", "max_height"),
    [
        (AeConfig.tiny(), None),
        (AeConfig.tiny(), 16),
        (
            AeConfig(
                num_down=3, base_channels=2, max_channels=8, num_blocks=1, heads=2, window=3, mlp_ratio=1.5
            ),
            None,
        ),
        (AeConfig(num_down=1, max_channels=4, num_blocks=0), None),
    ],
)
def test_forward_shapes_for_odd_layer_sizes(config, max_height):
    torch.manual_seed(0)
    model = Uformer(config).eval()
    layout = Layout.from_shapes(ODD, config.downsample, max_height=max_height)
    x = layout.to_images(_factors(ODD))
    with torch.no_grad():
        z = model.encode(x)
        y = model.decode(z)
    N, _, H, W = layout.image_shape
    assert z.shape == (N, *model.latent_shape(H, W))
    assert z.shape[1] == config.channels[-1] and z.shape[2:] == (
        H // config.downsample,
        W // config.downsample,
    )
    assert y.shape == x.shape and torch.isfinite(y).all()
    back = layout.from_images(y)
    assert {k: v.shape for k, v in back.items()} == {k: torch.Size(s) for k, s in ODD.items()}


def test_input_not_a_multiple_of_the_downsampling_is_refused():
    model = Uformer(AeConfig.tiny())
    with pytest.raises(FedloraError):
        model.encode(torch.zeros(1, 1, 16, 24))
    with pytest.raises(FedloraError):
        model.encode(torch.zeros(1, 2, 16, 16))
    with pytest.raises(FedloraError):
        model.decode(torch.zeros(1, 3, 1, 1))


def test_configs():
    paper = AeConfig.paper()
    assert paper.channels == (1, 2, 4, 8, 16, 32, 64) and paper.num_blocks == 3 and paper.downsample == 64
    best = AeConfig.paper_best()
    assert best.num_down == 7 and best.num_blocks == 6
    assert AeConfig.from_dict(AeConfig.tiny().to_dict()) == AeConfig.tiny()
    assert AeConfig(num_down=3, base_channels=3, growth=3, max_channels=20).channels == (3, 9, 20, 20)
    with pytest.raises(FedloraError):
        AeConfig(num_down=2, max_channels=4, heads=3)
    with pytest.raises(FedloraError):
        AeConfig.from_dict({"num_down": 2, "depth": 4})


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5])
def test_relative_position_index_matches_brute_force(w):
    index = relative_position_index(w)
    tokens = [(y, x) for y in range(w) for x in range(w)]
    for p, (yp, xp) in enumerate(tokens):
        for q, (yq, xq) in enumerate(tokens):
            assert index[p, q] == (yp - yq + w - 1) * (2 * w - 1) + (xp - xq + w - 1)
    assert index.min() == 0 and index.max() == (2 * w - 1) ** 2 - 1


def _naive_attention(blk: LeWinBlock, x: torch.Tensor) -> torch.Tensor:
    """The attention branch by loops. A token at ``(i, j)`` sits at ``a = (i − s_h) mod H_p`` (likewise ``b``) after
    the cyclic shift; it attends to the real tokens of the same ``w×w`` window that wrapped around the same edges."""
    _, H, W, C = x.shape
    w, attn = blk.window, blk.attn
    Hp, Wp = math.ceil(H / w) * w, math.ceil(W / w) * w
    sh, sw = blk.shift(H, W)
    hd = C // attn.heads
    q, k, v = attn.qkv(blk.norm1(x)).split(C, -1)
    tokens = [(i, j, (i - sh) % Hp, (j - sw) % Wp) for i in range(H) for j in range(W)]
    out = torch.zeros_like(x)
    for i, j, a, b in tokens:
        keys = [
            (i2, j2, a2, b2)
            for i2, j2, a2, b2 in tokens
            if (a // w, b // w) == (a2 // w, b2 // w)
            and (a + sh >= Hp) == (a2 + sh >= Hp)
            and (b + sw >= Wp) == (b2 + sw >= Wp)
        ]
        for head in range(attn.heads):
            sl = slice(head * hd, (head + 1) * hd)
            logits = [
                (q[:, i, j, sl] * k[:, i2, j2, sl]).sum(-1) * hd**-0.5
                + attn.bias_table[(a % w - a2 % w + w - 1) * (2 * w - 1) + (b % w - b2 % w + w - 1), head]
                for i2, j2, a2, b2 in keys
            ]
            p = torch.stack(logits, -1).softmax(-1)
            values = torch.stack([v[:, i2, j2, sl] for i2, j2, _, _ in keys], -2)
            out[:, i, j, sl] = (p[..., None] * values).sum(-2)
    return attn.proj(out)


@pytest.mark.parametrize(
    ("H", "W", "shifted"),
    [(8, 8, False), (8, 8, True), (3, 3, False), (3, 3, True), (5, 6, False), (5, 6, True), (4, 10, True)],
)
def test_lewin_block_equals_naive_per_window_reference(H, W, shifted):
    torch.manual_seed(0)
    blk = LeWinBlock(dim=8, heads=2, window=4, shifted=shifted, mlp_ratio=2.0).eval()
    with torch.no_grad():
        blk.attn.bias_table.normal_(0, 0.5)  # a visible bias, so that a wrong index fails
        x = torch.randn(2, H, W, 8)
        ref = x + _naive_attention(blk, x)
        ref = ref + blk.leff(blk.norm2(ref))
        out = blk(x)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)


def test_shift_is_half_a_window_only_where_there_are_several_windows():
    shifted = LeWinBlock(8, 2, 4, True, 2.0)
    assert shifted.shift(8, 8) == (2, 2) and shifted.shift(4, 10) == (0, 2) and shifted.shift(3, 3) == (0, 0)
    assert LeWinBlock(8, 2, 4, False, 2.0).shift(8, 8) == (0, 0)


def test_shifted_window_mask_blocks_cross_region_attention(monkeypatch):
    torch.manual_seed(0)
    blk = LeWinBlock(dim=8, heads=2, window=4, shifted=True, mlp_ratio=2.0).eval()
    with torch.no_grad():
        for p in blk.parameters():
            p.normal_(0, 0.5)  # O(1) weights, so that any leak is visible
    x = torch.randn(1, 8, 8, 8)

    def moved(at):
        x2 = x.clone()
        x2[0, at[0], at[1]] += torch.randn(8)  # not a constant: LayerNorm would remove that
        with torch.no_grad():
            return (blk(x2)[0, 0, 0] - blk(x)[0, 0, 0]).abs().max().item()

    # After the roll by −2, (0, 0) and (7, 7) share a window but not a region; (1, 1) shares both.
    assert moved((7, 7)) == 0.0
    assert moved((1, 1)) > 1e-2
    mask = window_mask(8, 8, 4, (2, 2))
    assert (
        mask.shape == (4, 16, 16) and torch.isinf(mask).any() and (mask.diagonal(dim1=1, dim2=2) == 0).all()
    )
    monkeypatch.setattr(uformer, "window_mask", lambda *a, **k: None)
    assert moved((7, 7)) > 1e-2  # without the mask the wrapped token leaks in


def test_no_mask_when_nothing_is_masked():
    assert window_mask(8, 8, 4, (0, 0)) is None
    assert window_mask(6, 8, 4, (0, 0)) is not None  # padding keys are masked


def test_tiny_autoencoder_reduces_training_loss():
    layout = Layout.from_shapes(ODD, AeConfig.tiny().downsample)
    g = torch.Generator().manual_seed(0)
    stats = {k: (torch.randn(s, generator=g) * 0.05, torch.full(s, 0.01)) for k, s in ODD.items()}
    trained = train_autoencoder(AeConfig.tiny(), layout, [stats], TrainConfig(steps=30, lr=1e-2, samples=4))
    loss = trained.history["loss"]
    assert len(loss) == 30 and all(math.isfinite(v) for v in loss)
    assert sum(loss[-5:]) / 5 < 0.8 * sum(loss[:5]) / 5
    assert not trained.model.training
