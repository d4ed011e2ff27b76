"""PRISM math (client/dp/prism): the properties listed in docs/design.md §7.10 (items 1–10), plus the
init and eigh fallback.

Dense ``m × n`` matrices appear only here, as references. float64 where exactness matters.
"""

from __future__ import annotations

import math

import pytest
import scipy.linalg
import torch

from client.dp.prism import (
    AdaptiveSettings,
    adaptive_direction,
    balanced_random_init,
    clip_coefficients,
    dp_floors,
    geometry,
    horizontalize,
    init_moments,
    lift,
    noise_second_moments,
    preconditioner,
    procrustes_align,
    psd_eigh,
    retract,
    spectral_init,
    tangent_noise,
    tangent_sq_norm,
)

F64 = torch.float64


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=F64)


def factors(m: int, n: int, r: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return randn(m, r, g=g), randn(n, r, g=g)


def orthogonal(r: int, g: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(randn(r, r, g=g)).Q


def well_conditioned(r: int, g: torch.Generator) -> torch.Tensor:
    """A random R ∈ GL(r) with singular values in [0.5, 2]."""
    return orthogonal(r, g) @ torch.diag(torch.linspace(0.5, 2.0, r, dtype=F64)) @ orthogonal(r, g)


def dense_projection(A: torch.Tensor, B: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """P_{A,B}(G) = Π_A G + G Π_B − Π_A G Π_B (PRISM Eq. 13), dense."""
    PA, PB = A @ torch.linalg.pinv(A), B @ torch.linalg.pinv(B)
    return PA @ G + G @ PB - PA @ G @ PB


def dense(A: torch.Tensor, B: torch.Tensor, dA: torch.Tensor, dB: torch.Tensor) -> torch.Tensor:
    """ΔZ = dA Bᵀ + A dBᵀ, dense (batched over leading dims)."""
    return dA @ B.mT + A @ dB.mT


def gauge(A: torch.Tensor, B: torch.Tensor, R: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return A @ R, B @ torch.linalg.inv(R).mT


def test_1_lift_reproduces_dense_projection():
    g = gen(1)
    A, B = factors(12, 9, 3, g)
    G = randn(5, 12, 9, g=g)
    dA, dB = lift(geometry(A, B), G @ B, G.mT @ A)
    assert dA.shape == (5, 12, 3) and dB.shape == (5, 9, 3)
    torch.testing.assert_close(dense(A, B, dA, dB), dense_projection(A, B, G), atol=1e-10, rtol=0)
    # Low-precision inputs are promoted to float32.
    geo32 = geometry(A.bfloat16(), B.half())
    assert geo32.A.dtype == geo32.M_pinv.dtype == torch.float32
    assert lift(geo32, (G[0] @ B).bfloat16(), G[0].mT @ A)[1].dtype == torch.float32


def test_2_intrinsic_norm_eq15_and_lift_free_formula():
    g = gen(2)
    A, B = factors(12, 9, 3, g)
    G = randn(5, 12, 9, g=g)
    gA, gB = G @ B, G.mT @ A
    geo = geometry(A, B)
    dA, dB = lift(geo, gA, gB)
    expected = dense_projection(A, B, G).square().sum((-2, -1))
    norms = tangent_sq_norm(geo, dA, dB)
    assert norms.shape == (5,)
    torch.testing.assert_close(norms, expected, atol=1e-9, rtol=1e-12)
    torch.testing.assert_close(tangent_sq_norm(geo, dA[0], dB[0]), expected[0], atol=1e-9, rtol=1e-12)
    # Lift-free: g̃_A = g_A R_B⁻¹ = G Q_B, g̃_B = g_B R_A⁻¹ = Gᵀ Q_A (docs/design.md §7.2).
    QA, RA = torch.linalg.qr(A)
    _, RB = torch.linalg.qr(B)
    tA = torch.linalg.solve_triangular(RB, gA, upper=True, left=False)
    tB = torch.linalg.solve_triangular(RA, gB, upper=True, left=False)
    lift_free = tA.square().sum((-2, -1)) + tB.square().sum((-2, -1)) - (QA.mT @ tA).square().sum((-2, -1))
    torch.testing.assert_close(lift_free, expected, atol=1e-9, rtol=1e-12)


def test_3_global_clipping_is_gauge_invariant():
    g = gen(3)
    shapes, r, b = [(10, 8), (7, 11)], 3, 8
    mods = [factors(m, n, r, g) for m, n in shapes]
    scales = torch.logspace(-1, 1, b, dtype=F64)[:, None, None]
    Gs = [scales * randn(b, m, n, g=g) for m, n in shapes]

    def clipped(mods, clip):
        lifts = [lift(geometry(A, B), G @ B, G.mT @ A) for (A, B), G in zip(mods, Gs, strict=True)]
        sq = [tangent_sq_norm(geometry(A, B), *d) for (A, B), d in zip(mods, lifts, strict=True)]
        alpha = clip_coefficients(sq, clip)
        means = [
            dense(A, B, *(torch.einsum("b,bkr->kr", alpha, x) / b for x in d))
            for (A, B), d in zip(mods, lifts, strict=True)
        ]
        return alpha, means, torch.stack(sq).sum(0)

    _, _, total = clipped(mods, 1.0)
    clip = float(total.sqrt().median())
    alpha, means, total = clipped(mods, clip)
    assert (alpha < 1).any() and (alpha == 1).any()
    assert bool(((alpha * total.sqrt()) <= clip * (1 + 1e-12)).all())
    gauged = [gauge(A, B, well_conditioned(r, g)) for A, B in mods]
    alpha_g, means_g, _ = clipped(gauged, clip)
    torch.testing.assert_close(alpha_g, alpha, atol=0, rtol=1e-9)
    for mean, mean_g in zip(means, means_g, strict=True):
        torch.testing.assert_close(mean_g, mean, atol=1e-10, rtol=1e-9)
    # Contrast (Issue I): the factor-space norm ‖g_A‖² + ‖g_B‖² is not gauge invariant.
    (A, B), (Ag, Bg), G = mods[0], gauged[0], Gs[0][0]
    factor_norm = (G @ B).square().sum() + (G.mT @ A).square().sum()
    assert abs(float((G @ Bg).square().sum() + (G.mT @ Ag).square().sum() - factor_norm)) > 1e-3 * float(
        factor_norm
    )


def sample_intrinsic(A: torch.Tensor, B: torch.Tensor, draws: int, seed: int) -> torch.Tensor:
    """``draws`` samples of Ξ_A Bᵀ + A Ξ_Bᵀ from the Eq. 19 sampler: (draws, m, n)."""
    geo, g = geometry(A, B), gen(seed)
    return torch.stack([dense(A, B, *tangent_noise(geo, g)) for _ in range(draws)])


def test_4_sampler_energy_and_covariance_are_gauge_invariant():
    g = gen(4)
    m, n, r = 30, 20, 4
    A, B = factors(m, n, r, g)
    for a, b in [
        (A, B),
        gauge(A, B, well_conditioned(r, g)),
        gauge(A, B, torch.diag(torch.tensor([0.1, 1, 3, 10], dtype=F64))),
    ]:
        energy = sample_intrinsic(a, b, 4000, seed=40).square().sum((-2, -1)).mean()
        assert abs(float(energy) / (r * (m + n - r)) - 1) < 0.02
    # Covariance = Eq. 46 with column-major vec: (I_n ⊗ Π_A) + (Π_B ⊗ I_m) − (Π_B ⊗ Π_A).
    m, n, r = 4, 3, 2
    A, B = factors(m, n, r, g)
    PA, PB = A @ torch.linalg.pinv(A), B @ torch.linalg.pinv(B)
    eq46 = (
        torch.kron(torch.eye(n, dtype=F64), PA) + torch.kron(PB, torch.eye(m, dtype=F64)) - torch.kron(PB, PA)
    )
    basis = torch.eye(m * n, dtype=F64).reshape(m * n, n, m).mT  # column-major unvec of each unit vector
    torch.testing.assert_close(dense_projection(A, B, basis).mT.reshape(m * n, m * n).T, eq46)
    assert round(float(torch.trace(eq46))) == r * (m + n - r)
    for a, b in [(A, B), gauge(A, B, well_conditioned(r, g))]:
        vecs = sample_intrinsic(a, b, 20000, seed=41).mT.reshape(-1, m * n)
        cov = vecs.T @ vecs / vecs.shape[0]
        assert float((cov - eq46).abs().max()) < 0.05


def test_5_rank_space_noise_moments():
    g = gen(5)
    m, n, r, draws = 12, 10, 3, 10000
    A, B = factors(m, n, r, g)
    geo, g = geometry(A, B), gen(50)
    XA, XB = zip(*(tangent_noise(geo, g) for _ in range(draws)), strict=True)
    XA, XB = torch.stack(XA), torch.stack(XB)
    emp_A = (XA.mT @ XA).mean(0) / m
    emp_B = (XB.mT @ XB).mean(0) / n
    th_A = (m - r) / m * torch.linalg.inv(geo.N)
    th_B = torch.linalg.inv(geo.M)
    assert float(torch.linalg.norm(emp_A - th_A) / torch.linalg.norm(th_A)) < 0.03
    assert float(torch.linalg.norm(emp_B - th_B) / torch.linalg.norm(th_B)) < 0.03
    EA, EB = noise_second_moments(geo, tau=1.0)
    torch.testing.assert_close(EA, th_A, atol=0, rtol=1e-6)
    torch.testing.assert_close(EB, th_B, atol=0, rtol=1e-6)
    # tr(N⁻¹), tr(M⁻¹) are only O(r)-invariant (the floors inherit that).
    Ag, Bg = gauge(A, B, orthogonal(r, g))
    torch.testing.assert_close(dp_floors(geometry(Ag, Bg), 0.3, "geometry"), dp_floors(geo, 0.3, "geometry"))


def test_6_retraction_matches_dense_svd_balanced_and_procrustes():
    g = gen(6)
    m, n, r, eta = 15, 11, 3, 0.3
    A, B = factors(m, n, r, g)
    UA, UB = factors(m, n, r, g)
    X = A @ B.mT - eta * dense(A, B, UA, UB)
    U, S, Vh = torch.linalg.svd(X)
    Xr = U[:, :r] @ torch.diag(S[:r]) @ Vh[:r]
    An, Bn = retract(A, B, UA, UB, eta, align=False)
    torch.testing.assert_close(An @ Bn.mT, Xr, atol=1e-10, rtol=0)
    torch.testing.assert_close(An.mT @ An, torch.diag(S[:r]), atol=1e-10, rtol=0)
    torch.testing.assert_close(Bn.mT @ Bn, torch.diag(S[:r]), atol=1e-10, rtol=0)
    Aa, Ba = retract(A, B, UA, UB, eta)
    torch.testing.assert_close(Aa @ Ba.mT, Xr, atol=1e-10, rtol=0)
    torch.testing.assert_close(Aa.mT @ Aa, Ba.mT @ Ba, atol=1e-10, rtol=0)

    def dist(a, b):
        return float((a - A).square().sum() + (b - B).square().sum())

    assert dist(Aa, Ba) <= dist(An, Bn)
    for _ in range(20):
        Q = orthogonal(r, g)
        assert dist(Aa, Ba) <= dist(An @ Q, Bn @ Q) + 1e-12
    torch.testing.assert_close(procrustes_align(Aa, Ba, A, B)[0], Aa)
    # Fewer than r singular values (min(m, n) < r): zero-padded, exact.
    A, B = factors(3, 5, 4, g)
    UA, UB = factors(3, 5, 4, g)
    An, Bn = retract(A, B, UA, UB, 0.2, align=False)
    assert An.shape == (3, 4) and Bn.shape == (5, 4)
    assert float(An[:, 3].abs().max()) == 0 and float(Bn[:, 3].abs().max()) == 0
    torch.testing.assert_close(An @ Bn.mT, A @ B.mT - 0.2 * dense(A, B, UA, UB), atol=1e-10, rtol=0)


def test_7_retraction_error_bound_prop_3_2():
    g = gen(7)
    m, n, r = 20, 16, 4
    A, B = factors(m, n, r, g)
    dA, dB = factors(m, n, r, g)
    for eta in (0.01, 0.1, 0.5, 2.0):
        X = A @ B.mT - eta * dense(A, B, dA, dB)
        An, Bn = retract(A, B, dA, dB, eta)
        err = float(torch.linalg.norm(An @ Bn.mT - X))
        bound = eta**2 * float(torch.linalg.norm(dA @ dB.mT))
        assert err <= bound * (1 + 1e-9)
        assert bound <= eta**2 * float(torch.linalg.norm(dA) * torch.linalg.norm(dB))


def test_8_horizontalization():
    g = gen(8)
    m, n, r = 14, 10, 3
    A, B = factors(m, n, r, g)
    geo = geometry(A, B)
    G = randn(m, n, g=g)
    lifted = lift(geo, G @ B, G.mT @ A)
    for dA, dB in [lifted, factors(m, n, r, g)]:
        hA, hB = horizontalize(geo, dA, dB)
        torch.testing.assert_close(A.mT @ hA, hB.mT @ B, atol=1e-10, rtol=0)
        torch.testing.assert_close(dense(A, B, hA, hB), dense(A, B, dA, dB), atol=1e-10, rtol=0)
        assert float(hA.square().sum() + hB.square().sum()) <= float(dA.square().sum() + dB.square().sum())
        torch.testing.assert_close(horizontalize(geo, hA, hB), (hA, hB), atol=1e-10, rtol=0)
    # Errata 1 and 2 of docs/design.md §7.11. Erratum 2: the Eq. 14 lift is not horizontal. Erratum 1:
    # the paper's printed Eq. 39 RHS (BᵀdB − AᵀdA) does not give a horizontal lift; the code's
    # (dBᵀB − AᵀdA) does (checked above).
    dA, dB = lifted
    assert float(torch.linalg.norm(A.mT @ dA - dB.mT @ B)) > 1e-3 * float(torch.linalg.norm(A.mT @ dA))
    omega = torch.from_numpy(scipy.linalg.solve_sylvester(geo.M, geo.N, B.mT @ dB - A.mT @ dA))
    pA, pB = dA + A @ omega, dB - B @ omega.mT
    assert float(torch.linalg.norm(A.mT @ pA - pB.mT @ B)) > 1e-3 * float(torch.linalg.norm(A.mT @ pA))


@pytest.mark.parametrize("floor", ["clamp", "ridge"])
def test_9_preconditioner_bound_and_orthogonal_invariance(floor):
    g = gen(9)
    r = 5
    Q = orthogonal(r, g)
    V = Q @ torch.diag(torch.logspace(-10, 0, r, dtype=F64)) @ Q.mT
    X = randn(7, r, g=g)
    for lam in (1e-3, 1e-1, 10.0):
        P = preconditioner(V, lam, floor)
        w = torch.linalg.eigvalsh(P)
        assert float(w.max()) <= lam**-0.5 * (1 + 1e-9)
        assert float(w.max() / w.min()) <= math.sqrt(1e4) * (1 + 1e-9)
        assert float((X @ P).square().sum()) <= float(X.square().sum()) / lam * (1 + 1e-9)
    # U_A Bᵀ + A U_Bᵀ is invariant under (AR, BR), R orthogonal, over several steps with noise and debiasing.
    m, n, tau = 12, 9, 0.05
    A, B = factors(m, n, 3, g)
    R = orthogonal(3, g)
    runs = []
    for a, b, rot in [(A, B, torch.eye(3, dtype=F64)), (A @ R, B @ R, R)]:
        geo, state, g_run, dirs = geometry(a, b), init_moments(a, b), gen(90), []
        lam_A, lam_B = dp_floors(geo, tau, "geometry")
        for _ in range(3):
            G = randn(m, n, g=g_run)
            dA, dB = lift(geo, G @ b, G.mT @ a)
            XA, XB = tangent_noise(geometry(A, B), g_run)  # one draw, carried into both gauges
            dA, dB = horizontalize(geo, dA + tau * XA @ rot, dB + tau * XB @ rot)
            UA, UB, state = adaptive_direction(
                state, dA, dB, lam_A, lam_B, AdaptiveSettings(floor), debias=noise_second_moments(geo, tau)
            )
            dirs.append(dense(a, b, UA, UB))
        runs.append(torch.stack(dirs))
    assert state.step == 3
    torch.testing.assert_close(runs[1], runs[0], atol=1e-10, rtol=1e-8)
    # Erratum 3 (docs/design.md §7.11): not invariant under a general R ∈ GL(r).
    geo = geometry(A, B)
    Ag, Bg = gauge(A, B, well_conditioned(3, g))
    geo_g = geometry(Ag, Bg)
    G = randn(m, n, g=g)
    outs = []
    for a, b, gg in [(A, B, geo), (Ag, Bg, geo_g)]:
        UA, UB, _ = adaptive_direction(
            init_moments(a, b), *horizontalize(gg, *lift(gg, G @ b, G.mT @ a)), 0.0, 0.0
        )
        outs.append(dense(a, b, UA, UB))
    assert float(torch.linalg.norm(outs[1] - outs[0])) > 1e-3 * float(torch.linalg.norm(outs[0]))


@pytest.mark.parametrize("floor", ["clamp", "ridge"])
def test_9_adaptive_bias_correction_floor_and_debias(floor):
    g = gen(19)
    m, n, r = 12, 9, 3
    state = init_moments(randn(m, r, g=g), randn(n, r, g=g))
    gA, gB = randn(m, r, g=g), randn(n, r, g=g)
    # A constant gradient gives the same direction at every step (bias correction of m and V).
    settings = AdaptiveSettings(floor=floor)
    first = adaptive_direction(state, gA, gB, 0.0, 0.0, settings)
    s = first[2]
    for _ in range(4):
        UA, UB, s = adaptive_direction(s, gA, gB, 0.0, 0.0, settings)
    torch.testing.assert_close((UA, UB), first[:2], atol=0, rtol=1e-9)
    # Without a floor (nor ε), Adam normalises pure noise: ‖U_A‖_F² = m r whatever its scale (Prop. A.29).
    for tau in (1e-3, 1.0):
        UA, _, _ = adaptive_direction(state, tau * gA, tau * gB, 0.0, 0.0, AdaptiveSettings(floor, eps=0.0))
        assert abs(float(UA.square().sum()) / (m * r) - 1) < 1e-6
    # Debiasing away the whole second moment leaves the floor alone: U = g / sqrt(λ).
    lam = 0.04
    debias = (gA.mT @ gA / m, gB.mT @ gB / n)
    UA, UB, _ = adaptive_direction(state, gA, gB, lam, lam, settings, debias=debias)
    torch.testing.assert_close((UA, UB), (gA / math.sqrt(lam), gB / math.sqrt(lam)), atol=0, rtol=1e-6)


def test_10_corollary_2_3_factor_noise_grows_with_gauge_prism_does_not():
    g = gen(10)
    m, n, r, tau, draws = 64, 48, 4, 0.5, 400
    A, B = factors(m, n, r, g)
    prism_energy = tau**2 * r * (m + n - r)
    factor = {}
    for c in (0.1, 1.0, 10.0):
        a, b = c * A, B / c
        xi = [(tau * randn(m, r, g=g), tau * randn(n, r, g=g)) for _ in range(draws)]
        factor[c] = float(torch.stack([dense(a, b, *x) for x in xi]).square().sum((-2, -1)).mean())
        theory = tau**2 * (m * b.square().sum() + n * a.square().sum())
        assert abs(factor[c] / float(theory) - 1) < 0.05
        prism = tau**2 * float(sample_intrinsic(a, b, draws, seed=100).square().sum((-2, -1)).mean())
        assert abs(prism / prism_energy - 1) < 0.03
    assert factor[0.1] > 10 * prism_energy and factor[10.0] > 10 * prism_energy
    assert factor[10.0] > 50 * factor[1.0]


def test_spectral_init_is_balanced_and_preserves_weight():
    g = gen(11)
    m, n, r = 40, 30, 4
    U, _ = torch.linalg.qr(randn(m, n, g=g))
    V, _ = torch.linalg.qr(randn(n, n, g=g))
    s = torch.cat(
        [torch.tensor([10.0, 8.0, 6.0, 5.0], dtype=F64), 0.1 * torch.rand(n - 4, generator=g, dtype=F64)]
    )
    W0 = U @ torch.diag(s) @ V.mT
    A, B, W_res = spectral_init(W0, r, generator=gen(12))
    torch.testing.assert_close(W_res + A @ B.mT, W0, atol=1e-12, rtol=0)
    torch.testing.assert_close(A.mT @ A, torch.diag(s[:r]), atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(B.mT @ B, torch.diag(s[:r]), atol=1e-8, rtol=1e-8)
    with pytest.raises(ValueError, match="rank"):
        spectral_init(W0[:3], r)


def test_balanced_random_init():
    A, B = balanced_random_init(20, 12, 3, scale=0.02, generator=gen(13))
    assert A.shape == (20, 3) and B.shape == (12, 3) and A.dtype == torch.float32
    eye = 0.02**2 * torch.eye(3)
    torch.testing.assert_close(A.mT @ A, eye, atol=1e-9, rtol=1e-5)
    torch.testing.assert_close(B.mT @ B, eye, atol=1e-9, rtol=1e-5)
    torch.testing.assert_close((A @ B.mT).square().sum(), torch.tensor(3 * 0.02**4), atol=0, rtol=1e-5)
    torch.testing.assert_close(balanced_random_init(20, 12, 3, generator=gen(13)), (A, B), atol=0, rtol=0)


@pytest.mark.parametrize("failures", [1, 2])
def test_psd_eigh_falls_back_when_eigh_fails(monkeypatch, failures):
    real = torch.linalg.eigh
    calls = []

    def flaky(S):
        calls.append(S.dtype)
        if len(calls) <= failures:
            raise torch.linalg.LinAlgError("did not converge")
        return real(S)

    Q = orthogonal(4, gen(14))
    S = (Q @ torch.diag(torch.tensor([0.0, 1e-3, 1.0, 2.0], dtype=F64)) @ Q.mT).float()
    monkeypatch.setattr(torch.linalg, "eigh", flaky)
    w, V = psd_eigh(S)
    assert len(calls) == failures + 1 and calls[-1] == (torch.float64 if failures == 2 else torch.float32)
    assert w.dtype == torch.float32 and bool((w >= 0).all())
    torch.testing.assert_close(V @ torch.diag(w) @ V.mT, S, atol=1e-5, rtol=0)
