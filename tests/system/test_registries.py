"""The registries of named choices: every registered local optimizer and codec keeps its descriptor's
word (contract tests), a new local optimizer needs no edit outside its own files (a toy one, defined and
registered here, runs train-local end to end), and no code outside the registries compares a registered
name (an AST grep over server/, client/, common/ and autoencoder/).

A registry is a small table of descriptors that the generic code asks (PEFT's ``LoraVariant`` is the
model): threat models in common/privacy/participation/threat.py (``THREATS``: what each observer sees); local optimizers in common/local_optimizers.py (facts the run configuration checks) and
client/dp/optimizers/registry.py (factory, options, model checks, report); codecs in
common/codec_specs.py (facts) and autoencoder/codecs.py (builders). Extend :data:`NAMED` and
:data:`REGISTRY_FILES` for another registry (threat models: common/privacy/participation/threat.py).
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch

from autoencoder.codecs import CODEC_REGISTRY, CODECS, Codec, make_codec
from autoencoder.layout import Layout
from autoencoder.train import TrainConfig, train_autoencoder
from autoencoder.uformer import AeConfig
from client.dp.engine import DenseUpdate, DpSteps, dp_train
from client.dp.optimizers import DP_OPTIMIZERS, OptimizerDescriptor, make_dp_optimizer, register, unregister
from common import config
from common.codec_specs import CODEC_SPECS
from common.config import MECHANISMS, RunConfig
from common.errors import FedloraError
from common.local_optimizers import LOCAL_OPTIMIZERS, LocalOptimizerSpec
from common.models.dense_delta import dense_deltas
from common.models.lora import lora_layers
from common.models.lora_init import apply_lora_init
from common.privacy.accounting.accountants import Event
from common.privacy.mechanisms.mechanism import GaussianMechanism, mechanism_for
from common.privacy.participation.participation import PoissonSampling
from common.privacy.participation.threat import THREATS
from common.privacy.planning.plan import NoisePlan, plan_noise
from common.privacy.registry import RELEASE_KINDS, register_release, unregister_release
from common.tasks.training import Trainee
from tests.harness import LmTask

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "client", "common", "autoencoder")

# -- no string comparison of a registered name outside its registry ---------------------------------------------

#: what each registry names (``none`` is left out: it is the shared "no mechanism" word of the local
#: optimizer, the release and the codec statistics alike, not a name one of them registers)
NAMED: dict[str, Callable[[], set[str]]] = {
    "local optimizer": lambda: set(LOCAL_OPTIMIZERS) - {"none"},
    "codec": lambda: set(CODEC_SPECS),
    "threat model": lambda: set(THREATS),
}
#: the only files that may compare (or list) those names: the registries themselves
REGISTRY_FILES = frozenset(
    {
        "common/local_optimizers.py",
        "client/dp/optimizers/registry.py",
        "common/codec_specs.py",
        "autoencoder/codecs.py",
        "common/privacy/participation/threat.py",
    }
)
#: (file, name) -> why a comparison there is not one of a registered name
HOMONYMS: dict[tuple[str, str], str] = {
    ("common/privacy/cli.py", "wishart"): "--accountant wishart, the accountant of the same name",
}


def _strings(node: ast.AST) -> Iterator[str]:
    """The string constants ``node`` is or, for a literal tuple, list, set or dict, holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        for element in node.elts:
            yield from _strings(element) if isinstance(element, ast.Constant) else ()
    elif isinstance(node, ast.Dict):
        for key in node.keys:
            yield from _strings(key) if isinstance(key, ast.Constant) else ()


def compared_strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, string)`` for every string constant a comparison or a ``case`` tests against:
    ``x == "a"``, ``"a" != x``, ``x is "a"``, ``x in ("a", "b")``, ``case "a":``. ``"a" in record`` is
    a key lookup in a record, not a name comparison, and is not reported."""
    equality = (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, operands[:-1], operands[1:], strict=True):
                if isinstance(op, equality):
                    sides = (left, right)
                elif isinstance(op, ast.In | ast.NotIn):
                    sides = (right,) if not isinstance(right, ast.Constant) else ()
                else:
                    continue
                for side in sides:
                    yield from ((node.lineno, s) for s in _strings(side))
        elif isinstance(node, ast.MatchValue):
            yield from ((node.lineno, s) for s in _strings(node.value))


def name_comparisons(root: Path = REPO) -> list[str]:
    """``file:line: compares the <registry> name 'x'`` outside :data:`REGISTRY_FILES`."""
    names = {name: kind for kind, listed in NAMED.items() for name in listed()}
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in REGISTRY_FILES:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            for line, value in sorted(set(compared_strings(tree))):
                if value in names and (rel, value) not in HOMONYMS:
                    found.append(f"{rel}:{line}: compares the {names[value]} name '{value}'")
    return found


def test_no_name_is_compared_outside_its_registry():
    if found := name_comparisons():
        pytest.fail(
            "ask the descriptor (cfg.optimizer_spec, cfg.codec_spec, DP_OPTIMIZERS, CODEC_REGISTRY, "
            "THREATS / plan.threat) "
            "instead of comparing a name:\n" + "\n".join(found),
            pytrace=False,
        )


def test_the_registry_files_exist():
    assert all((REPO / f).is_file() for f in REGISTRY_FILES)
    assert all((REPO / f).is_file() for f, _ in HOMONYMS)


def test_the_grep_sees_every_form_of_comparison(tmp_path):
    (tmp_path / "client").mkdir()
    (tmp_path / "client" / "mod.py").write_text(
        "def f(kind, codec, result):\n"
        '    if kind == "prism" or "pca" != codec:\n'  # 2
        "        pass\n"
        '    if kind in ("sparta", "sparta-base") or codec not in {"ae"}:\n'  # 4
        "        pass\n"
        "    match kind:\n"
        '        case "wishart":\n'  # 7
        "            pass\n"
        '    if "sparta" in result or kind == "none" or kind == "prismatic":\n'  # 9: none of these
        "        pass\n"
    )
    assert name_comparisons(tmp_path) == [
        "client/mod.py:2: compares the codec name 'pca'",
        "client/mod.py:2: compares the local optimizer name 'prism'",
        "client/mod.py:4: compares the codec name 'ae'",
        "client/mod.py:4: compares the local optimizer name 'sparta'",
        "client/mod.py:4: compares the local optimizer name 'sparta-base'",
        "client/mod.py:7: compares the local optimizer name 'wishart'",
    ]


# -- the local optimizers' contract -------------------------------------------------------------------------------


STEPS = 3  # SPARTA selects rows in the first, then trains


def _examples(n=8, seed=0):
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(1, 500, size=int(rng.integers(3, 8))).tolist()} for _ in range(n)]


def _config(name: str, **changes) -> RunConfig:
    values = dict(local_optimizer=name, sample_noise_multiplier=0.5, local_steps=STEPS, max_length=16)
    return RunConfig(**{**values, **changes})


def _factors(model) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if ".lora_" in k}


def _bases(model) -> dict[str, torch.Tensor]:
    return {k: layer.get_base_layer().weight.detach().clone() for k, layer in lora_layers(model).items()}


def check_optimizer_contract(name: str, model) -> None:
    """What ``name``'s descriptor declares holds: the configuration's rules, the factory on the model
    its init gives, one engine run (three DP steps) and where the update lands."""
    descriptor = DP_OPTIMIZERS[name]
    spec = descriptor.spec
    assert descriptor.name == name and LOCAL_OPTIMIZERS[name] is spec and spec.private
    cfg = _config(name).check()
    assert cfg.optimizer_spec is spec and cfg.init_kind == spec.lora_init
    # the configuration's rules, from the facts
    other_init = "balanced" if spec.lora_init == "peft" else "peft"
    refused = spec.merges_base or (spec.full_rank and other_init == "peft")
    _assert_check(_config(name, lora_init=other_init), refused)
    if spec.full_rank:
        _assert_check(_config(name, lora_init="peft"), True, "full-rank")
    _assert_check(_config(name, client_optimizer="sgd"), not spec.update_rule, "--client-optimizer sgd")
    _assert_check(_config(name, precision="bf16"), spec.merges_base, "--precision fp32")
    if spec.merges_base:
        with pytest.raises(FedloraError, match="federations exchange LoRA factors"):
            cfg.check_federated()
    else:
        cfg.check_federated()
    _assert_check(_config(name, sparta_selection=0.9), spec.row_selection, "sparta needs")
    # the factory refuses the other init's factors where the rules do
    layers = lora_layers(model)
    if refused:
        apply_lora_init(model, other_init, seed=0, scale=0.3)
        with pytest.raises(FedloraError):
            descriptor.factory(layers, 1e-2, **descriptor.options(cfg, STEPS))
        for layer in layers.values():  # back to PEFT's B = 0 (as attach_lora leaves it)
            torch.nn.init.zeros_(layer.lora_B["default"].weight)
    apply_lora_init(model, cfg.init_kind, seed=0, scale=0.3)
    descriptor.check_model(layers, cfg)
    projection = descriptor.projection(layers, cfg)
    assert projection is None or (len(projection) == 3 and all(int(v) >= 1 for v in projection))
    # one engine run
    factors, bases = _factors(model), _bases(model)
    optimizer = make_dp_optimizer(name, layers, 1e-2, **descriptor.options(cfg, STEPS))
    plan = DpSteps(steps=STEPS, sample_rate=1.0, clip=1.0, noise_multiplier=0.5)
    rngs = (np.random.default_rng(0), torch.Generator().manual_seed(0))
    trainee = Trainee(model, LmTask(), _examples(), torch.device("cpu"))
    stats = dp_train(trainee, optimizer, plan, DenseUpdate(1e-2), rngs=rngs)
    assert stats["steps"] == STEPS
    after, deltas = _factors(model), dense_deltas(model)
    assert all(torch.isfinite(v).all() for v in [*after.values(), *deltas.values()])
    if spec.merges_base:  # a dense update in the base weights; LoRA's B = 0 only tapped the gradient
        assert deltas and any(d.abs().max() > 0 for d in deltas.values())
        assert all(torch.equal(after[k], factors[k]) for k in factors)
    else:  # LoRA factors only
        assert not deltas and all(torch.equal(w, bases[k]) for k, w in _bases(model).items())
        assert any(not torch.equal(after[k], factors[k]) for k in factors)
    report = descriptor.report(cfg, stats)
    assert isinstance(report, dict) and ("sparta" in report) == spec.row_selection
    if spec.row_selection:
        assert report["sparta"]["selection_steps"] == descriptor.options(cfg, STEPS)["selection"]


def _assert_check(cfg: RunConfig, refused: bool, match: str | None = None) -> None:
    if refused:
        with pytest.raises(FedloraError, match=match):
            cfg.check()
    else:
        cfg.check()


def test_the_two_halves_of_each_optimizer_agree():
    assert set(DP_OPTIMIZERS) == {n for n, s in LOCAL_OPTIMIZERS.items() if s.private}
    assert not LOCAL_OPTIMIZERS["none"].private and LOCAL_OPTIMIZERS["none"].update_rule
    assert all(isinstance(d, OptimizerDescriptor) for d in DP_OPTIMIZERS.values())
    assert all(MECHANISMS[n] == (n, "none") for n in DP_OPTIMIZERS)
    assert config.LOCAL_OPTIMIZERS is LOCAL_OPTIMIZERS  # the choices of --local-optimizer


def test_the_audit_lists_the_audited_optimizers():
    from client.audit.cli import MIA_ARMS

    audited = {n for n, s in LOCAL_OPTIMIZERS.items() if s.private and s.audited}
    assert {arm["mechanism"] for arm in MIA_ARMS.values()} - {"fedavg"} == audited


@pytest.mark.parametrize("name", list(DP_OPTIMIZERS))
def test_local_optimizer_contract(name, tiny_llama):
    check_optimizer_contract(name, tiny_llama)


# -- a toy local optimizer, registered from here --------------------------------------------------------------


class ToyNoisySgd:
    """DP-SGD in factor space, in a few lines: clip each example's ``(∂lora_B, ∂lora_A)`` (the engine
    clips globally), add ``N(0, σ²C²)`` to the sum, divide by the expected batch, take an SGD step."""

    name = "toy-sgd"

    def __init__(self, layers, lr: float) -> None:
        self.lr = lr
        self.weights = {
            k: (layer.lora_B["default"].weight, layer.lora_A["default"].weight) for k, layer in layers.items()
        }
        self.roots = {k: math.sqrt(layer.scaling["default"]) for k, layer in layers.items()}
        self.sums: dict[str, list[torch.Tensor]] = {}

    def begin(self) -> None:
        self.sums = {k: [torch.zeros_like(b), torch.zeros_like(a)] for k, (b, a) in self.weights.items()}

    def _grads(self, name, gA, gB):  # paper factors -> PEFT weights (common/models/lora.py)
        return self.roots[name] * gA, self.roots[name] * gB.mT

    def sq_norms(self, grads):
        return sum(
            g.square().sum(dim=(1, 2)) for k, (gA, gB) in grads.items() for g in self._grads(k, gA, gB)
        )

    def accumulate(self, grads, alpha) -> None:
        for k, (gA, gB) in grads.items():
            for acc, g in zip(self.sums[k], self._grads(k, gA, gB), strict=True):
                acc += torch.einsum("b,b...->...", alpha.to(g.dtype), g)

    def step(self, noise_std: float, denom: float, generator: torch.Generator) -> None:
        with torch.no_grad():
            for k, weights in self.weights.items():
                for w, acc in zip(weights, self.sums[k], strict=True):
                    noise = torch.randn(acc.shape, generator=generator, dtype=acc.dtype, device=acc.device)
                    w -= self.lr * (acc + noise_std * noise) / denom


TOY = "toy-sgd"


def files_naming(name: str) -> set[str]:
    """The repository's source, docs and config files that contain ``name``."""
    return {
        p.relative_to(REPO).as_posix()
        for package in (*PACKAGES, "tests", "scripts", "docs")
        for p in (REPO / package).rglob("*")
        if p.suffix in (".py", ".md", ".toml") and name in p.read_text(encoding="utf-8")
    }


@pytest.fixture()
def toy():
    """The toy optimizer registered (one call: its spec and its descriptor), unregistered after."""
    with pytest.raises(FedloraError, match="unknown local-optimizer"):
        _config(TOY).check()
    register(OptimizerDescriptor(LocalOptimizerSpec(TOY), ToyNoisySgd))
    yield
    unregister(TOY)
    assert TOY not in LOCAL_OPTIMIZERS and TOY not in DP_OPTIMIZERS


@pytest.mark.heavy
def test_a_new_optimizer_needs_no_edit_outside_its_own_files(toy, tiny_llama, tmp_path):
    """Adding a local optimizer touches at most 3 files: its module, one spec in
    common/local_optimizers.py and one descriptor in client/dp/optimizers/registry.py. Here all three
    are this file: no other file names it, yet the configuration's choices, ``make_dp_optimizer``,
    the contract and train-local end to end pick it up."""
    from client.train_local import train_local

    assert files_naming(TOY) == {"tests/system/test_registries.py"}  # <= 3 files
    assert TOY in config.LOCAL_OPTIMIZERS and isinstance(
        make_dp_optimizer(TOY, lora_layers(tiny_llama), 1e-2), ToyNoisySgd
    )
    check_optimizer_contract(TOY, tiny_llama)
    cfg = RunConfig(
        model="minilm-l6",
        dataset="rotten-tomatoes",
        local_optimizer=TOY,
        sample_noise_multiplier=1.0,
        local_steps=2,
        batch_size=4,
        lr=1e-2,
        max_train_examples=32,
        eval_examples=8,
        max_length=16,
        num_clients=1,
        partition="iid",
    ).check()
    result = train_local(cfg, tmp_path / "run")
    assert result["mechanism"] == TOY and result["init"] == "balanced" and result["steps"] == 2
    assert result["privacy"]["epsilon"] > 0 and math.isfinite(result["lora_norm"])
    assert "dense_norm" not in result  # a LoRA update
    assert (tmp_path / "run" / "adapter.safetensors").is_file()


# -- the codecs' contract ------------------------------------------------------------------------------------------

SHAPES = {"l0.q.A": (7, 3), "l0.q.B": (13, 3), "l1.v.A": (12, 2), "l1.v.B": (9, 2)}
K = 3  # a public-subspace codec's latent size


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    stats = {k: (torch.randn(s, generator=g) * 0.05, torch.full(s, 0.01)) for k, s in SHAPES.items()}
    layout = Layout.from_shapes(SHAPES, AeConfig.tiny().downsample)
    return train_autoencoder(AeConfig.tiny(), layout, [stats], TrainConfig(steps=1, lr=1e-2, samples=1))


def _increment(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) * 0.05 for k, s in SHAPES.items()}


def _codec_inputs(name: str, trained) -> dict:
    """What ``name``'s facts say building it takes."""
    spec = CODEC_SPECS[name]
    if spec.trains_autoencoder:
        return {"trained": trained}
    inputs = {"layout": trained.layout, "mean": _increment(9), "latent_size": 5, "seed": 1}
    if spec.fitted_on_public:
        samples = torch.stack([trained.layout.to_vector(_increment(i)) for i in range(6)])
        inputs.update(samples=samples, latent_size=K)
    return inputs


def test_the_two_halves_of_each_codec_agree():
    assert CODECS == config.CODECS == tuple(CODEC_SPECS)
    assert all(CODEC_REGISTRY[n].spec is CODEC_SPECS[n] for n in CODECS)


@pytest.mark.parametrize("name", CODECS)
def test_codec_contract(name, trained):
    descriptor, spec = CODEC_REGISTRY[name], CODEC_SPECS[name]
    inputs = _codec_inputs(name, trained)
    codec = make_codec(name, **inputs)
    assert isinstance(codec, Codec) and codec.name == name
    state = _increment(1)
    z = codec.encode(state)
    assert z.shape == (codec.latent_size,) and z.dtype == torch.float32
    out = codec.decode(z)
    assert {k: tuple(v.shape) for k, v in out.items()} == SHAPES
    assert all(torch.isfinite(v).all() for v in out.values())
    # building it takes what the facts say, and no more
    if spec.trains_autoencoder:
        with pytest.raises(FedloraError):
            make_codec(name, layout=trained.layout, latent_size=5, seed=1, mean=_increment(9))
    if spec.fitted_on_public:
        with pytest.raises(FedloraError):
            make_codec(name, **{**inputs, "samples": None})
    if spec.needs_public_subspace:
        assert codec.latent_size == K
    # a node's copy encodes as the server's codec, unless the codec is broadcast
    if not descriptor.broadcast:
        node = descriptor.node_copy(codec.layout, codec.latent_size, 1)
        assert node.name == name and torch.equal(node.encode(state), z)
    # the run configuration's rules
    dr = dict(
        mechanism="dr-encoder", noise_multiplier=1.0, codec=name, public_fraction=0.1, public_increments=8
    )
    _assert_check(RunConfig(**dr), spec.needs_public_subspace, "--public-subspace K")
    cfg = RunConfig(**dr, public_subspace=K).check()
    assert cfg.codec_spec is spec and cfg.public_prior == spec.fitted_on_public
    _assert_check(RunConfig(**dr, public_subspace=K, ae_prior="public"), not spec.trains_autoencoder)
    if spec.trains_autoencoder:
        assert RunConfig(**dr, ae_prior="public").check().public_prior


# -- a toy client-level release (a new noise distribution), registered from here ------------------------------


class UniformTopUp(GaussianMechanism):
    """The Gaussian mechanism plus uniform noise U(−a, a) on every coordinate, a = the Gaussian std:
    clients top up their share, the server its own. Adding independent noise to a Gaussian release is
    post-processing, so the round charges the Gaussian event alone (the inherited ``events``)."""

    drawn = 0  # coordinates of uniform noise drawn so far (the test's evidence that this ran)

    def _top_up(self, state: dict, half_width: float) -> dict:
        if half_width == 0:
            return state
        UniformTopUp.drawn += sum(t.numel() for t in state.values())
        return {k: t + half_width * (2 * torch.rand(t.shape, dtype=t.dtype) - 1) for k, t in state.items()}

    def privatize(self, update, noise_std, bound):
        sent, meta = super().privatize(update, noise_std, bound)
        return self._top_up(sent, noise_std), meta

    def round_sum(self, sampled):
        inner, mechanism = super().round_sum(sampled), self

        class TopUp:
            def add(self, reply, weight=None):
                inner.add(reply, weight)

            def release(self):
                mean, sigma = inner.release()
                server = (
                    mechanism.plan.server_sigma * mechanism.clip if mechanism.threat.clear_replies else 0.0
                )
                return mechanism._top_up(mean, server / mechanism.expected_count), sigma

        return TopUp()


TOY_RELEASE = "toy-uniform"


@pytest.fixture()
def toy_release():
    with pytest.raises(FedloraError, match="unknown release"):
        RunConfig(mechanism="dp-fedavg", release=TOY_RELEASE, target_epsilon=8).check()
    register_release(TOY_RELEASE, lambda plan, cfg: UniformTopUp(plan, cfg.expected_cohort))
    yield
    unregister_release(TOY_RELEASE)
    assert TOY_RELEASE not in RELEASE_KINDS


@pytest.mark.heavy
@pytest.mark.slow  # make test-all: a federation per threat model; make test keeps the static checks above
@pytest.mark.parametrize("threat", ["central", "distributed"])
def test_a_new_release_needs_no_edit_outside_its_own_files(toy_release, threat, tmp_path):
    """Adding a client-level release (a new noise distribution) touches at most 3 files: its mechanism
    and one ``register_release`` call; here both are this file. The server's and the client's generic
    halves run it through a whole federation, and the ledger charges its mechanism's events."""
    from common.privacy.accounting.ledger import Ledger
    from tests.harness import TINY, federate, records

    assert files_naming(TOY_RELEASE) == {"tests/system/test_registries.py"}  # <= 3 files
    cfg = RunConfig(
        model="minilm-l6",
        dataset="rotten-tomatoes",
        mechanism="dp-fedavg",
        release=TOY_RELEASE,
        threat_model=threat,
        target_epsilon=8.0,
        clip=0.5,
        sample_rate=1.0,
        out_dir=str(tmp_path / "run"),
        **{**TINY, "rounds": 2},
    ).check()
    before = UniformTopUp.drawn
    federate(cfg)
    train = [r for r in records(tmp_path / "run") if r["phase"] == "train"]
    assert [r["applied"] for r in train] == [True, True] and all(r["replied"] == 2 for r in train)
    assert UniformTopUp.drawn > before  # the toy's noise was drawn (clients' or server's)
    ledger = Ledger.open(tmp_path / "run" / "ledger.sqlite", "client-level")
    plan = UniformTopUp(plan_noise(cfg), cfg.expected_cohort).plan
    assert ledger.events() == [plan.event, plan.event] and all(
        r["mechanism"] == "dp-fedavg" for r in ledger.rows()
    )


# -- a toy release kind that plans its own noise (its family), registered from here -------------------------


class CappedFamily:
    """A toy family: the Gaussian release's event, at most 2 rounds a client, PLD alone."""

    accountants = ("pld",)
    participations = 2

    def round_event(self, plan):
        return Event(plan.sigma, plan.p)

    def round_events(self, plan, rnd):
        return (plan.event,)

    def client_std(self, plan, sampled, clip):
        return plan.threat_std(sampled, clip)

    def participation(self, plan):
        return PoissonSampling(plan.sample_rate)

    def spent_line(self, plan, head, clip, totals):
        return f"{head}, capped at 2 rounds: epsilon {totals['eps_tight']:.4g}"

    def epsilon_after(self, plan, rounds):
        return plan.events_epsilon(min(rounds, self.participations))


def _capped_plan(cfg: RunConfig, dim: int) -> NoisePlan:
    return NoisePlan(1.0, cfg.sample_rate, cfg.clip, cfg.threat_model, cfg.target_epsilon, cfg.delta, True,
                     family=CappedFamily(), sample_rate=cfg.sample_rate)  # fmt: skip


def test_a_release_kind_plans_its_own_noise():
    """A release kind with its own planner (its family: events, accountants, cap, statement line,
    planned ε) is its module and one ``register_release`` call, here both this file: the plan, the
    budget's accountants and the cap are the family's, with no branch on it anywhere."""
    register_release(
        "toy-capped", lambda plan, cfg: GaussianMechanism(plan, cfg.expected_cohort), planner=_capped_plan
    )
    try:
        assert files_naming("toy-capped") == {"tests/system/test_registries.py"}
        cfg = RunConfig(mechanism="dp-fedavg", release="toy-capped", target_epsilon=8.0, rounds=5).check()
        plan = plan_noise(cfg)
        assert isinstance(plan.family, CappedFamily) and plan.sigma == 1.0
        assert plan.participation_cap == 2 and plan.budget_accountants == ("pld",)
        assert plan.budget_keys == ("eps_tight",)
        assert plan.planned_epsilon(1) < plan.planned_epsilon(2) == plan.planned_epsilon(5)
        assert plan.spent_line("client-level (toy", "C 1", {"eps_tight": 1.5}).endswith("epsilon 1.5")
        assert mechanism_for(plan, cfg).plan is plan
    finally:
        unregister_release("toy-capped")
    assert "toy-capped" not in RELEASE_KINDS


# -- a toy stateful mechanism that plans itself, through simulate, the nodes' ledgers and resume -------------


class ShrinkingClip(GaussianMechanism):
    """A toy stateful mechanism: the Gaussian release with a clip that shrinks by 10 % after every
    round, named to the clients in each instruction; the clip is its state (the checkpoint keeps it,
    :meth:`restore` reads it back). ``interrupt_at``: the round whose events it is first asked for
    (before the round is charged) with a KeyboardInterrupt, once: a Ctrl-C between rounds."""

    interrupt_at: int | None = None

    def instruction_clip(self) -> float:
        return self.clip

    def round_clip(self, named: float) -> float:
        return named

    def events(self, rnd: int):
        if rnd == ShrinkingClip.interrupt_at:
            ShrinkingClip.interrupt_at = None
            raise KeyboardInterrupt
        return super().events(rnd)

    def round_sum(self, sampled):
        inner, mechanism = super().round_sum(sampled), self

        class Shrink:
            def add(self, reply, weight=None):
                inner.add(reply, weight)

            def release(self):
                released = inner.release()
                mechanism.clip *= 0.9
                return released

        return Shrink()


def _two_private_rounds(**change) -> RunConfig:
    """A tiny MiniLM federation of two rounds at client-level ε 8 (``change``: the toy's options)."""
    from tests.harness import TINY

    values = dict(model="minilm-l6", dataset="rotten-tomatoes", mechanism="dp-fedavg", target_epsilon=8.0)
    return RunConfig(**values, clip=0.5, sample_rate=1.0, **{**TINY, "rounds": 2}, **change).check()


@pytest.mark.heavy
@pytest.mark.slow  # make test-all: two sessions of one federation
def test_a_stateful_self_planning_mechanism_runs_through_simulate_the_node_ledgers_and_resume(tmp_path):
    """A release kind with its own state (the shrinking clip) and its own plan (:class:`CappedFamily`)
    is this file alone: ``fedlora simulate``'s federation runs it, is interrupted before round 2 and
    resumed; the resumed round names the clip the checkpoint kept (0.9 C, not C), the run's ledger
    holds the family's event once a round, and every node's own release ledger the clip it applied.
    (A crash after a round's charge leaves that round interrupted, its charge standing:
    tests/server/test_resume.py.)"""
    from client.node.state import client_ledger
    from common.privacy.accounting.ledger import Ledger
    from server.simulate import simulate

    register_release("toy-stateful", lambda plan, cfg: ShrinkingClip(plan, cfg.expected_cohort), _capped_plan)
    try:
        assert files_naming("toy-stateful") == {"tests/system/test_registries.py"}
        cfg = _two_private_rounds(release="toy-stateful", threat_model="local")
        run_dir = tmp_path / "run"
        ShrinkingClip.interrupt_at = 2
        with pytest.raises(KeyboardInterrupt):
            simulate(cfg, run_dir)
        simulate(cfg.replace(resume=True, out_dir=str(run_dir)).check(), run_dir)
    finally:
        unregister_release("toy-stateful")
    ledger = Ledger.open(run_dir / "ledger.sqlite", "client-level")
    plan = _capped_plan(cfg, 0)
    assert [r["round"] for r in ledger.rows()] == [1, 2] and ledger.events() == [plan.event] * 2
    for k in range(cfg.num_clients):
        node = client_ledger(run_dir / "nodes" / f"node-{k}", f"rotten-tomatoes/{k}-of-2", cfg.delta)
        assert [(r["round"], r["clip"]) for r in node.rows()] == [(1, 0.5), (2, pytest.approx(0.45))]


# -- a release kind from another installed package, found by every process -------------------------------------


def test_an_installed_package_s_release_kind_reaches_every_process(tmp_path):
    """A package declares its release kind by entry point (registry.PLUGIN_GROUPS); a fresh process
    (what a subprocess node or a SuperNode's ClientApp is) accepts ``--release`` of it, plans with its
    planner and builds its mechanism, with no ``register_release`` call anywhere; its name, like the
    toy's above, appears in no file of the package."""
    import subprocess
    import sys

    (tmp_path / "toy_plugin.py").write_text(
        "from common.privacy.mechanisms.mechanism import GaussianMechanism\n"
        "from common.privacy.planning.plan import plan_noise\n"
        "class Toy(GaussianMechanism):\n"
        "    name = 'toy-plugin'\n"
        "def mechanism(plan, cfg):\n"
        "    return Toy(plan, cfg.expected_cohort)\n"
        "def planner(cfg, dim):\n"
        "    return plan_noise(cfg.replace(release='gaussian'), dim)\n"
    )
    info = tmp_path / "toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fedlora.releases]\ntoy-plugin = toy_plugin:mechanism\n\n"
        "[fedlora.release_planners]\ntoy-plugin = toy_plugin:planner\n"
    )
    probe = (
        "from common.config import RunConfig\n"
        "from common.privacy.mechanisms.mechanism import run_mechanism\n"
        "cfg = RunConfig(mechanism='dp-fedavg', release='toy-plugin', target_epsilon=8.0).check()\n"
        "m = run_mechanism(cfg)\n"
        "print(type(m).__name__, m.plan.target_epsilon)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Toy", "8.0"]
    without = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True)
    assert without.returncode != 0 and "toy-plugin" in without.stderr  # not installed: refused
    assert files_naming("toy-plugin") == {"tests/system/test_registries.py"}


# -- a toy transport (and the threat model that declares it), registered from here ----------------------------


#: rounds the toy transport's server half carried, and replies its node half built
RELAYED: dict[str, list[int]] = {"server": [], "node": []}


def relay_round(ctx, rnd, sampled, state, record):
    """The toy transport's server half: the plain exchange, each round it carries recorded."""
    from server.round import exchange_replies

    RELAYED["server"].append(rnd)
    return exchange_replies(ctx, rnd, sampled, state, record)


class RelayNode:
    """The toy transport's node half: the plain exchange's reply, each one it builds recorded."""

    stages: ClassVar[dict] = {}

    def prepare(self, ins, cfg, context):
        return None

    def reply(self, prepared, ins, cfg, context, out):
        from client.transport import PLAIN

        RELAYED["node"].append(ins.round)
        return PLAIN.reply(prepared, ins, cfg, context, out)


RELAY_NODE = RelayNode()


def test_a_new_transport_needs_no_edit_outside_its_own_files(tmp_path):
    """A transport is its two halves and the threat model that declares it, all in this file: ``fedlora
    simulate`` runs a private federation through it (its server half carries every round, its node
    half builds every reply), and the ledger charges the threat model's guarantee."""
    from common.privacy.accounting.ledger import Ledger
    from common.privacy.participation.threat import (
        CentralNoise,
        TransportSpec,
        register_threat,
        unregister_threat,
    )
    from server.simulate import simulate

    spec = TransportSpec("toy-relay", f"{__name__}:relay_round", f"{__name__}:RELAY_NODE")
    relay = type("RelayCentral", (CentralNoise,), {"name": "toy-relay-central", "transport": spec})()
    register_threat(relay)
    RELAYED["server"].clear(), RELAYED["node"].clear()
    try:
        assert files_naming("toy-relay") == {"tests/system/test_registries.py"}
        cfg = _two_private_rounds(threat_model="toy-relay-central")
        simulate(cfg, tmp_path / "run")
    finally:
        unregister_threat("toy-relay-central")
    assert RELAYED["server"] == [1, 2]
    assert sorted(RELAYED["node"]) == [1] * cfg.num_clients + [2] * cfg.num_clients
    ledger = Ledger.open(tmp_path / "run" / "ledger.sqlite", "client-level")
    assert [r["round"] for r in ledger.rows()] == [1, 2]
    from common.privacy.participation.threat import THREATS, TRANSPORTS_DECLARED

    assert "toy-relay-central" not in THREATS and "toy-relay" not in TRANSPORTS_DECLARED  # torn down
