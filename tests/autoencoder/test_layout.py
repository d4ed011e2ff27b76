"""Tiling layout: exact round trips, the documented placement, JSON, and clear errors."""

import json

import pytest
import torch

from autoencoder.layout import Layout
from common.errors import FedloraError

SHAPES = {
    "l0.q.A": (7, 3),
    "l0.q.B": (13, 3),
    "l0.v.A": (5, 2),
    "l0.v.B": (13, 2),
    "l1.q.A": (7, 3),
    "l1.q.B": (13, 3),
    "head.weight": (2, 13),
}
FACTORS = {k: v for k, v in SHAPES.items() if k != "head.weight"}


pytestmark = pytest.mark.usefixtures("one_thread")


def _state(shapes=SHAPES, seed=0, dtype=torch.float32, batch=()):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn((*batch, *s), generator=g, dtype=dtype) for k, s in shapes.items()}


@pytest.mark.parametrize(
    ("multiple", "width", "max_height"),
    [(1, None, None), (4, None, None), (4, 4, None), (8, 16, None), (2, 6, 5), (4, 4, 8)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_round_trip_is_bit_exact(multiple, width, max_height, dtype):
    layout = Layout.from_shapes(SHAPES, multiple, width, max_height)
    state = _state(dtype=dtype)
    images = layout.to_images(state)
    assert images.shape == layout.image_shape and images.dtype == dtype
    assert layout.height % multiple == 0 and layout.width % multiple == 0
    back = layout.from_images(images)
    assert set(back) == set(FACTORS)
    for name in FACTORS:
        assert back[name].shape == state[name].shape
        assert torch.equal(back[name], state[name]), name
    # every real entry is somewhere, padding is zero
    assert int(layout.mask().sum()) == layout.num_coords == sum(d * r for d, r in FACTORS.values())
    assert torch.count_nonzero(images * (1 - layout.mask())) == 0


def test_several_images_when_height_is_capped():
    layout = Layout.from_shapes(SHAPES, 4, width=4, max_height=8)
    assert layout.num_images > 1 and layout.height == 8
    state = _state()
    back = layout.from_images(layout.to_images(state))
    assert all(torch.equal(back[k], state[k]) for k in FACTORS)


def test_documented_placement():
    """``F: (d, r)`` → ``Fᵀ`` rank-rows, each wrapped over ``ceil(d / width)`` rows of ``width`` pixels."""
    f = torch.arange(1.0, 11.0).reshape(5, 2)  # d = 5, r = 2
    g = torch.full((3, 1), -1.0)
    layout = Layout.from_shapes({"m.A": (5, 2), "m.B": (3, 1)}, multiple=4, width=4)
    img = layout.to_images({"m.A": f, "m.B": g})[0, 0]
    assert img.shape == (8, 4)
    assert img[0].tolist() == f[:4, 0].tolist() and img[1].tolist() == [f[4, 0], 0, 0, 0]
    assert img[2].tolist() == f[:4, 1].tolist() and img[3].tolist() == [f[4, 1], 0, 0, 0]
    assert img[4].tolist() == [-1, -1, -1, 0]
    assert img[5:].abs().sum() == 0
    assert [t.row for t in layout.tiles] == [0, 4] and [t.wraps for t in layout.tiles] == [2, 1]


def test_default_width_is_the_widest_with_little_padding():
    # SmolLM2-like, 30 layers: q.A, q.B, v.B have 576 rows, v.A 192; width 64 pads least (0.4%),
    # 192 pads 1.3% and is accepted as wider, 576 pads 20% (v.A) and is not
    shapes = {}
    for i in range(30):
        shapes |= {f"{i}.q.A": (576, 8), f"{i}.q.B": (576, 8), f"{i}.v.A": (192, 8), f"{i}.v.B": (576, 8)}
    layout = Layout.from_shapes(shapes, 64)
    assert layout.width == 192
    assert layout.num_pixels <= 1.02 * layout.num_coords
    assert Layout.from_shapes(shapes, 64, width=576).num_pixels > 1.19 * layout.num_coords


def test_batched_images_are_sample_major():
    layout = Layout.from_shapes(SHAPES, 4, width=4, max_height=8)
    batch = _state(batch=(3,))
    images = layout.to_images(batch)
    n = layout.num_images
    assert images.shape[0] == 3 * n
    for i in range(3):
        single = {k: v[i] for k, v in batch.items()}
        assert torch.equal(images[i * n : (i + 1) * n], layout.to_images(single))
    back = layout.from_images(images, batched=True)
    assert all(torch.equal(back[k], batch[k]) for k in FACTORS)


def test_vector_round_trip():
    layout = Layout.from_shapes(SHAPES, 4)
    state = _state()
    v = layout.to_vector(state)
    assert v.shape == (layout.num_coords,)
    back = layout.from_vector(v)
    assert all(torch.equal(back[k], state[k]) for k in FACTORS)


def test_json_round_trip():
    layout = Layout.from_shapes(SHAPES, 4, width=8, max_height=12)
    text = layout.to_json()
    data = json.loads(text)
    assert (
        data["width"] == 8 and data["multiple"] == 4 and [t["name"] for t in data["tiles"]] == list(FACTORS)
    )
    again = Layout.from_json(text)
    assert again == layout
    state = _state()
    assert torch.equal(again.to_images(state), layout.to_images(state))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda d: d["tiles"][1].update(row=d["tiles"][1]["row"] + 1),
        lambda d: d.update(height=d["height"] + 4),
        lambda d: d["tiles"][0].update(shape=[7]),
        lambda d: d.update(format="other/1"),
        lambda d: d.pop("tiles"),
    ],
)
def test_json_inconsistent_or_foreign_is_refused(tamper):
    data = json.loads(Layout.from_shapes(SHAPES, 4).to_json())
    tamper(data)
    with pytest.raises(FedloraError):
        Layout.from_json(json.dumps(data))


def test_json_garbage_is_refused():
    with pytest.raises(FedloraError):
        Layout.from_json("{not json")
    with pytest.raises(FedloraError):
        Layout.from_json("[1, 2]")


def test_mismatched_state_is_refused():
    layout = Layout.from_shapes(SHAPES, 4)
    state = _state()
    missing = {k: v for k, v in state.items() if k != "l0.v.B"}
    with pytest.raises(FedloraError, match="missing"):
        layout.to_images(missing)
    with pytest.raises(FedloraError, match="unknown"):
        layout.to_images({**state, "l9.q.A": torch.zeros(7, 3)})
    with pytest.raises(FedloraError, match="shape"):
        layout.to_images({**state, "l0.q.A": torch.zeros(3, 7)})
    with pytest.raises(FedloraError, match="batch"):
        layout.to_images({**state, "l0.q.A": torch.zeros(2, 7, 3)})
    with pytest.raises(FedloraError):
        layout.from_vector(torch.zeros(layout.num_coords + 1))


def test_mismatched_images_are_refused():
    layout = Layout.from_shapes(SHAPES, 4, width=4, max_height=8)
    n, _, h, w = layout.image_shape
    for bad in (
        torch.zeros(n, 1, h, w + 4),
        torch.zeros(n, 2, h, w),
        torch.zeros(n, h, w),
        torch.zeros(n + 1, 1, h, w),
    ):
        with pytest.raises(FedloraError):
            layout.from_images(bad)
    with pytest.raises(FedloraError):
        layout.from_images(torch.zeros(2 * n, 1, h, w))  # a batch needs batched=True
    with pytest.raises(FedloraError):
        layout.from_images(torch.zeros(2 * n + 1, 1, h, w), batched=True)


def test_bad_shapes_are_refused():
    with pytest.raises(FedloraError):
        Layout.from_shapes({"head.weight": (2, 3)}, 4)
    with pytest.raises(FedloraError):
        Layout.from_shapes({"x.A": (2, 3, 4)}, 4)
    with pytest.raises(FedloraError):
        Layout.from_shapes(FACTORS, 4, width=6)
    with pytest.raises(FedloraError):
        Layout.from_shapes(FACTORS, 0)
