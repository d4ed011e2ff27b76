"""The local DP optimizers, one :class:`OptimizerDescriptor` per name in :data:`DP_OPTIMIZERS`.

PEFT's ``LoraVariant`` is the model: the generic code (client/local_update.py, client/train_local.py,
client/dp/engine.py) asks the descriptor, or the optimizer object it builds, and never compares a
name. A descriptor holds the optimizer's facts (its :class:`~common.local_optimizers.LocalOptimizerSpec`,
which the run configuration checks without importing ``client``: see common/local_optimizers.py) and
what a client does with it:

- ``factory(layers, lr, **options)``: the optimizer of one model's LoRA layers;
- ``options(cfg, steps)``: the factory's keyword arguments from the run configuration and the number of
  local steps (PRISM's floor, SPARTA's rows and selection steps, the factor optimizers' update rule);
- ``check_model(layers, cfg)``: refuse the model before anything is written (SPARTA's kept rows);
- ``projection(layers, cfg)``: ``(rank, dim, grad_rank)`` for the sample plan's Wishart-amplified
  accountant (client/dp/sample_plan.py), or None for plain PLD;
- ``report(cfg, stats)``: entries of train-local's result.json (PRISM's floor, SPARTA's kept rows).

The training path itself is the optimizer object's (client/dp/optimizers/base.py): the engine reads its
``needs_layer_io`` (wishart), ``trains_dense``, ``selecting`` (SPARTA's selection phase) and
``summary``. A new optimizer is its module here, one spec in common/local_optimizers.py and one
descriptor below; :func:`register` adds both at run time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from peft.tuners.lora import LoraLayer

from client.dp.optimizers.base import LoraDpOptimizer
from client.dp.optimizers.factor import FactorDp
from client.dp.optimizers.prism import PrismDp
from client.dp.optimizers.sparta import SpartaDp, check_rows
from client.dp.optimizers.sparta_base import SpartaBaseDp, check_base_rows
from client.dp.optimizers.wishart import WishartDp, projection_shape
from client.dp.prism import AdaptiveSettings
from common.config import RunConfig
from common.errors import FedloraError
from common.local_optimizers import (
    LOCAL_OPTIMIZERS,
    LocalOptimizerSpec,
    add_local_optimizer,
    remove_local_optimizer,
)
from common.sparta import selection_steps

Layers = dict[str, LoraLayer]


def _no_options(cfg: RunConfig, steps: int) -> dict:
    return {}


def _no_check(layers: Layers, cfg: RunConfig) -> None:
    return None


def _no_projection(layers: Layers, cfg: RunConfig) -> tuple[int, int, int] | None:
    return None


def _no_report(cfg: RunConfig, stats: dict) -> dict:
    return {}


@dataclass(frozen=True)
class OptimizerDescriptor:
    """One local DP optimizer: its facts (``spec``) and what a client does with it (module docstring)."""

    spec: LocalOptimizerSpec
    factory: Callable[..., LoraDpOptimizer]
    options: Callable[[RunConfig, int], dict] = _no_options
    check_model: Callable[[Layers, RunConfig], None] = _no_check
    projection: Callable[[Layers, RunConfig], tuple[int, int, int] | None] = _no_projection
    report: Callable[[RunConfig, dict], dict] = _no_report

    @property
    def name(self) -> str:
        return self.spec.name


def _factor_options(cfg: RunConfig, steps: int) -> dict:
    return {"rule": cfg.client_optimizer}


def _prism_options(cfg: RunConfig, steps: int) -> dict:
    return {"adaptive": AdaptiveSettings(floor=cfg.prism_floor)}


def _prism_report(cfg: RunConfig, stats: dict) -> dict:
    return {"prism_floor": cfg.prism_floor}


def _sparta_options(cfg: RunConfig, steps: int) -> dict:
    return {"keep": cfg.sparta_keep, "selection": selection_steps(cfg.sparta_selection, steps)}


def _sparta_report(cfg: RunConfig, stats: dict) -> dict:
    """The rows SPARTA kept: of the LoRA factors, or of the base weights (``merges_base``)."""
    where = "base" if cfg.optimizer_spec.merges_base else "lora"
    keys = ("selection_steps", "kept_coordinates", f"{where}_coordinates")
    return {"sparta": {"keep": cfg.sparta_keep, "rows_of": where, **{k: stats[k] for k in keys}}}


def _check_lora_rows(layers: Layers, cfg: RunConfig) -> None:
    check_rows(layers, cfg.sparta_keep)


def _check_base_rows(layers: Layers, cfg: RunConfig) -> None:
    check_base_rows(layers, cfg.sparta_keep)


def _wishart_projection(layers: Layers, cfg: RunConfig) -> tuple[int, int, int]:
    return projection_shape(layers, cfg.max_length)


#: name -> descriptor, one per DP spec of common/local_optimizers.py (``none`` is not a DP optimizer)
DP_OPTIMIZERS: dict[str, OptimizerDescriptor] = {
    d.name: d
    for d in (
        OptimizerDescriptor(LOCAL_OPTIMIZERS["prism"], PrismDp, options=_prism_options, report=_prism_report),
        OptimizerDescriptor(LOCAL_OPTIMIZERS["dp-adamw"], FactorDp, options=_factor_options),
        OptimizerDescriptor(
            LOCAL_OPTIMIZERS["ffa"], functools.partial(FactorDp, freeze_a=True), options=_factor_options
        ),
        OptimizerDescriptor(
            LOCAL_OPTIMIZERS["sparta"],
            SpartaDp,
            options=_sparta_options,
            check_model=_check_lora_rows,
            report=_sparta_report,
        ),
        OptimizerDescriptor(
            LOCAL_OPTIMIZERS["sparta-base"],
            SpartaBaseDp,
            options=_sparta_options,
            check_model=_check_base_rows,
            report=_sparta_report,
        ),
        OptimizerDescriptor(LOCAL_OPTIMIZERS["wishart"], WishartDp, projection=_wishart_projection),
    )
}


def dp_optimizer(name: str) -> OptimizerDescriptor:
    """The descriptor registered as ``name``; :class:`FedloraError` (one line) if there is none."""
    if name not in DP_OPTIMIZERS:
        raise FedloraError(f"unknown DP optimizer '{name}'; choose {', '.join(DP_OPTIMIZERS)}")
    return DP_OPTIMIZERS[name]


def make_dp_optimizer(name: str, layers: Layers, lr: float, **options) -> LoraDpOptimizer:
    return dp_optimizer(name).factory(layers, lr, **options)


def register(descriptor: OptimizerDescriptor) -> OptimizerDescriptor:
    """Add a local DP optimizer at run time (a plugin, a test): its spec to the run configuration's
    choices and rules, its descriptor here. Every process that checks such a run's configuration (a
    federation's server too) must register it."""
    if not descriptor.spec.private:
        raise FedloraError(f"local optimizer '{descriptor.name}' is not private: a DP optimizer must be")
    add_local_optimizer(descriptor.spec)
    DP_OPTIMIZERS[descriptor.name] = descriptor
    return descriptor


def unregister(name: str) -> None:
    """Undo :func:`register` (a test's teardown)."""
    DP_OPTIMIZERS.pop(name, None)
    remove_local_optimizer(name)


__all__ = [
    "DP_OPTIMIZERS",
    "OptimizerDescriptor",
    "dp_optimizer",
    "make_dp_optimizer",
    "register",
    "unregister",
]
