"""Server optimizers (FedAvgM, FedAdam, FedYogi) against Flower's own strategies and closed forms."""

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server import strategy as legacy
from flwr.serverapp import strategy as serverapp
from flwr.supercore.task_identity import TaskIdentity

from common.errors import FedloraError
from server.aggregate import apply_increment
from server.optimizers import SERVER_OPTIMIZERS, ServerOptimizer, ServerOptimizerSpec

SHAPES = {"l0.lora_A": (4, 6), "l0.lora_B": (5, 4), "l1.lora_A": (3,)}
ROUNDS = 5
#: (kind, lr, beta1, beta2, tau): hyper-parameters away from Flower's defaults
CASES = [
    ("momentum", 0.7, 0.9, 0.0, 0.0),
    ("adam", 0.05, 0.8, 0.95, 1e-2),
    ("yogi", 0.03, 0.85, 0.9, 1e-3),
]


def _spec(kind, lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3):
    return ServerOptimizerSpec(kind=kind, lr=lr, momentum=beta1, beta2=beta2, tau=tau)


def _states(seed, n, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [{k: scale * torch.randn(s, generator=g) for k, s in SHAPES.items()} for _ in range(n)]


def _run(opt, params, deltas):
    for d in deltas:
        params = opt.step(params, d)
    return params


class _Grid:
    """Just enough of a Grid for ``configure_train``: two connected nodes."""

    def get_node_ids(self):
        return [1, 2]


@pytest.fixture
def task_identity(monkeypatch):
    """Flower Messages need a task identity outside a running app."""
    for attr in ("_run_id", "_node_id", "_task_id"):
        monkeypatch.setattr(TaskIdentity, attr, 1)


def _serverapp_strategy(kind, lr, beta1, beta2, tau):
    common = dict(fraction_train=0.5, min_train_nodes=1, min_available_nodes=1)
    if kind == "momentum":
        return serverapp.FedAvgM(server_learning_rate=lr, server_momentum=beta1, **common)
    cls = {"adam": serverapp.FedAdam, "yogi": serverapp.FedYogi}[kind]
    return cls(eta=lr, beta_1=beta1, beta_2=beta2, tau=tau, **common)


def _flower_serverapp(kind, lr, beta1, beta2, tau, params, deltas):
    """Rounds 1..T of the ServerApp strategy: ``configure_train`` with the current arrays, one reply
    whose (weighted) mean is params + delta, ``aggregate_train``. Float64 throughout."""
    strategy = _serverapp_strategy(kind, lr, beta1, beta2, tau)
    x = {k: v.double().numpy() for k, v in params.items()}
    for rnd, delta in enumerate(deltas, start=1):
        (ins,) = strategy.configure_train(
            rnd, ArrayRecord({k: Array(v) for k, v in x.items()}), ConfigRecord(), _Grid()
        )
        new = {k: Array(x[k] + delta[k].double().numpy()) for k in x}
        content = RecordDict({"arrays": ArrayRecord(new), "metrics": MetricRecord({"num-examples": 7})})
        arrays, _ = strategy.aggregate_train(rnd, [Message(content, reply_to=ins)])
        x = {k: np.asarray(a.numpy(), dtype=np.float64) for k, a in arrays.items()}
    return x


def _flower_legacy(kind, lr, beta1, beta2, tau, params, deltas):
    """The same rounds through the legacy ``aggregate_fit`` with one ``FitRes`` per round."""
    names = list(params)
    x = [params[k].double().numpy() for k in names]
    init = ndarrays_to_parameters(x)
    if kind == "momentum":
        strategy = legacy.FedAvgM(initial_parameters=init, server_learning_rate=lr, server_momentum=beta1)
    else:
        cls = {"adam": legacy.FedAdam, "yogi": legacy.FedYogi}[kind]
        strategy = cls(initial_parameters=init, eta=lr, beta_1=beta1, beta_2=beta2, tau=tau)
    for rnd, delta in enumerate(deltas, start=1):
        new = [xi + delta[k].double().numpy() for xi, k in zip(x, names, strict=True)]
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(new), num_examples=7, metrics={})
        out, _ = strategy.aggregate_fit(rnd, [(None, res)], [])
        x = parameters_to_ndarrays(out)
    return dict(zip(names, x, strict=True))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_flower_strategies(case, task_identity):
    """5 rounds on the same random increments: ours (float32) == Flower's serverapp and legacy
    strategies (float64) to float32 rounding, and the two Flower flavours agree with each other."""
    kind, lr, beta1, beta2, tau = case
    (params,) = _states(0, 1)
    deltas = _states(1, ROUNDS, scale=0.3)
    ours = _run(ServerOptimizer(ServerOptimizerSpec(kind, lr, beta1, beta2, tau)), params, deltas)
    app = _flower_serverapp(kind, lr, beta1, beta2, tau, params, deltas)
    old = _flower_legacy(kind, lr, beta1, beta2, tau, params, deltas)
    for name in SHAPES:
        np.testing.assert_allclose(app[name], old[name], rtol=1e-12, atol=1e-12)
        assert ours[name].dtype == torch.float32
        np.testing.assert_allclose(ours[name].double().numpy(), app[name], rtol=2e-5, atol=2e-6)
        # the server optimizer actually moved the params away from plain FedAvg
        plain = params[name] + sum(d[name] for d in deltas)
        assert not torch.allclose(ours[name], plain, atol=1e-3)


def test_sgd_one_step_is_apply_increment():
    (params,) = _states(2, 1)
    (delta,) = _states(3, 1)
    opt = ServerOptimizer(_spec("sgd", lr=0.6))
    new = opt.step(params, delta)
    for name in SHAPES:
        torch.testing.assert_close(new[name], params[name] + 0.6 * delta[name], rtol=0, atol=0)
        assert torch.equal(new[name], apply_increment(params, delta, 0.6)[name])
    assert opt.steps == 1 and opt.state_tensors() == {}


def test_momentum_two_steps_by_hand():
    x0, d1, d2 = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25]), torch.tensor([-1.0, 2.0])
    opt = ServerOptimizer(_spec("momentum", lr=0.5, beta1=0.9))
    x1 = opt.step({"w": x0}, {"w": d1})["w"]
    # b1 = -d1; x1 = x0 - lr*b1 = x0 + 0.5 d1
    torch.testing.assert_close(x1, torch.tensor([1.25, -1.875]))
    x2 = opt.step({"w": x1}, {"w": d2})["w"]
    # b2 = 0.9 b1 - d2 = [-0.45 + 1, -0.225 - 2]; x2 = x1 - 0.5 b2
    torch.testing.assert_close(x2, torch.tensor([1.25 - 0.5 * 0.55, -1.875 + 0.5 * 2.225]))
    torch.testing.assert_close(opt.state_tensors()["m/w"], torch.tensor([0.55, -2.225]))


def test_adam_first_step_by_hand():
    b1, b2, tau, lr = 0.9, 0.99, 1e-3, 0.1
    x0, d = torch.tensor([1.0, 0.0, -3.0]), torch.tensor([0.2, -0.5, 0.0])
    opt = ServerOptimizer(_spec("adam", lr=lr, beta1=b1, beta2=b2, tau=tau))
    x1 = opt.step({"w": x0}, {"w": d})["w"]
    m, v = (1 - b1) * d, (1 - b2) * d * d
    # Flower's bias correction at server round 1 uses exponent 2
    eta = lr * math.sqrt(1 - b2**2) / (1 - b1**2)
    torch.testing.assert_close(x1, x0 + eta * m / (v.sqrt() + tau))
    # numerically: sign(d) * eta * 0.1 |d| / (0.1 |d| + tau)
    torch.testing.assert_close(
        x1, torch.tensor([1.0 + eta * 0.02 / 0.021, -eta * 0.05 / 0.051, -3.0]), rtol=1e-6, atol=1e-7
    )
    state = opt.state_tensors()
    assert set(state) == {"m/w", "v/w"}
    torch.testing.assert_close(state["v/w"], v)


def test_yogi_first_step_by_hand():
    b1, b2, tau, lr = 0.9, 0.99, 1e-3, 0.1
    x0, d = torch.tensor([1.0, -1.0]), torch.tensor([0.3, -0.4])
    x1 = ServerOptimizer(_spec("yogi", lr=lr, beta1=b1, beta2=b2, tau=tau)).step({"w": x0}, {"w": d})["w"]
    # v0 = 0 -> v1 = (1-b2) d^2, no bias correction
    torch.testing.assert_close(x1, x0 + lr * (1 - b1) * d / ((1 - b2) ** 0.5 * d.abs() + tau))


@pytest.mark.parametrize("kind", SERVER_OPTIMIZERS)
def test_state_round_trip_is_exact(kind):
    (params,) = _states(4, 1)
    deltas = _states(5, 5, scale=0.2)
    a = ServerOptimizer(_spec(kind, lr=0.3, beta1=0.8, beta2=0.9, tau=1e-2))
    assert a.state_tensors() == {}
    xa = _run(a, params, deltas[:3])
    saved, steps = a.state_tensors(), a.steps
    assert steps == 3
    assert set(saved) == {
        f"{key}/{name}"
        for key in {"sgd": "", "momentum": "m", "adam": "mv", "yogi": "mv"}[kind]
        for name in SHAPES
    }
    b = ServerOptimizer(_spec(kind, lr=0.3, beta1=0.8, beta2=0.9, tau=1e-2))
    b.load_state({k: v.clone() for k, v in saved.items()}, steps)
    xb = {k: v.clone() for k, v in xa.items()}
    xa, xb = _run(a, xa, deltas[3:]), _run(b, xb, deltas[3:])
    assert a.steps == b.steps == 5
    for name in SHAPES:
        assert torch.equal(xa[name], xb[name])
    for name, t in a.state_tensors().items():
        assert torch.equal(t, b.state_tensors()[name])


def _saved(kind, steps=2):
    opt = ServerOptimizer(_spec(kind))
    (params,) = _states(6, 1)
    _run(opt, params, _states(7, steps))
    return opt.state_tensors(), opt.steps, params


@pytest.mark.parametrize("kind", ["momentum", "adam", "yogi"])
def test_mismatched_state_raises(kind):
    state, steps, params = _saved(kind)
    fresh = lambda: ServerOptimizer(_spec(kind))  # noqa: E731
    bad_names = [
        {**state, "x/l0.lora_A": state["m/l0.lora_A"]},  # unknown moment
        {"l0.lora_A" if k == "m/l0.lora_A" else k: v for k, v in state.items()},  # no prefix
        {},  # moments missing after steps > 0
    ]
    if kind != "momentum":
        bad_names.append({k: v for k, v in state.items() if k != "v/l1.lora_A"})  # m and v disagree
        bad_names.append({k: v for k, v in state.items() if k.startswith("m/")})  # v missing
    else:
        bad_names.append({**state, **{f"v/{n}": torch.zeros(s) for n, s in SHAPES.items()}})
    for bad in bad_names:
        with pytest.raises(FedloraError):
            fresh().load_state(bad, steps)
    with pytest.raises(FedloraError):
        fresh().load_state(state, 0)  # moments but no steps
    with pytest.raises(FedloraError):
        fresh().load_state(state, -1)
    # the wrong shape everywhere, or names of another adapter: caught on the next step
    (delta,) = _states(8, 1)
    wrong_shape = {k: torch.zeros(7, 2) if k.endswith("/l0.lora_B") else v for k, v in state.items()}
    other = {k.replace("l1.", "l9."): v for k, v in state.items()}
    for bad in (wrong_shape, other):
        opt = fresh()
        opt.load_state(bad, steps)
        with pytest.raises(FedloraError):
            opt.step(params, delta)
    if kind != "momentum":
        mixed = {k: torch.zeros(7, 2) if k == "v/l0.lora_B" else v for k, v in state.items()}
        with pytest.raises(FedloraError):
            fresh().load_state(mixed, steps)


def test_sgd_takes_no_moments_and_unknown_kind_raises():
    with pytest.raises(FedloraError):
        ServerOptimizer(_spec("sgd")).load_state({"m/w": torch.zeros(2)}, 1)
    ServerOptimizer(_spec("sgd")).load_state({}, 4)
    with pytest.raises(FedloraError, match="unknown server optimizer"):
        ServerOptimizer(_spec("lamb"))


@pytest.mark.parametrize("kind", SERVER_OPTIMIZERS)
def test_step_does_not_mutate_inputs_and_keeps_dtype(kind):
    (params,) = _states(9, 1)
    params = {k: v.to(torch.bfloat16) if k == "l1.lora_A" else v for k, v in params.items()}
    deltas = _states(10, 3, scale=0.5)
    before_p = {k: v.clone() for k, v in params.items()}
    before_d = [{k: v.clone() for k, v in d.items()} for d in deltas]
    opt = ServerOptimizer(_spec(kind))
    for i, d in enumerate(deltas, start=1):
        new = opt.step(params, d)
        assert opt.steps == i
        for k in SHAPES:
            assert new[k].dtype == params[k].dtype and new[k].shape == params[k].shape
            assert new[k].data_ptr() != params[k].data_ptr()
    for k in SHAPES:
        assert torch.equal(params[k], before_p[k])
        for d, b in zip(deltas, before_d, strict=True):
            assert torch.equal(d[k], b[k])
    # the saved state is a copy: changing it does not change the optimizer
    saved = opt.state_tensors()
    for t in saved.values():
        t.add_(1.0)
    for k, t in opt.state_tensors().items():
        assert torch.equal(t + 1.0, saved[k])
