"""Invertible tiling of LoRA factor increments into 2-D gradient images, and back.

Tiling. Factors are taken in the order of the shapes given (module order). A factor ``F: (d, r)``
(``A: (m, r)`` or ``B: (n, r)``) is written as ``Fᵀ: (r, d)``: each of its ``r`` rank-rows becomes
``wraps = ceil(d / width)`` consecutive image rows of ``width`` pixels, zero-padded at the end of the
rank-row. Factors are stacked top to bottom, each starting on a fresh row, so one image row only ever
holds coordinates of one rank component of one factor. The stacked rows are cut into ``num_images``
images of ``height`` rows (global row ``g`` is row ``g % height`` of image ``g // height``); the last
image is zero-padded at the bottom. ``width`` and ``height`` are multiples of ``multiple`` (use
``2**num_down`` of the autoencoder). Default ``width``: the widest multiple of ``multiple`` up to the
largest ``d`` whose padded pixel count is within 10% of the tightest choice (narrow widths waste least,
wide ones keep a rank-row on one image row).

The layout is plain data (names, shapes, first rows, width, height, multiple): :meth:`Layout.to_json`
sends or stores it, :meth:`Layout.from_json` checks it by rebuilding it from its shapes.
Only the ``"<module>.A"`` / ``"<module>.B"`` entries of an adapter state are tiled; dense trainables
(e.g. a classifier head) are not part of the layout and are ignored by :meth:`Layout.to_images`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from common.errors import FedloraError

LAYOUT_FORMAT = "fedlora-layout/1"
FACTOR_SUFFIXES = (".A", ".B")
# Default width: the widest one whose padded size is at most 10% above the tightest width's.
WIDTH_SLACK = 0.1


def is_factor(name: str) -> bool:
    """Whether an adapter-state entry is a LoRA factor (``"<module>.A"`` or ``"<module>.B"``)."""
    return name.endswith(FACTOR_SUFFIXES)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


@dataclass(frozen=True)
class Tile:
    """Where one factor ``(d, r)`` lives: image rows ``row .. row + r * wraps`` (global row index)."""

    name: str
    shape: tuple[int, int]
    row: int
    wraps: int

    @property
    def rows(self) -> int:
        return self.shape[1] * self.wraps


@dataclass(frozen=True)
class Layout:
    """Tiling of named factors into ``num_images`` images ``(1, height, width)``; see the module docstring."""

    tiles: tuple[Tile, ...]
    width: int
    height: int
    num_images: int
    multiple: int

    @classmethod
    def from_shapes(
        cls,
        shapes: Mapping[str, tuple[int, ...]],
        multiple: int,
        width: int | None = None,
        max_height: int | None = None,
    ) -> Layout:
        """Layout for the factor entries of ``shapes`` (other entries are skipped).

        ``width``: pixels per image row, a multiple of ``multiple``; default: the widest multiple of
        ``multiple`` up to ``max d`` whose padded size is within 10% of the tightest width's. ``max_height``: cut
        the rows into several images of at most ``round_up(max_height, multiple)`` rows; default: one image.
        """
        if multiple < 1:
            raise FedloraError(f"layout multiple must be >= 1, got {multiple}")
        factors: dict[str, tuple[int, int]] = {}
        for name, shape in shapes.items():
            if not is_factor(name):
                continue
            if len(shape) != 2 or min(shape) < 1:
                raise FedloraError(
                    f"LoRA factor '{name}' must have a 2-D shape (d, r) >= 1, got {tuple(shape)}"
                )
            factors[name] = (int(shape[0]), int(shape[1]))
        if not factors:
            raise FedloraError("no LoRA factors ('<module>.A' / '<module>.B') to lay out")
        if width is None:
            width = _best_width(factors, multiple, max_height)
        if width < 1 or width % multiple:
            raise FedloraError(f"layout width {width} is not a positive multiple of {multiple}")
        if max_height is not None and max_height < 1:
            raise FedloraError(f"layout max_height must be >= 1, got {max_height}")
        tiles, row = [], 0
        for name, (d, r) in factors.items():
            tile = Tile(name, (d, r), row, math.ceil(d / width))
            tiles.append(tile)
            row += tile.rows
        height = _round_up(row if max_height is None else min(row, max_height), multiple)
        return cls(tuple(tiles), width, height, math.ceil(row / height), multiple)

    # -- sizes -------------------------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiles)

    @property
    def shapes(self) -> dict[str, tuple[int, int]]:
        return {t.name: t.shape for t in self.tiles}

    @property
    def num_coords(self) -> int:
        """Real entries: ``Σ d·r`` over the factors."""
        return sum(t.shape[0] * t.shape[1] for t in self.tiles)

    @property
    def image_shape(self) -> tuple[int, int, int, int]:
        """``(num_images, 1, height, width)``."""
        return (self.num_images, 1, self.height, self.width)

    @property
    def num_pixels(self) -> int:
        return self.num_images * self.height * self.width

    # -- images ------------------------------------------------------------------------------------------
    def to_images(self, state: Mapping[str, Tensor]) -> Tensor:
        """Factors ``(d, r)`` → images ``(num_images, 1, H, W)``.

        Batched factors ``(b, d, r)`` (same ``b`` for all) give ``(b · num_images, 1, H, W)``, sample-major.
        Dtype and device are those of the first factor; non-factor entries are ignored.
        """
        batch = self.check_state(state)
        b = 1 if batch is None else batch
        rows = state[self.tiles[0].name].new_zeros((b, self.num_images * self.height, self.width))
        for t in self.tiles:
            d, r = t.shape
            x = state[t.name].reshape(b, d, r).transpose(1, 2)
            x = F.pad(x, (0, t.wraps * self.width - d))
            rows[:, t.row : t.row + t.rows] = x.reshape(-1, t.rows, self.width)
        return rows.reshape(-1, 1, self.height, self.width)

    def from_images(self, images: Tensor, batched: bool = False) -> dict[str, Tensor]:
        """Inverse of :meth:`to_images`: ``(num_images, 1, H, W)`` → ``{name: (d, r)}``.

        ``batched``: accept ``(b · num_images, 1, H, W)`` and return ``{name: (b, d, r)}``. Padding is dropped.
        """
        n = images.shape[0] if images.dim() == 4 else -1
        if (
            images.dim() != 4
            or tuple(images.shape[1:]) != self.image_shape[1:]
            or n % self.num_images
            or n < 1
        ):
            raise FedloraError(
                f"images of shape {tuple(images.shape)} do not match the layout's {self.image_shape}"
            )
        if not batched and n != self.num_images:
            raise FedloraError(f"expected {self.num_images} images, got {n} (pass batched=True for a batch)")
        rows = images.reshape(n // self.num_images, self.num_images * self.height, self.width)
        out = {}
        for t in self.tiles:
            d, r = t.shape
            x = rows[:, t.row : t.row + t.rows].reshape(-1, r, t.wraps * self.width)[..., :d]
            x = x.transpose(1, 2).contiguous()
            out[t.name] = x if batched else x[0]
        return out

    def mask(self, device: torch.device | str | None = None) -> Tensor:
        """``(num_images, 1, H, W)`` float32: 1 where a real entry lives, 0 on padding."""
        ones = {t.name: torch.ones(t.shape, device=device) for t in self.tiles}
        return self.to_images(ones)

    # -- flat vectors (codecs) ---------------------------------------------------------------------------
    def to_vector(self, state: Mapping[str, Tensor]) -> Tensor:
        """Factors → ``(num_coords,)`` (or ``(b, num_coords)`` if batched): row-major ``(d, r)`` in tile order."""
        batch = self.check_state(state)
        parts = [state[t.name].reshape(1 if batch is None else batch, -1) for t in self.tiles]
        flat = torch.cat([p.to(parts[0].dtype) for p in parts], dim=1)
        return flat[0] if batch is None else flat

    def from_vector(self, vector: Tensor) -> dict[str, Tensor]:
        """Inverse of :meth:`to_vector` for one ``(num_coords,)`` vector."""
        if tuple(vector.shape) != (self.num_coords,):
            raise FedloraError(
                f"vector of shape {tuple(vector.shape)} does not match the layout's ({self.num_coords},)"
            )
        sizes = [t.shape[0] * t.shape[1] for t in self.tiles]
        return {
            t.name: p.reshape(t.shape).clone() for t, p in zip(self.tiles, vector.split(sizes), strict=True)
        }

    def check_state(self, state: Mapping[str, Tensor]) -> int | None:
        """Validate names and shapes (:class:`FedloraError` if wrong); return the batch size, None if unbatched."""
        missing = [n for n in self.names if n not in state]
        extra = [n for n in state if is_factor(n) and n not in self.shapes]
        if missing or extra:
            raise FedloraError(f"factors do not match the layout: missing {missing[:3]}, unknown {extra[:3]}")
        batches = set()
        for t in self.tiles:
            shape = tuple(state[t.name].shape)
            if shape[-2:] != t.shape or len(shape) not in (2, 3):
                raise FedloraError(f"factor '{t.name}' has shape {shape}, the layout expects {t.shape}")
            batches.add(shape[0] if len(shape) == 3 else None)
        if len(batches) != 1:
            raise FedloraError(f"factors mix batch sizes {batches} (None = unbatched)")
        return batches.pop()

    # -- JSON --------------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {
                "format": LAYOUT_FORMAT,
                "width": self.width,
                "height": self.height,
                "num_images": self.num_images,
                "multiple": self.multiple,
                "tiles": [
                    {"name": t.name, "shape": list(t.shape), "row": t.row, "wraps": t.wraps}
                    for t in self.tiles
                ],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Layout:
        """Parse :meth:`to_json` output; rebuilds the layout from its shapes and refuses any inconsistency."""
        try:
            data = json.loads(text)
            if data.get("format") != LAYOUT_FORMAT:
                raise FedloraError(
                    f"not a layout (format {data.get('format')!r}, expected {LAYOUT_FORMAT!r})"
                )
            tiles = tuple(
                Tile(t["name"], (int(t["shape"][0]), int(t["shape"][1])), t["row"], t["wraps"])
                for t in data["tiles"]
            )
            stored = cls(tiles, data["width"], data["height"], data["num_images"], data["multiple"])
            shapes = {t.name: t.shape for t in tiles}
            rebuilt = cls.from_shapes(shapes, stored.multiple, stored.width, stored.height)
        except FedloraError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise FedloraError(f"malformed layout JSON: {exc}") from None
        if rebuilt != stored:
            raise FedloraError("layout JSON is inconsistent (offsets or sizes do not follow from its shapes)")
        return stored


def _best_width(factors: Mapping[str, tuple[int, int]], multiple: int, max_height: int | None) -> int:
    """Widest multiple of ``multiple`` up to ``round_up(max d)`` whose padded size is within
    :data:`WIDTH_SLACK` of the smallest one."""
    pixels = {}
    for width in range(multiple, _round_up(max(d for d, _ in factors.values()), multiple) + 1, multiple):
        rows = sum(r * math.ceil(d / width) for d, r in factors.values())
        height = _round_up(rows if max_height is None else min(rows, max_height), multiple)
        pixels[width] = math.ceil(rows / height) * height * width
    least = min(pixels.values())
    return max(w for w, p in pixels.items() if p <= (1 + WIDTH_SLACK) * least)
