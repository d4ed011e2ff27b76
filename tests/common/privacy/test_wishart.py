"""The Wishart-amplified accountant of M2 = M(V + Ξ): the Beta-tail step against scipy, mpmath and
closed forms, the composed ε against dp_accounting, the fallback to the baseline, the guard, the CLI."""

import json
import math

import mpmath
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from scipy import special, stats

from common.errors import FedloraError
from common.privacy.accounting.accountants import PLD_DISCRETIZATION
from common.privacy.accounting.calibration import epsilon_for
from common.privacy.mechanisms.wishart import (
    ASSUMPTIONS,
    alpha_star,
    projection_failure,
    wishart_claim,
    wishart_epsilon,
)
from tests.conftest import run_cli

# The paper's utility experiment (App. F.2): linear head W in R^{10 x 2048} on CIFAR-10 features,
# N = 50,000, batch 1024 (Poisson rate 1024/50000), 50 epochs, delta 1e-4, ranks 32..700.
PAPER = {"p": 1024 / 50000, "rounds": 2442, "delta": 1e-4, "dim": 2048}

# (rank, dim, alpha): bulk, both tails, and far tails where 1 - I_alpha cancels to 0 in floats
TAIL_GRID = [(r, d, a) for r, d in [(1, 8), (2, 64), (16, 512), (32, 2048), (300, 2048), (700, 2048),
             (4, 4096)] for a in (1e-6, 0.001, 0.02, 0.1, 0.3, 0.6, 0.95)]  # fmt: skip


def _mp_upper_tail(alpha: float, rank: int, dim: int) -> float:
    """1 − I_α(r/2, (d−r)/2) = I_{1−α}((d−r)/2, r/2) at 60 digits (mpmath), the independent reference
    (the integral over [0, 1 − α] directly: mpmath's own [α, 1] form cancels in the far tail)."""
    with mpmath.workdps(60):
        a, b = mpmath.mpf(rank) / 2, mpmath.mpf(dim - rank) / 2
        return float(mpmath.betainc(b, a, 0, 1 - mpmath.mpf(alpha), regularized=True))


@pytest.mark.parametrize(("rank", "dim", "alpha"), TAIL_GRID)
def test_beta_tail_matches_scipy_stats_and_mpmath(rank, dim, alpha):
    got = projection_failure(alpha, rank, dim)
    ref = _mp_upper_tail(alpha, rank, dim)
    assert got == pytest.approx(ref, rel=1e-9, abs=1e-300)
    assert got == pytest.approx(stats.beta.sf(alpha, rank / 2, (dim - rank) / 2), rel=1e-9, abs=1e-300)
    if ref > 1e-6:  # where 1 − I_α does not cancel, the textbook form agrees too
        assert got == pytest.approx(1 - special.betainc(rank / 2, (dim - rank) / 2, alpha), rel=1e-8)
    assert projection_failure(alpha, rank, dim, grad_rank=7) == pytest.approx(7 * got, rel=1e-15)


def test_beta_tail_far_tail_where_the_textbook_form_cancels():
    alpha = 0.3  # rank 32 of 2048: Pr(B > 0.3) is ~1e-140
    ref = _mp_upper_tail(alpha, 32, 2048)
    assert 0 < ref < 1e-100 and 1 - special.betainc(16, 1008, alpha) == 0.0
    assert projection_failure(alpha, 32, 2048) == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("dim", [4, 64, 2048])
@pytest.mark.parametrize("alpha", [1e-9, 0.01, 0.5, 0.99])
def test_beta_tail_closed_form_at_rank_2(dim, alpha):
    """r = 2: Beta(1, b) has upper tail (1 − α)^b exactly, b = (d − 2)/2."""
    exact = math.exp((dim - 2) / 2 * math.log1p(-alpha))
    assert projection_failure(alpha, 2, dim) == pytest.approx(exact, rel=1e-10, abs=1e-300)


@pytest.mark.parametrize(("rank", "dim"), [(8, 64), (16, 512), (32, 2048), (100, 2048), (256, 4096)])
@pytest.mark.parametrize("eta", [0.25, 0.5, 0.9])
def test_beta_tail_below_lemma_7(rank, dim, eta):
    """Wishart paper Lemma 7 (r ≤ d/2): Pr(B > r(1 + η)/d) ≤ 2·exp(−η²r/72)."""
    assert projection_failure(rank * (1 + eta) / dim, rank, dim) <= 2 * math.exp(-(eta**2) * rank / 72)


@pytest.mark.parametrize(("rank", "dim"), [(1, 8), (2, 64), (16, 512), (32, 2048), (512, 2048), (2000, 2048)])
@pytest.mark.parametrize("grad_rank", [1, 10])
@pytest.mark.parametrize("failure", [0.5, 1e-3, 4.1e-9, 1e-30, 1e-200])
def test_alpha_star_is_the_smallest_alpha_within_the_budget(rank, dim, grad_rank, failure):
    alpha = alpha_star(rank, dim, grad_rank, failure)
    assert 0 < alpha <= 1
    a, b = rank / 2, (dim - rank) / 2
    assert grad_rank * stats.beta.sf(alpha, a, b) <= failure * (1 + 1e-12)  # within the budget
    assert alpha == pytest.approx(stats.beta.isf(failure / grad_rank, a, b), rel=1e-9)  # and the smallest
    assert grad_rank * _mp_upper_tail(alpha, rank, dim) == pytest.approx(failure, rel=1e-7)


@pytest.mark.parametrize("failure", [1e-3, 1e-12, 1e-250])
def test_alpha_star_closed_form_at_rank_2(failure):
    """r = 2: α* = 1 − (failure/s)^{1/b}."""
    dim, s = 1000, 3
    b = (dim - 2) / 2
    exact = -math.expm1(math.log(failure / s) / b)
    assert alpha_star(2, dim, s, failure) == pytest.approx(exact, rel=1e-10)


def test_alpha_star_grows_with_rank_grad_rank_and_a_smaller_budget():
    assert alpha_star(16, 2048, 1, 1e-9) < alpha_star(64, 2048, 1, 1e-9) < alpha_star(512, 2048, 1, 1e-9)
    assert alpha_star(32, 2048, 1, 1e-9) < alpha_star(32, 2048, 10, 1e-9) < alpha_star(32, 2048, 2048, 1e-9)
    # three projected layers of the same (r, d): their bounds summed, beyond d
    assert alpha_star(32, 2048, 2048, 1e-9) < alpha_star(32, 2048, 3 * 2048, 1e-9) < 1
    assert alpha_star(32, 2048, 1, 1e-6) < alpha_star(32, 2048, 1, 1e-9) < alpha_star(32, 2048, 1, 1e-12)
    assert alpha_star(32, 2048, 1, 1e-9) > 32 / 2048  # above the mean r/d: a tail quantile


@pytest.mark.parametrize(("rank", "grad_rank", "sigma"), [(32, 10, 1.0), (128, 10, 1.0), (512, 10, 1.0),
                         (32, 1, 0.5), (32, 2048, 2.0), (700, 10, 1.0)])  # fmt: skip
def test_paper_regime_amplified_below_baseline(rank, grad_rank, sigma):
    w = wishart_epsilon(sigma, PAPER["p"], PAPER["rounds"], PAPER["delta"], rank, PAPER["dim"], grad_rank)
    baseline = epsilon_for("pld", sigma, PAPER["p"], PAPER["rounds"], PAPER["delta"])
    assert w.baseline == baseline and w.baseline_accountant == "pld"
    assert w.claimed == "amplified" and w.epsilon == w.amplified < baseline
    assert w.projection_delta == pytest.approx(0.1 * PAPER["delta"])
    per_step = w.projection_delta / PAPER["rounds"]
    assert w.alpha == alpha_star(rank, PAPER["dim"], grad_rank, per_step)
    assert w.effective_noise_multiplier == pytest.approx(sigma / math.sqrt(w.alpha), rel=1e-15)
    assert w.amplified == epsilon_for(
        "pld", w.effective_noise_multiplier, PAPER["p"], PAPER["rounds"], 0.9e-4
    )


def test_paper_regime_composition_matches_dp_accounting():
    """The amplified ε is dp_accounting's PLD ε at σ/√α*, δ − δ_p (its T steps composed)."""
    w = wishart_epsilon(1.0, PAPER["p"], PAPER["rounds"], PAPER["delta"], 32, PAPER["dim"], 10)
    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    event = dp_event.PoissonSampledDpEvent(PAPER["p"], dp_event.GaussianDpEvent(w.effective_noise_multiplier))
    ref.compose(event, PAPER["rounds"])
    assert w.amplified == pytest.approx(ref.get_epsilon(PAPER["delta"] - w.projection_delta), rel=1e-6)
    assert w.amplified < w.baseline / 5  # the paper's small-rank regime: a large gain


@pytest.mark.parametrize(("rank", "dim"), [(2000, 2048), (2047, 2048), (60, 64), (7, 8)])
def test_equal_to_the_baseline_where_amplification_does_not_apply(rank, dim):
    """r near d: α* → 1, so the amplified bound (at δ − δ_p) is worse and the baseline is claimed."""
    w = wishart_epsilon(1.0, 0.01, 500, 1e-5, rank, dim)
    assert w.claimed == "baseline" and "no amplification" in w.reason
    assert w.amplified >= w.baseline
    assert w.epsilon == w.baseline == epsilon_for("pld", 1.0, 0.01, 500, 1e-5)


def test_no_noise_is_no_guarantee_either_way():
    w = wishart_epsilon(0.0, 0.01, 10, 1e-5, 4, 64)
    assert w.claimed == "baseline" and w.epsilon == math.inf == w.amplified


def test_monotone_in_sigma_rounds_rate_and_rank():
    def eps(sigma=1.0, p=0.01, rounds=200, rank=16):
        return wishart_epsilon(sigma, p, rounds, 1e-5, rank, 512, 4).epsilon

    by_sigma = [eps(sigma=s) for s in (0.3, 0.6, 1.0, 2.0)]
    assert by_sigma == sorted(by_sigma, reverse=True) and len(set(by_sigma)) == 4
    by_rounds = [eps(rounds=t) for t in (10, 100, 1000)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 3
    by_rate = [eps(p=p) for p in (0.001, 0.01, 0.1)]
    assert by_rate == sorted(by_rate) and len(set(by_rate)) == 3
    by_rank = [eps(rank=r) for r in (4, 16, 64, 256)]
    assert by_rank == sorted(by_rank) and len(set(by_rank)) == 4


def test_never_above_the_baseline():
    for rank, dim, sigma in [(1, 2, 1.0), (8, 16, 0.8), (100, 128, 3.0), (4, 4096, 0.6), (64, 100, 1.2)]:
        w = wishart_epsilon(sigma, 0.05, 100, 1e-6, rank, dim)
        assert w.epsilon == min(w.amplified, w.baseline) <= w.baseline


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 64, "dim": 64}, "below the projected dimension"),
        ({"rank": 65, "dim": 64}, "below the projected dimension"),
        ({"rank": 0, "dim": 64}, "rank must be an integer >= 1"),
        ({"grad_rank": 0}, "grad rank"),
        ({"fail_frac": 0.0}, "fail frac"),
        ({"fail_frac": 1.0}, "fail frac"),
        ({"delta": 1.0}, "delta"),
        ({"sigma": -1.0}, "noise multiplier"),
        ({"p": 0.0}, "sample rate"),
        ({"rounds": 0}, "rounds"),
    ],
)
def test_bad_input_is_a_one_line_error(kwargs, message):
    args = {"sigma": 1.0, "p": 0.1, "rounds": 10, "delta": 1e-5, "rank": 4, "dim": 64, **kwargs}
    with pytest.raises(FedloraError, match=message) as err:
        wishart_epsilon(**args)
    assert len(str(err.value).splitlines()) == 1


M2 = dict.fromkeys(ASSUMPTIONS, True)


def test_claim_allowed_when_every_m2_assumption_holds():
    assert wishart_claim(**M2) is None


@pytest.mark.parametrize(
    ("broken", "phrase"),
    [
        ("a_redrawn_each_step", "redrawn independently at every step"),  # A fixed across steps (FFA-LoRA)
        ("noise_before_projection", "not after it (M1)"),
        ("a_gaussian", "Kaiming-uniform is not"),
        ("a_independent_of_data", "independently of the data"),
        ("clip_full_gradient", "full weight gradient"),
        ("only_projected_params", "no amplification"),
    ],
)
def test_claim_refused_when_an_assumption_fails(broken, phrase):
    with pytest.raises(FedloraError, match="cannot claim the Wishart-amplified epsilon") as err:
        wishart_claim(**{**M2, broken: False})
    assert phrase in str(err.value) and len(str(err.value).splitlines()) == 1


def test_claim_names_every_failed_assumption():
    with pytest.raises(FedloraError) as err:
        wishart_claim(**{**M2, "a_redrawn_each_step": False, "noise_before_projection": False})
    assert "redrawn" in str(err.value) and "(M1)" in str(err.value)


PAPER_ARGS = ["--noise-multiplier", "1", "--sample-rate", "0.02048", "--rounds", "2442", "--delta", "1e-4"]


def test_cli_prints_amplified_beside_baseline(capsys):
    argv = ["privacy", "epsilon", "--accountant", "wishart", "--rank", "32", "--dim", "2048", *PAPER_ARGS]
    assert run_cli(argv) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert rows["accountant"] == "wishart" and rows["claimed"] == "amplified"
    assert (
        rows["baseline_accountant"] == "pld"
        and float(rows["delta"]) == 1e-4
        and "per participant" in rows["unit"]
    )
    assert float(rows["epsilon"]) == float(rows["epsilon_amplified"]) < float(rows["epsilon_baseline"])
    assert run_cli([*argv, "--grad-rank", "10", "--fail-frac", "0.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    w = wishart_epsilon(1.0, 0.02048, 2442, 1e-4, 32, 2048, grad_rank=10, fail_frac=0.2)
    assert out["epsilon"] == w.epsilon and out["epsilon_baseline"] == w.baseline and out["alpha"] == w.alpha
    assert out["grad_rank"] == 10 and out["projection_delta"] == pytest.approx(2e-5)


def test_cli_reports_the_baseline_where_amplification_does_not_apply(capsys):
    argv = ["privacy", "epsilon", "--accountant", "wishart", "--rank", "2000", "--dim", "2048", *PAPER_ARGS]
    assert run_cli([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["claimed"] == "baseline" and out["epsilon"] == out["epsilon_baseline"]
    assert out["epsilon_amplified"] >= out["epsilon_baseline"]
    assert run_cli(["privacy", "epsilon", "--accountant", "pld", *PAPER_ARGS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == out["epsilon_baseline"]


SMALL = ["--noise-multiplier", "1", "--sample-rate", "0.1", "--rounds", "10", "--delta", "1e-5"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--accountant", "wishart", "--rank", "64", "--dim", "64"], "--rank must be below --dim"),
        (["--accountant", "wishart", "--rank", "100", "--dim", "64"], "--rank must be below --dim"),
        (["--accountant", "wishart", "--rank", "0", "--dim", "64"], "--rank must be >= 1"),
        (["--accountant", "wishart", "--rank", "-3", "--dim", "64"], "--rank must be >= 1"),
        (["--accountant", "wishart", "--dim", "64"], "needs --rank"),
        (["--accountant", "wishart", "--rank", "4"], "needs --dim"),
        (["--accountant", "wishart"], "needs --rank and --dim"),
        (["--accountant", "wishart", "--rank", "4", "--dim", "64", "--grad-rank", "0"], "--grad-rank must be >= 1"),
        (["--accountant", "wishart", "--rank", "4", "--dim", "64", "--fail-frac", "0"], "--fail-frac must be in"),
        (["--accountant", "wishart", "--rank", "4", "--dim", "64", "--fail-frac", "1"], "--fail-frac must be in"),
        (["--accountant", "wishart", "--rank", "4.5", "--dim", "64"], "invalid int value"),
        (["--accountant", "pld", "--rank", "4"], "--rank applies only to --accountant wishart"),
        (["--rank", "4", "--dim", "64"], "--rank, --dim apply only to --accountant wishart"),
    ],
)  # fmt: skip
def test_cli_bad_input_exit_2_one_line(args, message, capsys):
    assert run_cli(["privacy", "epsilon", *args, *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cli_wishart_has_no_sigma_query(capsys):
    argv = ["privacy", "sigma", "--accountant", "wishart", "--epsilon", "1", *SMALL[2:]]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "invalid choice" in err and len(err.splitlines()) == 1
