"""Can the tiny Uformer learn the public-increment subspace? (docs/dr-encoder.md)

Computes 256 public increments of the ``minilm-rt-xdev`` recipe from the initial adapter, fits pca
(k = 224) and the autoencoder on 224 of them at a few training settings, and prints the mean cosine
of each codec's reconstruction on the 32 held out. Usage: ``python scripts/ae_public_probe.py``
(about 8 minutes on one CPU core; offline, from the packaged assets).
"""

from __future__ import annotations

import time

import torch

from autoencoder.codecs import AeCodec, fit_pca
from autoencoder.layout import Layout, is_factor
from autoencoder.synthetic import empirical_stats
from autoencoder.train import TrainConfig, train_autoencoder
from autoencoder.uformer import AeConfig
from common.presets import preset
from server.bench.codec import errors
from server.evaluation import Evaluator
from server.public_prior import public_increments

SETTINGS = [(2e-4, 300, "image"), (1e-3, 1000, "image"), (1e-3, 1000, "factor")]  # lr, steps, scaling


def mean_cosine(codec, layout: Layout, rows: torch.Tensor) -> float:
    """Mean over ``rows`` of cos(decode(encode(x)), x), as ``fedlora bench codec`` scores it."""
    truths = [layout.from_vector(x) for x in rows]
    return sum(errors(layout, codec.decode(codec.encode(t)), t)["cosine"] for t in truths) / len(rows)


def main() -> None:
    cfg = preset("minilm-rt-xdev", num_clients=100, public_fraction=0.1, public_increments=256).check()
    evaluator = Evaluator(cfg)
    state = evaluator.initial_state()
    shapes = {k: tuple(v.shape) for k, v in state.items() if is_factor(k)}
    layout = Layout.from_shapes(shapes, AeConfig.tiny().downsample)
    samples = public_increments(evaluator, cfg, state, 256, layout)
    train, test = samples[:224], samples[224:]
    pca = fit_pca(Layout.from_shapes(shapes, 1), train, 224)
    print(f"pca k=224: held-out cosine {mean_cosine(pca, layout, test):.3f}")
    for lr, steps, scaling in SETTINGS:
        t0 = time.monotonic()
        config = TrainConfig(steps=steps, lr=lr, normalise=scaling)
        trained = train_autoencoder(
            AeConfig.tiny(), layout, [empirical_stats(layout, train)], config, "cpu", train
        )
        codec = AeCodec(trained)
        print(
            f"ae lr {lr:g}, {steps} steps, {scaling} scaling: held-out cosine "
            f"{mean_cosine(codec, layout, test):.3f} ({time.monotonic() - t0:.0f} s)"
        )


if __name__ == "__main__":
    main()
