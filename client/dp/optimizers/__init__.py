"""Local (sample-level) DP optimizers of LoRA factors, one registry (like Opacus's ``optimizers/``).

``prism`` tangent-space DP (client/dp/optimizers/prism.py); ``dp-adamw`` factor-space DP-SGD + AdamW
and ``ffa`` (frozen ``lora_A``) (client/dp/optimizers/factor.py); ``sparta`` row selection then sparse
DP-AdamW (client/dp/optimizers/sparta.py), ``sparta-base`` the same on rows of the base weights
(client/dp/optimizers/sparta_base.py); ``wishart`` the random-projection mechanism M2 with a fresh
Gaussian A every step (client/dp/optimizers/wishart.py). ``none`` (non-private AdamW) is not a
DP optimizer and lives in client/local_update.py. Each is registered by a descriptor in
client/dp/optimizers/registry.py (its facts: common/local_optimizers.py).
"""

from __future__ import annotations

from client.dp.optimizers.base import FactorGrads, LoraDpOptimizer
from client.dp.optimizers.factor import FactorDp, update_rule
from client.dp.optimizers.prism import PrismDp
from client.dp.optimizers.registry import (
    DP_OPTIMIZERS,
    OptimizerDescriptor,
    dp_optimizer,
    make_dp_optimizer,
    register,
    unregister,
)
from client.dp.optimizers.sparta import SpartaDp
from client.dp.optimizers.sparta_base import SpartaBaseDp
from client.dp.optimizers.wishart import WishartDp

__all__ = [
    "DP_OPTIMIZERS",
    "FactorDp",
    "FactorGrads",
    "LoraDpOptimizer",
    "OptimizerDescriptor",
    "PrismDp",
    "SpartaBaseDp",
    "SpartaDp",
    "WishartDp",
    "dp_optimizer",
    "make_dp_optimizer",
    "register",
    "unregister",
    "update_rule",
]
