"""The public subspace: a basis fitted on the server's public increments, applied to the released
mean as post-processing (server/public_prior.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from autoencoder.layout import Layout
from common.config import preset
from common.errors import FedloraError
from common.models import adapter_shapes
from server import checkpoint, public_prior
from server.evaluation import Evaluator
from server.public_prior import BASIS_FILE, PublicSubspace
from server.simulate import simulate
from tests.harness import TINY

PUBLIC = dict(public_fraction=0.25, public_subspace=3, public_increments=4)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(public_subspace=3), "needs public data"),
        (dict(public_fraction=0.2, public_subspace=9, public_increments=8), "exceeds --public-increments 8"),
        (dict(**PUBLIC, prior_refresh=0), "prior-refresh must be"),
    ],
)
def test_bad_public_subspace_options_are_one_line(changes, message):
    with pytest.raises(FedloraError, match=message):
        preset("minilm-rt", **TINY, **changes).check()


def test_the_applied_factor_update_lies_in_the_public_subspace(tmp_path):
    run_dir = tmp_path / "r"
    cfg = preset(
        "minilm-rt",
        **TINY,
        **PUBLIC,
        mechanism="dp-fedavg",
        threat_model="central",
        noise_multiplier=1.0,
        clip=1.0,
    ).check()
    start = Evaluator(cfg).initial_state()
    simulate(cfg, run_dir)
    shapes = {k: tuple(v.shape) for k, v in start.items()}
    end, _, _ = checkpoint.load(run_dir / checkpoint.CHECKPOINT_FILE, shapes)
    layout = Layout.from_shapes(shapes, 1)
    basis = load_file(str(run_dir / BASIS_FILE))["basis"].double()
    assert basis.shape == (layout.num_coords, 3)
    delta = layout.to_vector({k: end[k] - start[k] for k in layout.names}).double()
    outside = delta - basis @ (basis.T @ delta)
    assert delta.norm() > 0 and outside.norm() < 1e-4 * delta.norm()
    dense = [k for k in start if k not in layout.shapes]
    assert dense and any(not torch.equal(end[k], start[k]) for k in dense)  # the head is not projected


def test_the_basis_is_refitted_every_prior_refresh_rounds_and_reloaded_on_resume(
    tmp_path, monkeypatch, minilm
):
    fits = []

    def fake_increments(evaluator, cfg, state, count, layout):
        fits.append(count)
        return torch.randn(count, layout.num_coords, generator=torch.Generator().manual_seed(len(fits)))

    monkeypatch.setattr(public_prior, "public_increments", fake_increments)
    cfg = preset("minilm-rt", **TINY, **PUBLIC, prior_refresh=2).check()
    layout = Layout.from_shapes(adapter_shapes(minilm.model), 1)
    subspace = PublicSubspace(cfg, None, layout, tmp_path)
    for rnd in range(1, 6):
        subspace.refresh(rnd, {}, lambda _line: None)
        assert subspace.fitted_round == 1 + (rnd - 1) // 2 * 2
    assert len(fits) == 3  # rounds 1, 3 and 5
    resumed = PublicSubspace(cfg.replace(resume=True), None, layout, tmp_path)
    assert resumed.fitted_round == 5 and torch.equal(resumed.codec.basis, subspace.codec.basis)
    resumed.refresh(6, {}, lambda _line: None)
    assert len(fits) == 3  # round 6 uses round 5's basis
