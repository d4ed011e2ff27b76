"""Local (sample-level) DP optimizers of LoRA factors, one registry (like Opacus's ``optimizers/``).

``prism`` tangent-space DP (client/dp/optimizers/prism.py); ``dp-adamw`` factor-space DP-SGD + AdamW
and ``ffa`` (frozen ``lora_A``) (client/dp/optimizers/factor.py); ``sparta`` row selection then sparse
DP-AdamW (client/dp/optimizers/sparta.py), ``sparta-base`` the same on rows of the base weights
(client/dp/optimizers/sparta_base.py); ``wishart`` the random-projection mechanism M2 with a fresh
Gaussian A every step (client/dp/optimizers/wishart.py). ``none`` (non-private AdamW) is not a
DP optimizer and lives in client/local_update.py.
"""

from __future__ import annotations

from collections.abc import Callable

from peft.tuners.lora import LoraLayer

from client.dp.optimizers.base import FactorGrads, LoraDpOptimizer
from client.dp.optimizers.factor import FactorDp, update_rule
from client.dp.optimizers.prism import PrismDp
from client.dp.optimizers.sparta import SpartaDp
from client.dp.optimizers.sparta_base import SpartaBaseDp
from client.dp.optimizers.wishart import WishartDp
from common.errors import FedloraError

#: name -> factory(layers, lr, **options)
DP_OPTIMIZERS: dict[str, Callable[..., LoraDpOptimizer]] = {
    "prism": PrismDp,
    "dp-adamw": FactorDp,
    "ffa": lambda layers, lr, **kw: FactorDp(layers, lr, freeze_a=True, **kw),
    "sparta": SpartaDp,
    "sparta-base": SpartaBaseDp,
    "wishart": WishartDp,
}
LOCAL_OPTIMIZERS = ("none", *DP_OPTIMIZERS)


def make_dp_optimizer(name: str, layers: dict[str, LoraLayer], lr: float, **options) -> LoraDpOptimizer:
    if name not in DP_OPTIMIZERS:
        raise FedloraError(f"unknown DP optimizer '{name}'; choose {', '.join(DP_OPTIMIZERS)}")
    return DP_OPTIMIZERS[name](layers, lr, **options)


__all__ = [
    "DP_OPTIMIZERS",
    "LOCAL_OPTIMIZERS",
    "FactorDp",
    "FactorGrads",
    "LoraDpOptimizer",
    "PrismDp",
    "SpartaBaseDp",
    "SpartaDp",
    "WishartDp",
    "make_dp_optimizer",
    "update_rule",
]
