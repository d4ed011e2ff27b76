"""Training the gradient autoencoder (DR-Encoder, server side), on one of two priors.

- ``gaussian`` (the paper): each step draws ``samples`` synthetic adapters ``X ~ N(m, s²)`` from one
  statistics set (the sets, e.g. one per client and local epoch, are visited in turn).
- ``public``: each step draws ``samples`` of a fixed set of real increments (the server's, computed on
  public data: server/public_prior.py), with replacement; the statistics are their empirical moments
  (:func:`autoencoder.synthetic.empirical_stats`), used for the scale map and the prior mean only.

The draws are tiled into images, divided by the prior's scale map (:mod:`autoencoder.normalise`), and
``Dec∘Enc`` is fitted with Adam. The loss (MSE, or Charbonnier ``sqrt(d² + ε²)``) is averaged over real
entries only: padding pixels do not count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from autoencoder.layout import Layout
from autoencoder.normalise import NORMALISATIONS, mean_images, scale_map
from autoencoder.synthetic import Stats, check_stats, prior_moments, sample_gradients
from autoencoder.uformer import AeConfig, Uformer
from common.errors import FedloraError

LOSSES = ("mse", "charbonnier")
#: A batch of ``n`` adapters for step ``i``: ``draw(i, n) -> {name: (n, d, r)}`` float32.
Draw = Callable[[int, int], dict[str, Tensor]]
#: ``raw``: the latent is the encoder's output, decoded as is (the paper). ``homogeneous``: the latent is
#: rescaled to the increment's norm and decoded positively homogeneously (:func:`calibrate_latent`).
LATENT_MODES = ("raw", "homogeneous")
CALIBRATION_DRAWS = 16


@dataclass(frozen=True)
class TrainConfig:
    """``samples``: synthetic adapters per step (each gives ``num_images`` images); ``lr``: Adam step size
    (default: CG-FedLLM's 2e-4); ``loss``: ``mse`` or ``charbonnier`` (ε = ``charbonnier_eps``), measured on
    the normalised images; ``normalise``: ``none``, ``image`` or ``factor`` (:mod:`autoencoder.normalise`);
    ``seed``: model initialisation and synthetic draws; ``latent``: one of :data:`LATENT_MODES`."""

    steps: int = 300
    samples: int = 4
    lr: float = 2e-4
    loss: str = "mse"
    charbonnier_eps: float = 1e-3
    normalise: str = "image"
    seed: int = 0
    latent: str = "raw"

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise FedloraError(f"unknown loss '{self.loss}'; choose one of {', '.join(LOSSES)}")
        if self.normalise not in NORMALISATIONS:
            raise FedloraError(
                f"unknown normalisation '{self.normalise}'; choose one of {', '.join(NORMALISATIONS)}"
            )
        if self.latent not in LATENT_MODES:
            raise FedloraError(
                f"unknown latent mode '{self.latent}'; choose one of {', '.join(LATENT_MODES)}"
            )
        if self.steps < 0 or self.samples < 1 or self.lr <= 0:
            raise FedloraError(f"invalid training config {self}")


@dataclass
class TrainedAe:
    """A trained autoencoder with what it needs to encode an adapter: its layout and the scale map.

    ``scale``, ``mean``: ``(num_images, 1, H, W)``; ``mean`` is the prior's ``E[X]`` in raw units.
    ``history``: JSON-serialisable training record (``loss`` per step, the train config).
    ``latent_gain`` g multiplies the encoder's output to give the latent; ``latent_norm`` ρ > 0 makes the
    decode positively homogeneous at that norm (encoder units), 0 decodes as is (:func:`calibrate_latent`).
    """

    config: AeConfig
    layout: Layout
    model: Uformer
    scale: Tensor
    mean: Tensor
    normalise: str
    history: dict = field(default_factory=dict)
    latent_gain: float = 1.0
    latent_norm: float = 0.0

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
    samples: Tensor | None = None,
) -> TrainedAe:
    """Build a :class:`Uformer` (initialised from ``train.seed``) and fit it; returns it in eval mode.

    ``samples``: ``(n, D)`` real increments in ``layout``'s vector order (the ``public`` prior), drawn
    instead of synthetic gradients; ``stats_list`` should then be ``[empirical_stats(layout, samples)]``."""
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
    draw = _drawer(layout, stats_list, samples, generator)
    opt = torch.optim.Adam(model.parameters(), lr=train.lr)
    losses = []
    model.train()
    for step in range(train.steps):
        x = layout.to_images(draw(step, train.samples)) / scales
        loss = reconstruction_loss(model(x), x, mask, train.loss, train.charbonnier_eps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    model.eval()
    history = {"loss": torch.stack(losses).tolist() if losses else [], "train": asdict(train)}
    mean = mean_images(layout, stats_list).to(device)
    trained = TrainedAe(config, layout, model, scale, mean, train.normalise, history)
    if train.latent == "homogeneous":
        trained.latent_gain, trained.latent_norm = calibrate_latent(trained, stats_list, draw)
        history["latent"] = {"gain": trained.latent_gain, "norm": trained.latent_norm}
    return trained


def loss_ends(trained: TrainedAe, last: int = 10) -> tuple[float | None, float | None]:
    """The first training loss and the mean of the ``last`` ones (``None`` when it took no step)."""
    losses = trained.history.get("loss", [])
    if not losses:
        return None, None
    tail = losses[-last:]
    return float(losses[0]), float(sum(tail) / len(tail))


def _drawer(layout: Layout, stats_list: Sequence[Stats], samples: Tensor | None, generator) -> Draw:
    """Synthetic draws from the statistics sets in turn, or draws of ``samples`` rows with replacement."""
    if samples is None:
        return lambda i, n: sample_gradients(stats_list[i % len(stats_list)], layout.shapes, n, generator)
    if samples.ndim != 2 or samples.shape[1] != layout.num_coords or len(samples) == 0:
        raise FedloraError(
            f"autoencoder samples must be (n >= 1, {layout.num_coords}), got {tuple(samples.shape)}"
        )
    rows = samples.float()

    def draw(_i: int, n: int) -> dict[str, Tensor]:
        idx = torch.randint(len(rows), (n,), generator=generator, device=generator.device).cpu()
        parts = [layout.from_vector(rows[j]) for j in idx.tolist()]
        return {k: torch.stack([p[k] for p in parts]).to(generator.device) for k in layout.names}

    return draw


@torch.no_grad()
def calibrate_latent(
    trained: TrainedAe,
    stats_list: Sequence[Stats],
    draw: Draw,
    draws: int = CALIBRATION_DRAWS,
) -> tuple[float, float]:
    """``(g, ρ)`` for the ``homogeneous`` latent, from ``draws`` adapters of ``draw`` (the prior's).

    ``ρ``: the mean norm of ``Enc(x / scale)`` over whole adapters; ``g = ν / ρ`` with ``ν = sqrt(Σ E[X²])``
    the prior's expected increment norm (raw units), so that a latent ``g · Enc(·)`` is about as long as
    the increment it encodes and a clip to C shrinks both alike. The decode of a latent ``z`` is then
    ``(‖u‖ / ρ) · scale · Dec(ρ u / ‖u‖)`` with ``u = z / g``: decode(c z) = c decode(z) for c > 0, as for a
    linear codec, so a client's clip factor or the average of several latents scales the decoded
    increment instead of feeding the decoder a latent of a length it never saw in training.
    """
    layout, model = trained.layout, trained.model
    _, second = prior_moments(stats_list, layout.shapes)
    nu = float(sum(v.double().sum() for v in second.values()).sqrt())
    norms = []
    for i in range(draws):
        x = layout.to_images({k: v[0] for k, v in draw(i, 1).items()}) / trained.scale
        norms.append(float(model.encode(x).norm()))
    rho = sum(norms) / len(norms)
    if not (rho > 0 and nu > 0):
        raise FedloraError("cannot calibrate the latent: the prior or the encoder output is all zero")
    return nu / rho, rho
