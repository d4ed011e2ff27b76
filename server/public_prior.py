"""A subspace that carries the signal, learned from public data (zero privacy cost).

The server holds ``--public-fraction`` of the training pool (no client has it). It runs the clients'
local recipe on it from the current global adapter (:func:`public_increments`) and fits the ``pca``
basis (:func:`autoencoder.codecs.fit_pca`): the public increments' mean direction and top principal
directions. Real client increments put most of their energy there (``fedlora bench subspace``:
MiniLM, 256 public increments, k = 256 of D = 73,728: cosine 0.77 per client, 0.94 for the mean).

:class:`PublicSubspace` projects the round's released mean LoRA-factor increment onto that basis
before the server optimizer applies it (``--public-subspace K``). The projection is post-processing
of the release: the basis depends only on public data and the global adapter (itself a release), so
every ε stays as it was, while the noise outside the K-dimensional subspace is removed (its energy
shrinks by K / D; the signal by what the subspace misses). Dense entries (a classification head)
pass unchanged. The basis is refitted every ``--prior-refresh`` rounds and saved in the run
directory, so a resumed run projects with the same basis.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from autoencoder.broadcast import basis_version
from autoencoder.codecs import PcaCodec, fit_pca
from autoencoder.layout import Layout
from common.atomic import replacing
from common.config import RunConfig
from common.errors import FedloraError
from common.models import AdapterState, adapter_state, load_adapter_state
from common.tasks.training import StepSchedule, Trainee, train_steps

BASIS_FILE = "public-subspace.safetensors"


def public_increments(
    evaluator, cfg: RunConfig, state: AdapterState, count: int, layout: Layout
) -> torch.Tensor:
    """``(count, D)`` float32: increments of the clients' local recipe on the server's public examples
    from ``state`` (each its own seed and batches), flattened in ``layout`` order; ``evaluator``: the
    server's :class:`server.evaluation.Evaluator` (its model is left at ``state``)."""
    split, bundle, task = evaluator.split, evaluator.bundle, evaluator.task
    if len(split.public) == 0:
        raise FedloraError("no public examples: set --public-fraction > 0")
    examples = task.encode(split.texts(split.public), split.labels(split.public))
    rows = []
    for i in range(count):
        load_adapter_state(bundle.model, state)
        seed = int(np.random.SeedSequence([cfg.seed, 0x9B1, i]).generate_state(1)[0])
        train_steps(
            Trainee(bundle.model, task, examples, bundle.device),
            StepSchedule.of(cfg, seed),
            desc="public increments",
        )
        now = adapter_state(bundle.model)
        rows.append(layout.to_vector({k: now[k] - state[k] for k in layout.names}).float().cpu())
    load_adapter_state(bundle.model, state)
    return torch.stack(rows)


def fit_public_basis(
    evaluator, cfg: RunConfig, state: AdapterState, layout: Layout, path: Path, rnd: int
) -> PcaCodec:
    """Fit the ``pca`` codec of ``cfg.public_subspace`` directions on ``cfg.public_increments`` public
    increments from ``state`` and save it to ``path`` (atomically) as fitted before round ``rnd``."""
    if cfg.public_subspace > layout.num_coords:  # before the (slow) public increments
        raise FedloraError(
            f"--public-subspace {cfg.public_subspace} exceeds the {layout.num_coords:,} LoRA-factor "
            "entries it compresses"
        )
    samples = public_increments(evaluator, cfg, state, cfg.public_increments, layout)
    fitted = fit_pca(layout, samples, cfg.public_subspace)
    codec = PcaCodec(layout, fitted.basis, version=basis_version(fitted.basis))
    with replacing(path) as tmp:
        save_file({"basis": codec.basis, "round": torch.tensor([rnd])}, str(tmp))
    return codec


def load_basis(path: Path, layout: Layout) -> tuple[PcaCodec, int]:
    """The codec saved by :func:`fit_public_basis` and the round it was fitted before."""
    saved = load_file(str(path))
    basis = saved["basis"]
    return PcaCodec(layout, basis, version=basis_version(basis)), int(saved["round"].item())


def refit_round(cfg: RunConfig, rnd: int) -> int:
    """The round whose start the public prior in use at round ``rnd`` should have been fitted for:
    one fit every ``prior-refresh`` rounds, counted from round 1."""
    return 1 + (rnd - 1) // cfg.prior_refresh * cfg.prior_refresh


class PublicSubspace:
    """The run's public basis and when it was fitted; :meth:`project` is the post-processing step."""

    def __init__(self, cfg: RunConfig, evaluator, layout: Layout, run_dir: Path) -> None:
        self.cfg, self.evaluator, self.layout = cfg, evaluator, layout
        self.path = run_dir / BASIS_FILE
        self.codec: PcaCodec | None = None
        self.fitted_round = -1
        if cfg.resume and self.path.exists():
            self.codec, self.fitted_round = load_basis(self.path, layout)

    def refresh(self, rnd: int, state: AdapterState, echo: Callable[[str], None]) -> None:
        """Fit the basis from ``state`` before round ``rnd`` if none is current (every ``prior-refresh``
        rounds, counted from round 1)."""
        due = refit_round(self.cfg, rnd)
        if self.codec is not None and self.fitted_round >= due:
            return
        self.codec = fit_public_basis(self.evaluator, self.cfg, state, self.layout, self.path, rnd)
        self.fitted_round = rnd
        echo(
            f"round {rnd}: public subspace refitted ({self.cfg.public_increments} public increments, k = "
            f"{self.cfg.public_subspace} of D = {self.layout.num_coords:,}; no privacy cost)"
        )

    def project(self, mean: AdapterState) -> AdapterState:
        """``mean`` with its LoRA-factor entries projected onto the basis; other entries unchanged."""
        if self.codec is None:
            raise RuntimeError("refresh() before project()")
        factors = {k: mean[k] for k in self.layout.names}
        projected = self.codec.decode(self.codec.encode(factors))
        return {k: projected[k].to(v.device, v.dtype) if k in projected else v for k, v in mean.items()}


__all__ = [
    "BASIS_FILE",
    "PublicSubspace",
    "fit_public_basis",
    "load_basis",
    "public_increments",
    "refit_round",
]
