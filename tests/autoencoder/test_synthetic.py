"""DR-Encoder Algorithm 1 statistics and the synthetic Gaussian generator."""

import math

import pytest
import torch

from autoencoder.synthetic import (
    BETA1,
    BETA2,
    H1,
    H2,
    GradStats,
    check_stats,
    export_all,
    prior_moments,
    sample_gradients,
    track,
    update_all,
)
from common.errors import FedloraError

pytestmark = pytest.mark.usefixtures("one_thread")


def test_constants_are_the_papers():
    assert (BETA1, BETA2, H1, H2) == (0.99, 0.9, 1e-5, 1e-3)


def test_first_steps_by_hand():
    # X1 = 0.5: m = 0.01·0.5 = 0.005, (0.5 − 0.005)² = 0.245 → clamped to h2 = 1e-3, s² = 0.1·1e-3 = 1e-4
    st = GradStats.zeros((1, 1)).update(torch.tensor([[0.5]], dtype=torch.float64))
    assert st.m.item() == pytest.approx(0.005, abs=1e-15)
    assert st.s2.item() == pytest.approx(1e-4, abs=1e-15)
    # X2 = 0.0052: m = 0.99·0.005 + 0.01·0.0052 = 0.005002, (0.0052 − 0.005002)² ≈ 3.9e-8 → clamped to h1
    st.update(torch.tensor([[0.0052]], dtype=torch.float64))
    assert st.m.item() == pytest.approx(0.005002, abs=1e-15)
    assert st.s2.item() == pytest.approx(0.9 * 1e-4 + 0.1 * 1e-5, abs=1e-15)


def _closed_form(xs: list[float], matrix_mean_of: int = 1, h1: float = H1) -> tuple[float, float]:
    """m_T = (1−β1) Σ β1^{T−t} X_t; s²_T = (1−β2) Σ β2^{T−t} clamp((X_t − m_t)², h1, h2)."""
    T = len(xs)
    ms = [(1 - BETA1) * sum(BETA1 ** (t - i) * xs[i] for i in range(t + 1)) for t in range(T)]
    vs = [min(max((xs[t] - ms[t]) ** 2, h1), H2) for t in range(T)]
    s2 = (1 - BETA2) * sum(BETA2 ** (T - 1 - t) * vs[t] for t in range(T))
    return ms[-1], s2


def test_recursion_matches_closed_form_per_element():
    # each entry exercises a different clamp regime: above h2, below h1, in between
    seqs = [
        [0.5, -0.2, 0.1, 0.05, 0.3],
        [0.001, 0.0011, 0.001, 0.0012, 0.0009],
        [0.02, -0.01, 0.025, 0.0, 0.015],
    ]
    st = GradStats.zeros((3, 1))
    for t in range(5):
        st.update(torch.tensor([[s[t]] for s in seqs], dtype=torch.float64))
    assert st.steps == 5
    for i, seq in enumerate(seqs):
        m, s2 = _closed_form(seq)
        assert st.m[i, 0].item() == pytest.approx(m, rel=1e-12)
        assert st.s2[i, 0].item() == pytest.approx(s2, rel=1e-12)
    regimes = [(s[-1] - _closed_form(s)[0]) ** 2 for s in seqs]
    assert regimes[0] > H2 and regimes[1] < H1 and H1 < regimes[2] < H2


def test_a_lower_floor_keeps_small_deviations():
    """With the paper's h1 an increment-sized sequence (entries ~1e-3) only sees the floor; h1 = 1e-9 keeps it."""
    seq = [0.001, 0.0011, 0.001, 0.0012, 0.0009]
    paper, low = GradStats.zeros((1, 1)), GradStats.zeros((1, 1), floor=1e-9)
    for x in seq:
        paper.update(torch.tensor([[x]], dtype=torch.float64))
        low.update(torch.tensor([[x]], dtype=torch.float64))
    assert paper.s2.item() == pytest.approx(H1 * (1 - BETA2**5), rel=1e-12)  # every step clamped to h1
    assert low.s2.item() == pytest.approx(_closed_form(seq, h1=1e-9)[1], rel=1e-12)
    assert low.s2.item() < paper.s2.item() / 5
    for bad in (0.0, -1e-6, 2 * H2):
        with pytest.raises(FedloraError, match="floor"):
            GradStats.zeros((1, 1), floor=bad)
    assert {st.floor for st in track({"a": (2, 1), "b": (3, 1)}, floor=1e-7).values()} == {1e-7}


def test_matrix_deviation_clamps_the_mean_square():
    xs = [torch.tensor([[0.03, -0.01], [0.02, 0.0]]), torch.tensor([[0.01, 0.02], [-0.03, 0.04]])]
    st = GradStats.zeros((2, 2), deviation="matrix")
    m = torch.zeros(2, 2, dtype=torch.float64)
    s2 = 0.0
    for x in xs:
        st.update(x)
        m = BETA1 * m + (1 - BETA1) * x.double()
        s2 = BETA2 * s2 + (1 - BETA2) * min(max(float(((x.double() - m) ** 2).mean()), H1), H2)
    assert st.s2.shape == ()
    assert torch.allclose(st.m, m) and st.s2.item() == pytest.approx(s2, rel=1e-12)


def test_export_granularities_pool_moments():
    m = torch.tensor([[1.0, 2.0, 3.0], [5.0, 6.0, 7.0]], dtype=torch.float64)
    s2 = torch.tensor([[1.0, 1.0, 4.0], [4.0, 9.0, 9.0]], dtype=torch.float64)
    st = GradStats(m, s2, steps=3)
    mean, std = st.export("element")
    assert torch.equal(mean, m.float()) and torch.equal(std, s2.sqrt().float())
    mean, std = st.export("matrix")
    assert mean.shape == () and mean.item() == pytest.approx(4.0)
    # ⟨s²⟩ = 28/6, ⟨(m − 4)²⟩ = (9 + 4 + 1 + 1 + 4 + 9)/6 = 28/6
    assert std.item() == pytest.approx(math.sqrt(56 / 6), rel=1e-6)
    mean, std = st.export("row")
    assert mean.shape == (2, 1) and mean.flatten().tolist() == [2.0, 6.0]
    assert std.flatten().tolist() == pytest.approx(
        [math.sqrt(2 + 2 / 3), math.sqrt(22 / 3 + 2 / 3)], rel=1e-6
    )
    mean, std = st.export("column")
    assert mean.shape == (1, 3) and mean.flatten().tolist() == [3.0, 4.0, 5.0]
    assert std.flatten().tolist() == pytest.approx([math.sqrt(2.5 + 4), math.sqrt(5 + 4), math.sqrt(6.5 + 4)])
    assert mean.dtype == std.dtype == torch.float32


def test_debias_recovers_a_constant_gradient():
    st = GradStats.zeros((2, 2))
    for _ in range(3):
        st.update(torch.full((2, 2), 0.25))
    assert st.export("matrix")[0].item() == pytest.approx(0.25 * (1 - BETA1**3))
    assert st.export("matrix", debias=True)[0].item() == pytest.approx(0.25)


def test_errors():
    with pytest.raises(FedloraError):
        GradStats.zeros((2, 2)).export()
    with pytest.raises(FedloraError):
        GradStats.zeros((2, 2)).update(torch.zeros(2, 3))
    with pytest.raises(FedloraError):
        GradStats.zeros((2, 2), deviation="frobenius")
    with pytest.raises(FedloraError):
        GradStats.zeros((2, 2)).update(torch.zeros(2, 2)).export("block")
    stats = track({"l.A": (3, 2)})
    with pytest.raises(FedloraError):
        update_all(stats, {"l.B": torch.zeros(3, 2)})


def test_track_update_export_all():
    shapes = {"l.A": (4, 2), "l.B": (3, 2)}
    stats = track(shapes)
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        update_all(stats, {k: torch.randn(s, generator=g) for k, s in shapes.items()})
    out = export_all(stats, "column")
    assert set(out) == set(shapes) and all(m.shape == (1, 2) and s.shape == (1, 2) for m, s in out.values())
    check_stats(out, shapes)


STATS = {
    "elem.A": (
        torch.tensor([[0.5, -1.0], [2.0, 0.0], [0.0, 3.0]]),
        torch.tensor([[0.1, 1.0], [0.5, 2.0], [0.01, 0.3]]),
    ),
    "scalar.B": (torch.tensor(-0.2), torch.tensor(0.7)),
    "row.A": (torch.tensor([[1.0], [-1.0]]), torch.tensor([[0.2], [0.4]])),
    "col.B": (torch.tensor([[0.0, 5.0, -5.0]]), torch.tensor([[1.0, 0.5, 2.0]])),
}
SHAPES = {"elem.A": (3, 2), "scalar.B": (2, 3), "row.A": (2, 4), "col.B": (2, 3)}


def test_generator_matches_requested_moments():
    n = 20000
    out = sample_gradients(STATS, SHAPES, n, torch.Generator().manual_seed(1))
    for name, shape in SHAPES.items():
        x = out[name]
        assert x.shape == (n, *shape) and x.dtype == torch.float32
        mean, std = (t.expand(shape) for t in STATS[name])
        # sample mean: 5 standard errors; sample std: relative error ~ 1/sqrt(2n) ≈ 0.5%, allow 3%
        assert torch.all((x.mean(0) - mean).abs() <= 5 * std / math.sqrt(n) + 1e-6), name
        assert torch.allclose(x.std(0), std, rtol=0.03, atol=1e-4), name


def test_generator_is_seeded():
    a = sample_gradients(STATS, SHAPES, 3, torch.Generator().manual_seed(7))
    b = sample_gradients(STATS, SHAPES, 3, torch.Generator().manual_seed(7))
    c = sample_gradients(STATS, SHAPES, 3, torch.Generator().manual_seed(8))
    assert all(torch.equal(a[k], b[k]) for k in SHAPES)
    assert not torch.equal(a["elem.A"], c["elem.A"])


@pytest.mark.parametrize(
    "bad",
    [
        {"elem.A": (torch.zeros(3, 3), torch.ones(()))},
        {"elem.A": (torch.zeros(()), -torch.ones(()))},
        {"elem.A": (torch.tensor(float("nan")), torch.ones(()))},
        {"elem.A": (torch.zeros(2, 3, 2), torch.ones(()))},
        {},
    ],
)
def test_bad_statistics_are_refused(bad):
    with pytest.raises(FedloraError):
        sample_gradients(bad, {"elem.A": (3, 2)}, 2, torch.Generator())


def test_prior_moments_of_a_mixture():
    s1 = {"l.A": (torch.tensor(1.0), torch.tensor(1.0))}
    s2 = {"l.A": (torch.tensor(3.0), torch.tensor(2.0))}
    first, second = prior_moments([s1, s2], {"l.A": (2, 2)})
    assert torch.allclose(first["l.A"], torch.full((2, 2), 2.0))
    assert torch.allclose(second["l.A"], torch.full((2, 2), (1 + 1 + 9 + 4) / 2))
