"""Training the gradient autoencoder on synthetic Gaussian gradients (DR-Encoder, server side).

Each step draws ``samples`` synthetic adapters ``X ~ N(m, s²)`` from one statistics set (the sets, e.g. one
per client and local epoch, are visited in turn), tiles them into images, divides by the prior's scale map
(:mod:`autoencoder.normalise`) and fits ``Dec∘Enc`` with Adam. The loss (MSE, or Charbonnier
``sqrt(d² + ε²)``) is averaged over real entries only: padding pixels do not count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from autoencoder.layout import Layout
from autoencoder.normalise import NORMALISATIONS, mean_images, scale_map
from autoencoder.synthetic import Stats, check_stats, sample_gradients
from autoencoder.uformer import AeConfig, Uformer
from common.errors import FedloraError

LOSSES = ("mse", "charbonnier")


@dataclass(frozen=True)
class TrainConfig:
    """``samples``: synthetic adapters per step (each gives ``num_images`` images); ``lr``: Adam step size
    (default: CG-FedLLM's 2e-4); ``loss``: ``mse`` or ``charbonnier`` (ε = ``charbonnier_eps``), measured on
    the normalised images; ``normalise``: ``none``, ``image`` or ``factor`` (:mod:`autoencoder.normalise`);
    ``seed``: model initialisation and synthetic draws."""

    steps: int = 300
    samples: int = 4
    lr: float = 2e-4
    loss: str = "mse"
    charbonnier_eps: float = 1e-3
    normalise: str = "image"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise FedloraError(f"unknown loss '{self.loss}'; choose one of {', '.join(LOSSES)}")
        if self.normalise not in NORMALISATIONS:
            raise FedloraError(
                f"unknown normalisation '{self.normalise}'; choose one of {', '.join(NORMALISATIONS)}"
            )
        if self.steps < 0 or self.samples < 1 or self.lr <= 0:
            raise FedloraError(f"invalid training config {self}")


@dataclass
class TrainedAe:
    """A trained autoencoder with what it needs to encode an adapter: its layout and the scale map.

    ``scale``, ``mean``: ``(num_images, 1, H, W)``; ``mean`` is the prior's ``E[X]`` in raw units.
    ``history``: JSON-serialisable training record (``loss`` per step, the train config).
    """

    config: AeConfig
    layout: Layout
    model: Uformer
    scale: Tensor
    mean: Tensor
    normalise: str
    history: dict = field(default_factory=dict)

    @property
    def latent_shape(self) -> tuple[int, int, int, int]:
        """``(num_images, c_k, H / 2^k, W / 2^k)``."""
        return (self.layout.num_images, *self.model.latent_shape(self.layout.height, self.layout.width))

    @property
    def device(self) -> torch.device:
        return self.scale.device


def reconstruction_loss(
    pred: Tensor, target: Tensor, mask: Tensor, kind: str = "mse", eps: float = 1e-3
) -> Tensor:
    """Mean over ``mask > 0`` pixels of ``d²`` (``mse``) or ``sqrt(d² + eps²)`` (``charbonnier``), ``d = pred − target``."""
    d2 = (pred - target) ** 2
    per_pixel = d2 if kind == "mse" else torch.sqrt(d2 + eps**2)
    return (per_pixel * mask).sum() / mask.sum()


def train_autoencoder(
    config: AeConfig,
    layout: Layout,
    stats_list: Sequence[Stats],
    train: TrainConfig = TrainConfig(),
    device: torch.device | str = "cpu",
) -> TrainedAe:
    """Build a :class:`Uformer` (initialised from ``train.seed``) and fit it; returns it in eval mode."""
    if layout.multiple % config.downsample:
        raise FedloraError(
            f"layout multiple {layout.multiple} is not a multiple of 2**num_down = {config.downsample}"
        )
    if not stats_list:
        raise FedloraError("no statistics to train the autoencoder on")
    for stats in stats_list:
        check_stats(stats, layout.shapes)
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(train.seed)
        model = Uformer(config).to(device)
    scale = scale_map(layout, stats_list, train.normalise).to(device)
    mask = layout.mask(device).repeat(train.samples, 1, 1, 1)
    scales = scale.repeat(train.samples, 1, 1, 1)
    generator = torch.Generator(device=device).manual_seed(train.seed)
    opt = torch.optim.Adam(model.parameters(), lr=train.lr)
    losses = []
    model.train()
    for step in range(train.steps):
        grads = sample_gradients(stats_list[step % len(stats_list)], layout.shapes, train.samples, generator)
        x = layout.to_images(grads) / scales
        loss = reconstruction_loss(model(x), x, mask, train.loss, train.charbonnier_eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    model.eval()
    history = {"loss": torch.stack(losses).tolist() if losses else [], "train": asdict(train)}
    mean = mean_images(layout, stats_list).to(device)
    return TrainedAe(config, layout, model, scale, mean, train.normalise, history)
