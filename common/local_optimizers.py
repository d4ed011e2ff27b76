"""What the run configuration knows about each sample-level local optimizer: one
:class:`LocalOptimizerSpec` per name in :data:`LOCAL_OPTIMIZERS`; callers ask it, never compare a name.

Why two halves. :meth:`common.config.RunConfig.check` runs in every process, the server's included,
and ``common`` imports neither ``client`` nor ``server`` (tests/system/test_layers.py); so the facts its
rules need (full-rank factors, a dense update merged into the base, an update rule, SPARTA's options) are
plain data here, and how a client builds and runs an optimizer (factory, options, model checks,
report) is its :class:`client.dp.optimizers.registry.OptimizerDescriptor`, which holds the spec below
(PEFT's ``LoraVariant`` is the model: one object per variant that the generic code asks). A new
optimizer is its module under client/dp/optimizers/, one spec here and one descriptor there: three
files; :func:`client.dp.optimizers.registry.register` adds both at run time (a plugin, a test).

``none`` (non-private AdamW or SGD, client/local_update.py) is listed too: it is a choice of
``--local-optimizer``, and the rules ask it the same questions.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import FedloraError


@dataclass(frozen=True)
class LocalOptimizerSpec:
    """One local optimizer's facts (see the module docstring for where its behaviour lives).

    ``private``: a sample-level DP optimizer (False only for ``none``).
    ``lora_init``: the LoRA init when ``--lora-init`` is unset (``balanced``: full-rank factors;
    ``peft``: PEFT's ``B = 0``).
    ``full_rank``: it needs full-rank LoRA factors (PRISM's tangent space) and refuses ``--lora-init
    peft``.
    ``merges_base``: its update is a dense ``(out, in)`` matrix merged into the base weights at every
    step, LoRA's ``B = 0`` only tapping the gradient: train-local only (federations exchange LoRA
    factors), an fp32 base, ``--lora-init peft`` and ``--lora-dropout 0``.
    ``update_rule``: it takes ``--client-optimizer`` (adamw or sgd) as its update rule; the others
    have their own.
    ``row_selection``: SPARTA's row selection (``--sparta-keep`` rows of each factor, or of each base
    layer with ``merges_base``, chosen during the first ``--sparta-selection`` of the steps).
    ``audited``: ``fedlora audit mia`` has an arm for it (client/audit/cli.py; ``sparta-base`` has
    none yet).
    ``label``: how error messages name it (default: its name).
    """

    name: str
    private: bool = True
    lora_init: str = "balanced"
    full_rank: bool = False
    merges_base: bool = False
    update_rule: bool = False
    row_selection: bool = False
    audited: bool = True
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.name)


#: name -> spec, in ``--local-optimizer``'s order (RunConfig takes this dict as its choices, so an
#: optimizer registered at run time is a valid choice at once)
LOCAL_OPTIMIZERS: dict[str, LocalOptimizerSpec] = {
    spec.name: spec
    for spec in (
        LocalOptimizerSpec("none", private=False, lora_init="peft", update_rule=True, audited=False),
        LocalOptimizerSpec("prism", full_rank=True, label="PRISM"),
        LocalOptimizerSpec("dp-adamw", update_rule=True),
        # FFA-LoRA's own init (Sun et al. 2024; issue 52): PEFT's random A, frozen, and B = 0
        LocalOptimizerSpec("ffa", lora_init="peft", update_rule=True),
        LocalOptimizerSpec("sparta", row_selection=True),
        LocalOptimizerSpec(
            "sparta-base", lora_init="peft", merges_base=True, row_selection=True, audited=False
        ),
        LocalOptimizerSpec("wishart", lora_init="peft", merges_base=True),
    )
}


def find_local_optimizer(name: str) -> LocalOptimizerSpec:
    """The spec registered as ``name``; :class:`FedloraError` (one line) if there is none."""
    spec = LOCAL_OPTIMIZERS.get(name)
    if spec is None:
        raise FedloraError(f"unknown local-optimizer '{name}'; choose {', '.join(LOCAL_OPTIMIZERS)}")
    return spec


def add_local_optimizer(spec: LocalOptimizerSpec) -> None:
    """Register ``spec`` (call :func:`client.dp.optimizers.registry.register`, which adds the
    client's half too); a name is registered once."""
    if spec.name in LOCAL_OPTIMIZERS:
        raise FedloraError(f"local optimizer '{spec.name}' is already registered")
    LOCAL_OPTIMIZERS[spec.name] = spec


def remove_local_optimizer(name: str) -> None:
    """Undo :func:`add_local_optimizer` (a test's teardown)."""
    LOCAL_OPTIMIZERS.pop(name, None)


__all__ = [
    "LOCAL_OPTIMIZERS",
    "LocalOptimizerSpec",
    "add_local_optimizer",
    "find_local_optimizer",
    "remove_local_optimizer",
]
