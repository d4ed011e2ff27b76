"""Sample-level DP local optimizers on the engine: PRISM steps, the step loop, the noise plan,
train-local end to end and its bad input."""

import json
import logging

import numpy as np
import pytest
import torch

from client.dp.engine import DenseUpdate, DpSteps, dp_train, poisson_batch
from client.dp.grad_sample import GradSampler
from client.dp.optimizers import DP_OPTIMIZERS, PrismDp, make_dp_optimizer
from client.dp.prism import clip_coefficients, lift, tangent_sq_norm
from client.dp.sample_plan import plan_sample_noise
from common.config import LOCAL_OPTIMIZERS, MECHANISMS, RunConfig
from common.errors import FedloraError
from common.models.dense_delta import dense_deltas
from common.models.lora import get_factors, lora_layers
from common.models.lora_init import apply_lora_init, check_ranks
from common.presets import preset
from common.privacy.accounting.calibration import epsilon_for
from common.privacy.accounting.ledger import Ledger
from common.runtime import open_split
from common.tasks.base import by_length
from common.tasks.training import Trainee
from tests.conftest import run_cli
from tests.harness import LmTask


def _examples(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(1, 500, size=int(rng.integers(3, 9))).tolist()} for _ in range(n)]


def _rngs(seed=0):
    return np.random.default_rng(seed), torch.Generator().manual_seed(seed)


def test_registry_matches_config_names():
    assert set(LOCAL_OPTIMIZERS) == {"none", *DP_OPTIMIZERS}
    for name in DP_OPTIMIZERS:
        assert MECHANISMS[name] == (name, "none")


def test_micro_batches_are_cut_in_order_of_length():
    """The engine sorts a logical batch by token count before cutting micro-batches (1.5x fewer padded
    tokens on rotten-tomatoes); classifier/LM examples carry ``ids``, verbalizer ones ``prompt``."""
    ids = [{"ids": [1] * n} for n in (5, 2, 9, 2, 7)]
    assert by_length([4, 0, 2, 1], ids) == [1, 0, 4, 2]
    prompts = [{"prompt": [1] * n} for n in (3, 1, 2)]
    assert by_length(range(3), prompts) == [1, 2, 0]


def test_poisson_batch_rate_and_empty():
    rng = np.random.default_rng(0)
    sizes = [len(poisson_batch(1000, 0.05, rng)) for _ in range(400)]
    assert abs(np.mean(sizes) - 50) < 1.5 and np.std(sizes) > 3  # Poisson, not fixed-size
    assert len(poisson_batch(10, 1e-9, rng)) == 0


@pytest.mark.heavy
def test_prism_step_keeps_rank_balance_and_descends(tiny_llama):
    apply_lora_init(tiny_llama, "balanced", seed=0, scale=0.3)
    task, data = LmTask(), _examples()
    batch = task.collate(data, torch.device("cpu"))
    with torch.no_grad():
        before = float(task.per_example_loss(tiny_llama, batch).mean())
    opt = PrismDp(lora_layers(tiny_llama), lr=0.02)
    plan = DpSteps(steps=5, sample_rate=1.0, clip=1e6, noise_multiplier=0.0)  # non-private: pure descent
    dp_train(Trainee(tiny_llama, task, data, torch.device("cpu")), opt, plan, DenseUpdate(0.02), rngs=_rngs())
    with torch.no_grad():
        after = float(task.per_example_loss(tiny_llama, batch).mean())
    assert after < before - 1e-3
    for layer in lora_layers(tiny_llama).values():
        A, B = get_factors(layer)
        torch.testing.assert_close(A.T @ A, B.T @ B, atol=1e-5, rtol=1e-4)  # balanced retraction
        assert torch.linalg.matrix_rank(A @ B.T) == A.shape[1]


def test_clipped_sum_is_gauge_invariant_and_bounded(tiny_llama):
    """α_i and the intrinsic clipped sum depend on Z only: (AR, BR^-T) gives the same (PRISM Eq. 16)."""
    apply_lora_init(tiny_llama, "balanced", seed=1, scale=0.3)
    task, data = LmTask(), _examples(6)
    layers = lora_layers(tiny_llama)
    opt = PrismDp(layers, lr=0.0)

    def clipped(clip):
        opt.begin()
        with GradSampler(tiny_llama) as sampler:
            task.per_example_loss(tiny_llama, task.collate(data, torch.device("cpu"))).sum().backward()
            grads = sampler.factor_grads()
        tiny_llama.zero_grad(set_to_none=True)
        sq = opt.sq_norms(grads)
        alpha = clip_coefficients([sq], clip)
        opt.accumulate(grads, alpha)
        total = 0.0
        deltas = {}
        for name, (geo, sA, sB) in opt.per_module().items():
            dA, dB = lift(geo, sA, sB)
            deltas[name] = dA @ geo.B.T + geo.A @ dB.T
            total += float(tangent_sq_norm(geo, dA, dB))
        return alpha, deltas, total**0.5

    clip = float(sq_median(opt, tiny_llama, task, data))  # clips about half of the examples
    alpha, deltas, norm = clipped(clip)
    assert norm <= len(data) * clip * (1 + 1e-5)
    assert (alpha < 1).any() and (alpha == 1).any()
    from common.models.lora import set_factors

    R = torch.tensor([[2.0, 0.3, 0.0, 0.1], [0.0, 0.5, 0.2, 0.0], [0.1, 0.0, 1.5, 0.3], [0.0, 0.2, 0.0, 0.8]])
    for layer in layers.values():
        A, B = get_factors(layer)
        set_factors(layer, A @ R, B @ torch.linalg.inv(R).T)
    alpha2, deltas2, _ = clipped(clip)
    torch.testing.assert_close(alpha2, alpha, rtol=1e-3, atol=1e-5)
    for name in deltas:
        torch.testing.assert_close(deltas2[name], deltas[name], rtol=1e-3, atol=1e-6)


def sq_median(opt, model, task, data):
    """Median per-example intrinsic norm at the current factors (a clip that clips about half)."""
    opt.begin()
    with GradSampler(model) as sampler:
        task.per_example_loss(model, task.collate(data, torch.device("cpu"))).sum().backward()
        grads = sampler.factor_grads()
    model.zero_grad(set_to_none=True)
    return opt.sq_norms(grads).sqrt().median()


@pytest.mark.parametrize("name", sorted(DP_OPTIMIZERS))
def test_empty_poisson_batches_release_noise_without_crashing(name, tiny_llama, caplog):
    if not LOCAL_OPTIMIZERS[name].merges_base:  # those keep PEFT's lora_B = 0, move a dense update
        apply_lora_init(tiny_llama, "balanced", seed=0)
    before = {k: get_factors(v) for k, v in lora_layers(tiny_llama).items()}
    opt = make_dp_optimizer(name, lora_layers(tiny_llama), 1e-2)
    plan = DpSteps(steps=3, sample_rate=1e-9, clip=1.0, noise_multiplier=1.0)
    with caplog.at_level(logging.WARNING, logger="fedlora.client"):
        stats = dp_train(
            Trainee(tiny_llama, LmTask(), _examples(), torch.device("cpu")), opt, plan, DenseUpdate(1e-2)
        )
    assert stats["empty-batches"] == 3 and stats["examples-used"] == 0
    assert "3 of 3 steps drew no examples" in caplog.text
    moved = any(not torch.equal(get_factors(v)[0], before[k][0]) for k, v in lora_layers(tiny_llama).items())
    assert moved or any(d.abs().max() > 0 for d in dense_deltas(tiny_llama).values())  # the noise was applied


def test_prism_refuses_zero_factors(tiny_llama):
    apply_lora_init(tiny_llama, "peft", seed=0)
    with torch.no_grad():
        for layer in lora_layers(tiny_llama).values():
            layer.lora_B["default"].weight.zero_()
    with pytest.raises(FedloraError, match="full-rank"):
        PrismDp(lora_layers(tiny_llama), lr=1e-3)


def test_rank_above_min_dimension_is_refused():
    from transformers import LlamaForCausalLM

    from common.models.lora import LoraSpec, attach_lora
    from tests.conftest import tiny_llama_config

    cfg = tiny_llama_config(64, num_hidden_layers=1)
    model = attach_lora(LlamaForCausalLM(cfg), LoraSpec(rank=20, targets=("v_proj",)), "CAUSAL_LM")
    with pytest.raises(FedloraError, match=r"LoRA rank 20 exceeds min\(m, n\) = 16"):
        check_ranks(model)


def test_sample_plan_calibrates_with_pld_and_warns_on_large_delta(caplog):
    plan = plan_sample_noise(examples=2000, batch_size=32, steps=150, clip=1.0, delta=1e-5, epsilon=3.0)
    eps = epsilon_for("pld", plan.sigma, 0.016, 150, 1e-5)
    assert 2.97 <= eps <= 3.0 and plan.sample_rate == 0.016
    with caplog.at_level(logging.WARNING, logger="fedlora.client"):
        plan_sample_noise(examples=100, batch_size=10, steps=10, clip=1.0, delta=0.02, epsilon=3.0)
    assert "delta = 0.02 >= 1/N = 0.01" in caplog.text
    with pytest.raises(FedloraError, match="exactly one"):
        plan_sample_noise(100, 10, 10, 1.0, 1e-5, epsilon=1.0, noise_multiplier=1.0)
    with pytest.raises(FedloraError, match="exceeds the 100 training examples"):
        plan_sample_noise(100, 200, 10, 1.0, 1e-5, epsilon=1.0)


def test_config_checks_local_optimizer_settings():
    with pytest.raises(FedloraError, match="exactly one of --sample-epsilon"):
        RunConfig(mechanism="prism").check()
    with pytest.raises(FedloraError, match="PRISM needs full-rank"):
        RunConfig(mechanism="prism", sample_epsilon=3, lora_init="peft").check()
    cfg = RunConfig(mechanism="dp-adamw", sample_epsilon=3).check()
    assert (cfg.optimizer_kind, cfg.release_kind, cfg.init_kind) == ("dp-adamw", "none", "balanced")
    assert RunConfig().init_kind == "peft"
    # each method its own init (issue 52): FFA-LoRA's is PEFT's random A (frozen) and B = 0
    assert RunConfig(mechanism="ffa", sample_epsilon=3).check().init_kind == "peft"
    assert RunConfig(mechanism="ffa", sample_epsilon=3, lora_init="balanced").check().init_kind == "balanced"
    assert preset("minilm-rt-silo").init_kind == "peft"  # ffa's own, re-measured (docs/prism.md)


FAST_LOCAL = [
    "--local-steps",
    "3",
    "--batch-size",
    "8",
    "--max-train-examples",
    "64",
    "--eval-examples",
    "16",
]


@pytest.mark.heavy
def test_train_local_reports_accuracy_and_sample_level_epsilon(tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(
        [
            "train-local",
            "--mechanism",
            "prism",
            *FAST_LOCAL,
            "--charge-every",
            "2",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0.0 <= result["accuracy"] <= 1.0 and result["steps"] == 3 and result["lora_norm"] > 0
    assert result["privacy"]["unit"].startswith("sample-level") and result["privacy"]["epsilon"] <= 3.0
    ledger = Ledger.open(out / "sample-ledger.sqlite", "sample-level")
    rows = ledger.rows()
    assert [r["count"] for r in rows] == [2, 1] and {r["status"] for r in rows} == {"applied"}
    assert rows[-1]["eps_tight"] == pytest.approx(result["privacy"]["epsilon"])
    assert (out / "adapter.safetensors").is_file() and (out / "result.json").is_file()


@pytest.mark.heavy
def test_train_local_node_trains_its_shard_and_keeps_the_federations_test_set(tmp_path, capsys):
    """``--node K --num-clients N``: node K's shard of the federation's split, scored on its test set."""
    shard = ["--num-clients", "3", "--partition", "dirichlet", "--dirichlet-alpha", "0.5", "--node", "2"]
    assert (
        run_cli(
            [
                "train-local",
                "--mechanism",
                "fedavg",
                *FAST_LOCAL,
                *shard,
                "--out",
                str(tmp_path / "a"),
                "--json",
            ]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cfg = RunConfig(
        num_clients=3, partition="dirichlet", dirichlet_alpha=0.5, max_train_examples=64, eval_examples=16
    )
    split, whole = (
        open_split(cfg),
        open_split(RunConfig(num_clients=1, max_train_examples=64, eval_examples=16)),
    )
    assert result["examples"] == len(split.clients[2]) < 64 and (result["node"], result["num_clients"]) == (
        2,
        3,
    )
    assert list(split.test) == list(whole.test) and result["eval_examples"] == 16


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mechanism", "dp-adamw", "--targets", "nope"], "cannot attach LoRA"),
        (["--mechanism", "prism", "--lora-init", "peft"], "PRISM needs full-rank LoRA factors"),
        (["--mechanism", "ffa", "--batch-size", "100"], "exceeds the 64 training examples"),
        (["--mechanism", "prism", "--delta", "1.5"], "delta must be in (0, 1)"),
        (["--mechanism", "ffa", "--num-clients", "2", "--node", "2"], "--node must be in [0, 2)"),
        (
            ["--mechanism", "prism", "--client-optimizer", "sgd"],
            "prism has its own: use --client-optimizer adamw",
        ),
    ],
)
def test_train_local_bad_input_is_one_line_exit_2(args, message, tmp_path, capsys):
    out = tmp_path / "run"
    code = run_cli(["train-local", *FAST_LOCAL, *args, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_train_local_never_writes_into_an_existing_run(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "sample-ledger.sqlite").write_bytes(b"precious")
    code = run_cli(["train-local", "--mechanism", "fedavg", *FAST_LOCAL, "--out", str(out)])
    assert code == 2 and "not empty" in capsys.readouterr().err
    assert (out / "sample-ledger.sqlite").read_bytes() == b"precious"


def test_the_noised_sum_is_divided_by_the_planned_expected_batch(tiny_llama):
    """q·N for the N the noise was planned for (an audit plans for every canary), not q times the
    examples trained on, so the step does not reveal how many canaries were included."""
    apply_lora_init(tiny_llama, "balanced", seed=0, scale=0.3)
    task, data = LmTask(), _examples(6)
    opt = make_dp_optimizer("dp-adamw", lora_layers(tiny_llama), 0.0)
    seen = []
    step = opt.step
    opt.step = lambda noise_std, denom, generator: seen.append(denom) or step(noise_std, denom, generator)
    for expected in (0.0, 10.0):
        plan = DpSteps(steps=1, sample_rate=0.5, clip=1.0, noise_multiplier=1.0, expected_batch=expected)
        dp_train(
            Trainee(tiny_llama, task, data, torch.device("cpu")), opt, plan, DenseUpdate(0.0), rngs=_rngs()
        )
    assert seen == [3.0, 10.0]
