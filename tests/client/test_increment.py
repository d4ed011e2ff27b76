"""The client's increment forms (client/increment.py): raw difference and the horizontal gauge-fixed lift."""

from __future__ import annotations

import pytest
import torch

from client.increment import increment

M, N, R = 7, 5, 3


def _states(seed: int = 0, zero_a: bool = False) -> tuple[dict, dict]:
    g = torch.Generator().manual_seed(seed)
    start = {
        "m.A": torch.zeros(M, R, dtype=torch.float64)
        if zero_a
        else torch.randn(M, R, generator=g, dtype=torch.float64),
        "m.B": torch.randn(N, R, generator=g, dtype=torch.float64),
        "head.weight": torch.randn(2, 4, generator=g, dtype=torch.float64),
    }
    local = {k: v + 0.1 * torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in start.items()}
    return start, local


def _first_order(start: dict, inc: dict) -> torch.Tensor:
    return inc["m.A"] @ start["m.B"].T + start["m.A"] @ inc["m.B"].T


def test_raw_is_the_difference():
    start, local = _states()
    inc = increment(local, start, "raw")
    for k in start:
        torch.testing.assert_close(inc[k], local[k] - start[k])


def test_horizontal_keeps_first_order_change_and_is_horizontal():
    start, local = _states(1)
    raw, hor = increment(local, start, "raw"), increment(local, start, "horizontal")
    torch.testing.assert_close(_first_order(start, hor), _first_order(start, raw))
    # the horizontal gauge: Aᵀ dA = dBᵀ B (PRISM Eq. 30; docs/design.md §7.6)
    torch.testing.assert_close(start["m.A"].T @ hor["m.A"], hor["m.B"].T @ start["m.B"])
    torch.testing.assert_close(hor["head.weight"], raw["head.weight"])  # dense entries stay raw
    assert not torch.allclose(hor["m.A"], raw["m.A"])
    # the minimum-factor-norm lift of that change
    norm = lambda d: float(d["m.A"].square().sum() + d["m.B"].square().sum())  # noqa: E731
    assert norm(hor) <= norm(raw) + 1e-12


def test_horizontal_removes_any_vertical_component():
    """Raw increments that differ by a gauge direction (AΩ, −BΩᵀ) give the same horizontal increment."""
    start, local = _states(2)
    omega = torch.randn(R, R, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    shifted = dict(local)
    shifted["m.A"] = local["m.A"] + start["m.A"] @ omega
    shifted["m.B"] = local["m.B"] - start["m.B"] @ omega.T
    a, b = increment(local, start, "horizontal"), increment(shifted, start, "horizontal")
    assert not torch.allclose(increment(local, start, "raw")["m.A"], increment(shifted, start, "raw")["m.A"])
    for k in start:
        torch.testing.assert_close(a[k], b[k])
    again = increment({k: start[k] + a[k] for k in start}, start, "horizontal")  # idempotent
    for k in start:
        torch.testing.assert_close(again[k], a[k])


def test_horizontal_at_peft_init():
    """A = 0 (PEFT's lora_B = 0): dA is kept, dB is projected off span(B); finite, same dtype."""
    start, local = _states(4, zero_a=True)
    raw = increment(local, start, "raw")
    start32 = {k: v.float() for k, v in start.items()}
    hor = increment({k: v.float() for k, v in local.items()}, start32, "horizontal")
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in hor.values())
    torch.testing.assert_close(hor["m.A"], raw["m.A"].float())
    Q = torch.linalg.qr(start["m.B"]).Q
    expected = raw["m.B"] - Q @ (Q.T @ raw["m.B"])
    torch.testing.assert_close(hor["m.B"], expected.float(), atol=1e-5, rtol=1e-4)


def test_unknown_form():
    start, local = _states()
    with pytest.raises(ValueError, match="unknown increment form"):
        increment(local, start, "balanced")


@pytest.mark.heavy
def test_client_app_sends_the_configured_form(tmp_path):
    """The real ClientApp (one in-process node, 2 local steps): a horizontal run's reply is horizontal."""
    from common.config import to_flat
    from common.lazy import load_component
    from common.presets import preset
    from server.bench.codec import collect_increments
    from server.evaluation import Evaluator
    from server.inprocess import InProcessGrid
    from server.simulate import CLIENT_APP

    cfg = preset(
        "minilm-rt",
        num_clients=1,
        local_steps=2,
        batch_size=8,
        max_train_examples=100,
        eval_examples=20,
        rank=2,
        lora_init="balanced",
        increment_form="horizontal",
    ).check()
    state = Evaluator(cfg).initial_state()
    grid = InProcessGrid(load_component(CLIENT_APP), 1, to_flat(cfg), state_root=tmp_path)
    (inc,) = collect_increments(grid, cfg, sorted(grid.get_node_ids()), state)
    modules = [k[:-2] for k in state if k.endswith(".A")]
    assert modules
    for m in modules:
        A, B, dA, dB = (t.double() for t in (state[m + ".A"], state[m + ".B"], inc[m + ".A"], inc[m + ".B"]))
        assert dA.abs().max() > 0
        lhs, rhs = A.T @ dA, dB.T @ B
        assert float((lhs - rhs).norm()) <= 1e-4 * float(lhs.norm() + rhs.norm())
