"""Uformer gradient autoencoder (DR-Encoder, paper Table 7), with no encoder→decoder skip connections.

Channels ``c = (c_0, …, c_k)`` (:attr:`AeConfig.channels`, ``k = num_down``)::

    encode  x: (B, 1, H, W) → conv3×3 1→c_0 → k × [LeakyReLU, conv3×3 stride 2 c_i→c_{i+1}]
            → num_blocks Uformer blocks at c_k → z: (B, c_k, H/2^k, W/2^k)
    decode  z → num_blocks Uformer blocks → k × transposed conv3×3 stride 2 c_{i+1}→c_i (LeakyReLU between)
            → conv7×7 c_0→1 → x̂: (B, 1, H, W)

A Uformer block is two LeWin blocks, the second with shifted windows. A LeWin block (Wang et al., CVPR 2022)
works on a channels-last map ``(B, H, W, C)``::

    x = x + W-MSA(LN(x))     multi-head self-attention inside w×w windows, relative position bias
    x = x + LeFF(LN(x))      linear C→hC → GELU → depth-wise 3×3 conv → GELU → linear hC→C

Maps not divisible by the window are zero-padded to a multiple of it; padded tokens are masked out as keys,
so they never change a real token. A map that fits in one window along an axis is not shifted along it.
Uformer's decoder "modulator" embedding is left out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from common.errors import FedloraError


@dataclass(frozen=True)
class AeConfig:
    """Depth and width. ``channels[i] = min(base_channels · growth**i, max_channels)``, ``i = 0..num_down``."""

    num_down: int = 6
    base_channels: int = 1
    growth: int = 2
    max_channels: int = 64
    num_blocks: int = 3
    heads: int = 2
    window: int = 8
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        if self.num_down < 0 or self.num_blocks < 0 or self.window < 1 or self.mlp_ratio <= 0:
            raise FedloraError(f"invalid autoencoder config {self}")
        if min(self.base_channels, self.growth, self.max_channels, self.heads) < 1:
            raise FedloraError(f"invalid autoencoder config {self}")
        if self.num_blocks and self.channels[-1] % self.heads:
            raise FedloraError(f"latent channels {self.channels[-1]} are not divisible by heads {self.heads}")

    @property
    def channels(self) -> tuple[int, ...]:
        return tuple(
            min(self.base_channels * self.growth**i, self.max_channels) for i in range(self.num_down + 1)
        )

    @property
    def downsample(self) -> int:
        """Total downsampling factor ``2**num_down``: image sides must be multiples of it."""
        return 2**self.num_down

    @classmethod
    def tiny(cls) -> AeConfig:
        """Trains on a 2-core CPU in minutes: 4 stages 1→2→4→8→16 (latent 1/16 of the pixels), 1+1 blocks."""
        return cls(num_down=4, max_channels=16, num_blocks=1, heads=2, window=4, mlp_ratio=2.0)

    @classmethod
    def tiny64(cls) -> AeConfig:
        """:meth:`tiny` with a fifth stage at 16 channels: latent 1/64 of the pixels."""
        return cls(num_down=5, max_channels=16, num_blocks=1, heads=2, window=4, mlp_ratio=2.0)

    @classmethod
    def paper(cls) -> AeConfig:
        """DR-Encoder Table 7 (docs/design.md §6): 6 stages 1→2→…→64 (latent 1/64 of the pixels),
        3 Uformer blocks each side.

        The paper's best variant is 7 down + 6 Uformer blocks + 7 up: :meth:`paper_best`.
        """
        return cls(num_down=6, max_channels=64, num_blocks=3, heads=2, window=8, mlp_ratio=4.0)

    @classmethod
    def paper_best(cls) -> AeConfig:
        """7 stages, 6 Uformer blocks each side; channels assumed to keep doubling (1→…→128)."""
        return cls(num_down=7, max_channels=128, num_blocks=6, heads=4, window=8, mlp_ratio=4.0)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AeConfig:
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) - names:
            raise FedloraError(f"bad autoencoder config {data!r}")
        return cls(**data)


# -- windows -------------------------------------------------------------------------------------------------


def relative_position_index(window: int) -> Tensor:
    """``(w², w²)`` long: bias-table row of the offset ``(Δy, Δx)`` from key ``q`` to query ``p`` (row-major tokens),
    ``(Δy + w − 1)·(2w − 1) + (Δx + w − 1)`` as in Swin / Uformer."""
    coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
    rel = coords[:, :, None] - coords[:, None, :] + (window - 1)  # (2, w², w²), each in [0, 2w − 2]
    return rel[0] * (2 * window - 1) + rel[1]


def window_partition(x: Tensor, window: int) -> Tensor:
    """``(B, H, W, C)`` → ``(B · nW, w², C)``, windows in row-major order; ``H, W`` multiples of ``w``."""
    B, H, W, C = x.shape
    x = x.view(B, H // window, window, W // window, window, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, window * window, C)


def window_reverse(windows: Tensor, window: int, H: int, W: int) -> Tensor:
    """Inverse of :func:`window_partition`: ``(B · nW, w², C)`` → ``(B, H, W, C)``."""
    C = windows.shape[-1]
    x = windows.view(-1, H // window, W // window, window, window, C).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, H, W, C)


def _regions(size: int, window: int, shift: int) -> list[slice]:
    # After a cyclic shift by −s, the last window mixes the map's first s lines with its last w − s (Swin).
    if shift == 0:
        return [slice(0, size)]
    return [slice(0, size - window), slice(size - window, size - shift), slice(size - shift, size)]


def window_mask(
    H: int, W: int, window: int, shift: tuple[int, int], device: torch.device | None = None
) -> Tensor | None:
    """Additive attention mask ``(nW, w², w²)`` (0 or −inf) for an ``H×W`` map padded to multiples of ``w`` and
    cyclically shifted by ``−shift``: a query sees keys of its own pre-shift region that are not padding (and
    always itself). ``None`` when nothing is masked."""
    Hp, Wp = math.ceil(H / window) * window, math.ceil(W / window) * window
    if shift == (0, 0) and (Hp, Wp) == (H, W):
        return None
    region = torch.zeros(Hp, Wp, device=device)
    for i, hs in enumerate(_regions(Hp, window, shift[0])):
        for j, ws in enumerate(_regions(Wp, window, shift[1])):
            region[hs, ws] = 3 * i + j
    valid = torch.zeros(Hp, Wp, device=device)
    valid[:H, :W] = 1
    valid = torch.roll(valid, (-shift[0], -shift[1]), (0, 1))
    region = window_partition(region[None, :, :, None], window)[..., 0]  # (nW, w²)
    valid = window_partition(valid[None, :, :, None], window)[..., 0] > 0
    allowed = (region[:, :, None] == region[:, None, :]) & valid[:, None, :]
    allowed |= torch.eye(window * window, dtype=torch.bool, device=device)
    return torch.zeros(allowed.shape, device=device).masked_fill(~allowed, float("-inf"))


class WindowAttention(nn.Module):
    """Multi-head self-attention over the ``w²`` tokens of each window, plus a learned relative position bias
    (a ``((2w − 1)², heads)`` table)."""

    def __init__(self, dim: int, heads: int, window: int) -> None:
        super().__init__()
        self.heads, self.window = heads, window
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        nn.init.trunc_normal_(self.bias_table, std=0.02)
        self.register_buffer("bias_index", relative_position_index(window), persistent=False)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``x: (B · nW, w², C)``, ``mask: (nW, w², w²)`` additive or None → ``(B · nW, w², C)``."""
        Bn, N, C = x.shape
        q, k, v = self.qkv(x).view(Bn, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        att = (q * self.scale) @ k.transpose(-2, -1)  # (B · nW, heads, N, N)
        att = att + self.bias_table[self.bias_index].permute(2, 0, 1)
        if mask is not None:
            nW = mask.shape[0]
            att = (att.view(Bn // nW, nW, self.heads, N, N) + mask[None, :, None]).view(Bn, self.heads, N, N)
        y = att.softmax(-1) @ v  # (B · nW, heads, N, C / heads)
        return self.proj(y.transpose(1, 2).reshape(Bn, N, C))


class LeFF(nn.Module):
    """Locally-enhanced feed-forward on ``(B, H, W, C)``: linear → GELU → depth-wise 3×3 conv → GELU → linear."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.dwconv(x.permute(0, 3, 1, 2))).permute(0, 2, 3, 1)
        return self.fc2(x)


class LeWinBlock(nn.Module):
    """``x + W-MSA(LN x)``, then ``x + LeFF(LN x)``, on ``(B, H, W, C)``; ``shifted`` rolls windows by ``w // 2``."""

    def __init__(self, dim: int, heads: int, window: int, shifted: bool, mlp_ratio: float) -> None:
        super().__init__()
        self.window, self.shifted = window, shifted
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, heads, window)
        self.norm2 = nn.LayerNorm(dim)
        self.leff = LeFF(dim, max(1, round(dim * mlp_ratio)))

    def shift(self, H: int, W: int) -> tuple[int, int]:
        """Shift per axis: ``w // 2`` when shifted and the padded axis spans more than one window, else 0."""
        half = self.window // 2 if self.shifted else 0
        return (half if self.window < H else 0, half if self.window < W else 0)

    def forward(self, x: Tensor) -> Tensor:
        H, W = x.shape[1:3]
        w = self.window
        Hp, Wp = math.ceil(H / w) * w, math.ceil(W / w) * w
        sh, sw = self.shift(H, W)
        h = F.pad(self.norm1(x), (0, 0, 0, Wp - W, 0, Hp - H))
        h = torch.roll(h, (-sh, -sw), (1, 2))
        h = self.attn(window_partition(h, w), window_mask(H, W, w, (sh, sw), x.device))
        h = torch.roll(window_reverse(h, w, Hp, Wp), (sh, sw), (1, 2))[:, :H, :W]
        x = x + h
        return x + self.leff(self.norm2(x))


def uformer_block(dim: int, heads: int, window: int, mlp_ratio: float) -> nn.Sequential:
    """Two LeWin blocks: regular windows, then shifted windows."""
    return nn.Sequential(
        LeWinBlock(dim, heads, window, False, mlp_ratio), LeWinBlock(dim, heads, window, True, mlp_ratio)
    )


# -- autoencoder ---------------------------------------------------------------------------------------------


class Uformer(nn.Module):
    """Gradient autoencoder; see the module docstring. Images ``(B, 1, H, W)``, ``H, W`` multiples of ``2**num_down``."""

    def __init__(self, config: AeConfig) -> None:
        super().__init__()
        self.config = config
        c, k = config.channels, config.num_down

        def block() -> nn.Sequential:
            return uformer_block(c[-1], config.heads, config.window, config.mlp_ratio)

        self.in_conv = nn.Conv2d(1, c[0], 3, padding=1)
        self.down = nn.ModuleList(nn.Conv2d(c[i], c[i + 1], 3, stride=2, padding=1) for i in range(k))
        self.enc_blocks = nn.Sequential(*(block() for _ in range(config.num_blocks)))
        self.dec_blocks = nn.Sequential(*(block() for _ in range(config.num_blocks)))
        self.up = nn.ModuleList(
            nn.ConvTranspose2d(c[i + 1], c[i], 3, stride=2, padding=1, output_padding=1)
            for i in reversed(range(k))
        )
        self.out_conv = nn.Conv2d(c[0], 1, 7, padding=3)
        self.apply(_init_linear)

    def latent_shape(self, H: int, W: int) -> tuple[int, int, int]:
        """``(c_k, H / 2^k, W / 2^k)`` for images ``(1, H, W)``."""
        f = self.config.downsample
        if H % f or W % f or min(H, W) < 1:
            raise FedloraError(f"image {H}x{W} is not a multiple of the autoencoder's downsampling {f}")
        return (self.config.channels[-1], H // f, W // f)

    def encode(self, x: Tensor) -> Tensor:
        """``x: (B, 1, H, W)`` → ``z: (B, c_k, H / 2^k, W / 2^k)``."""
        if x.dim() != 4 or x.shape[1] != 1:
            raise FedloraError(f"autoencoder input must be (B, 1, H, W), got {tuple(x.shape)}")
        self.latent_shape(*x.shape[2:])
        x = self.in_conv(x)
        for conv in self.down:
            x = conv(F.leaky_relu(x, 0.2))
        return self.enc_blocks(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()

    def decode(self, z: Tensor) -> Tensor:
        """``z: (B, c_k, h, w)`` → ``x̂: (B, 1, h · 2^k, w · 2^k)``."""
        if z.dim() != 4 or z.shape[1] != self.config.channels[-1]:
            raise FedloraError(f"latent must be (B, {self.config.channels[-1]}, h, w), got {tuple(z.shape)}")
        x = self.dec_blocks(z.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        for i, conv in enumerate(self.up):
            x = conv(x if i == 0 else F.leaky_relu(x, 0.2))
        return self.out_conv(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))


def _init_linear(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):  # Uformer's init: truncated normal weights, zero bias
        nn.init.trunc_normal_(module.weight, std=0.02)
        nn.init.zeros_(module.bias)
