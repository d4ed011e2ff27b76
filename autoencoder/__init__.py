"""DR-Encoder gradient autoencoder: tiling layout, Algorithm 1 statistics, synthetic Gaussian gradients,
the Uformer autoencoder, its training and checkpoints, and the codecs (``ae``, ``identity``,
``constant-mean``, ``random-projection``). Imports ``common`` only (docs/design.md §1).
"""

from autoencoder.checkpoint import ae_version, load_checkpoint, save_checkpoint
from autoencoder.codecs import CODECS, Codec, make_codec
from autoencoder.layout import Layout
from autoencoder.synthetic import GradStats, export_all, sample_gradients, track, update_all
from autoencoder.train import TrainConfig, TrainedAe, train_autoencoder
from autoencoder.uformer import AeConfig, Uformer

__all__ = [
    "CODECS",
    "AeConfig",
    "Codec",
    "GradStats",
    "Layout",
    "TrainConfig",
    "TrainedAe",
    "Uformer",
    "ae_version",
    "export_all",
    "load_checkpoint",
    "make_codec",
    "sample_gradients",
    "save_checkpoint",
    "track",
    "train_autoencoder",
    "update_all",
]
