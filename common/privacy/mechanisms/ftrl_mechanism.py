"""DP-FTRL with banded correlated noise (central): a stateful mechanism.

Client half: the Gaussian mechanism's under central noise (clip the increment to C, add nothing).
Server half: the sum of the replies, each clipped to C again, plus σC·w_t, w_t the banded stream's
output for round t (common/privacy/mechanisms/banded_noise.py), over the expected cohort pN. What each round
charges and who may take part come from the plan (common/privacy/planning/ftrl_plan.py).

The stream's state (its round index and last b−1 outputs) is a secret: with it, a reader subtracts
those rounds' noise from the released means. It lives in its own file beside the run
(``noise-state.safetensors``, mode 0600, apart from the checkpoint, the adapter and anything exported),
replaced atomically *before* a round's noised mean is used, never redrawn for a persisted round, and
removed when the run ends. A round index whose noise was never persisted (a round skipped, withheld or
interrupted before its release) is drawn afresh and discarded, so round r always uses w_{r−1}: the
released noise is a subset of the stream's outputs (post-processing), and the separation the plan
accounts for holds in stream indices too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from common.atomic import replacing
from common.config import RunConfig, plans_for_target
from common.errors import FedloraError
from common.models import AdapterState
from common.privacy.accounting.accountants import Event
from common.privacy.mechanisms.banded_noise import BandedNoise, standard_normal
from common.privacy.mechanisms.mechanism import GaussianMechanism, GaussianSum, RoundSum
from common.privacy.participation.threat import THREATS, ThreatModel
from common.privacy.planning.ftrl_plan import FtrlPlan, Target, plan_ftrl, workload_name
from common.privacy.planning.plan import NoisePlan, planned_for_target
from common.privacy.registry import CORRELATED

#: the stream's secret state, in the run directory
NOISE_FILE = "noise-state.safetensors"


class _FtrlRound:
    """The round's clipped sum; its release draws w_t (persisted first) and adds σC·w_t."""

    def __init__(self, mechanism: BandedFtrl, total: GaussianSum) -> None:
        self.mechanism, self.total = mechanism, total

    def add(self, reply: AdapterState, weight: int | None = None) -> None:
        self.total.add(reply)

    def release(self) -> tuple[AdapterState, float | None]:
        if not self.total.count:
            raise ValueError("no replies to aggregate")
        total, m = self.total.total, self.mechanism
        w = m.draw({k: tuple(t.shape) for k, t in total.items()})
        scale = m.plan.sigma * m.clip
        mean = {
            k: (t.double() + scale * w[k]).div_(self.total.expected).to(t.dtype) for k, t in total.items()
        }
        return mean, m.plan.sigma


class BandedFtrl:
    """The ``dp-ftrl`` release (see the module docstring); ``expected``: p·N, the sum's divisor."""

    name = "dp-ftrl"

    def __init__(self, plan: NoisePlan, expected: float) -> None:
        if not isinstance(plan.family, FtrlPlan):
            raise ValueError("a dp-ftrl mechanism needs a correlated-noise plan")
        self.inner = GaussianMechanism(plan, expected)
        self.plan, self.clip = plan, plan.clip
        self.stream = BandedNoise(plan.family.coefs)
        self.store: Path | None = None
        self.restored = 0  # the checkpoint's noise index (resume)
        self.shapes: dict[str, tuple[int, ...]] = {}

    @property
    def threat(self) -> ThreatModel:
        return self.inner.threat

    def privatize(self, update: AdapterState, noise_std: float, bound: float) -> tuple[AdapterState, dict]:
        return self.inner.privatize(update, noise_std, bound)

    def noise_std(self, sampled: int) -> float:
        return 0.0  # central: the server adds it all

    def instruction_clip(self) -> float:
        return 0.0

    def round_clip(self, named: float) -> float:
        return self.clip

    def expected(self, sampled: int) -> dict[str, object]:
        return {"noise-std": 0.0}

    def reply_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
        return dict(shapes)

    def check(self, reply: AdapterState) -> None:
        self.inner.check(reply)

    def round_sum(self, sampled: int) -> RoundSum:
        return _FtrlRound(self, GaussianSum(self.threat, 0.0, self.clip, self.inner.expected_count))

    def events(self, rnd: int) -> tuple[Event, ...]:
        return self.plan.round_events(rnd)

    def state(self) -> dict[str, float]:
        return {"clip": self.clip, "noise_index": self.stream.index}

    def restore(self, state: Mapping[str, float]) -> None:
        self.restored = int(state.get("noise_index", 0))

    # -- the stateful seam: the secret stream beside the run -----------------------------------
    def open_state(self, run_dir: Path, first: int, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Bind the stream of an update of ``shapes`` to ``run_dir``'s noise file before round
        ``first``: a resumed run continues
        the persisted stream (one index ahead of the checkpoint when a round was interrupted after
        its noise was drawn); a new run starts one. Refuses a missing or inconsistent file in one
        line, and overwrites nothing."""
        self.store, self.shapes, restored = run_dir / NOISE_FILE, dict(shapes), self.restored
        if not self.store.exists():
            if first > self.plan.family.rounds:
                return  # a finished run (its stream removed at the end): nothing left to draw
            if restored or first > 1:
                raise FedloraError(
                    f"{self.store} is missing: a resumed dp-ftrl run cannot continue its noise stream "
                    f"(the checkpoint is at noise index {restored})"
                )
            return
        try:
            self.stream = BandedNoise.from_tensors(self.plan.family.coefs, load_file(self.store))
        except (SafetensorError, OSError, KeyError, ValueError) as exc:
            raise FedloraError(f"{self.store} is unreadable ({exc})") from None
        if not restored <= self.stream.index <= first - 1:
            raise FedloraError(
                f"{self.store} is at noise index {self.stream.index}, the checkpoint at {restored} and the "
                f"run resumes at round {first}: not the same run's stream; nothing changed"
            )

    def before_round(self, rnd: int) -> None:
        """Round ``rnd`` uses w_{rnd−1}: indices no round used (skipped, withheld, interrupted before
        its draw was persisted) are drawn and discarded first."""
        if self.stream.index > rnd - 1:
            raise FedloraError(f"the noise stream is at index {self.stream.index}, past round {rnd}")
        while self.stream.index < rnd - 1:
            self.stream.next(standard_normal(self.shapes))

    def draw(self, shapes: Mapping[str, tuple[int, ...]]) -> AdapterState:
        """w_t for this round's sum of ``shapes``, persisted (index t+1) before it is returned."""
        w = self.stream.next(standard_normal(shapes))
        self._persist()
        return w

    def close_state(self) -> None:
        """After the last round: the secret file overwritten with zeros, then removed."""
        if self.store is not None and self.store.exists():
            size = self.store.stat().st_size
            with open(self.store, "r+b") as fh:
                fh.write(b"\0" * size)
                fh.flush()
                os.fsync(fh.fileno())
            self.store.unlink()

    def _persist(self) -> None:
        if self.store is None:
            return  # a mechanism not bound to a run (tests of the round sum alone)
        tensors = {k: v.contiguous() for k, v in self.stream.tensors().items()}
        with replacing(self.store, mode=0o600) as tmp:  # a secret: never readable by others
            save_file(tensors, tmp)


def banded_ftrl(plan: NoisePlan, cfg: RunConfig) -> BandedFtrl:
    """The ``dp-ftrl`` release's mechanism (common/privacy/registry.py): banded correlated noise over
    the sum divided by p·N."""
    return BandedFtrl(plan, cfg.expected_cohort)


def correlated_noise(cfg: RunConfig, dim: int) -> NoisePlan:
    """Correlated noise's plan (common/privacy/planning/ftrl_plan.py): the banded strategy for the server
    optimizer's workload, σ for the run's participation rule and target ε (central noise only)."""
    try:
        ftrl = plan_ftrl(
            cfg.participation,
            cfg.rounds,
            cfg.sample_rate,
            Target(cfg.target_epsilon, cfg.delta),
            cfg.bands,
            workload_name(cfg.server_optimizer, cfg.server_momentum),
            cfg.min_separation,
        )
    except ValueError as exc:
        raise FedloraError(f"cannot plan the correlated noise: {exc}") from None
    ftrl = replace(ftrl, cohort=max(1, round(cfg.expected_cohort)))
    return planned_for_target(cfg, ftrl.sigma, ftrl.q, family=ftrl)


def check_run(cfg: RunConfig) -> None:
    """What a dp-ftrl run must also hold (its release kind's check, common/privacy/registry.py): the
    server adds the correlated noise to the sum of clipped updates (central noise only: it does not
    combine with local, distributed or secure-aggregation noise), planned for a target epsilon by the
    run's participation rule."""
    flag = f"--mechanism {CORRELATED}"
    if not THREATS[cfg.threat_model].clear_replies:  # central: the server adds the noise
        raise FedloraError(
            f"{flag} adds its noise on the server: --threat-model central (not {cfg.threat_model}: "
            "correlated noise does not combine with local, distributed or secure-aggregation noise)"
        )
    plans_for_target(cfg, flag, adaptive_clip=True)
    if cfg.bands > cfg.rounds:
        raise FedloraError(f"--bands {cfg.bands} exceeds the {cfg.rounds} rounds")
    if cfg.min_separation and cfg.participation != "min-sep":
        raise FedloraError("--min-separation applies to --participation min-sep")
    if cfg.min_separation and cfg.min_separation < cfg.bands:
        raise FedloraError(f"--min-separation {cfg.min_separation} is below --bands {cfg.bands}")


__all__ = ["NOISE_FILE", "BandedFtrl", "banded_ftrl", "check_run", "correlated_noise"]
