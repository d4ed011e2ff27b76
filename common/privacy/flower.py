"""Our accountants behind Flower's ``flwr.serverapp.PrivacyAccountant`` protocol (flwr >= 1.35).

Supports the (Poisson, add-or-remove-one) and (no-amplification, add-or-remove-one) models:
an event's sampling rate is ``sample_size / population_size`` for Poisson and 1 otherwise.
"""

from __future__ import annotations

from flwr.serverapp import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    PrivacySpent,
    SamplingMethod,
)

from common.privacy.accountants import Event, make_accountant

SUPPORTED = {SamplingMethod.POISSON, SamplingMethod.NO_AMPLIFICATION}


class FlowerAccountant:
    """Implements ``flwr.serverapp.PrivacyAccountant`` with a ``gdp``, ``rdp`` or ``pld`` backend."""

    def __init__(self, config: PrivacyConfig, accountant: str = "pld") -> None:
        if (
            config.sampling_method not in SUPPORTED
            or config.neighboring_relation != NeighboringRelation.ADD_OR_REMOVE_ONE
        ):
            raise ValueError(
                f"unsupported accounting model ({config.sampling_method.value}, {config.neighboring_relation.value}); "
                "use poisson or no-amplification with add-or-remove-one"
            )
        self._config = config
        self._backend = make_accountant(accountant)

    @property
    def config(self) -> PrivacyConfig:
        return self._config

    @property
    def num_releases(self) -> int:
        return self._backend.rounds

    def _event(self, event: GaussianPrivacyEvent, count: int) -> Event:
        if self._config.sampling_method == SamplingMethod.POISSON:
            rate = event.sample_size / event.population_size
        else:
            rate = 1.0
        return Event(event.noise_multiplier, rate, count)

    def compose(self, event: GaussianPrivacyEvent, count: int = 1) -> None:
        self._backend.compose(self._event(event, count))

    def get_epsilon(self, delta: float) -> float:
        return self._backend.epsilon(delta)

    def get_delta(self, epsilon: float) -> float:
        return self._backend.delta(epsilon)

    def get_privacy_spent(self, delta: float | None = None) -> PrivacySpent:
        delta = self._config.target_delta if delta is None else delta
        return PrivacySpent(self.get_epsilon(delta), delta, self.num_releases, self._backend.name)

    def would_exceed(
        self, event: GaussianPrivacyEvent, max_epsilon: float | None = None, count: int = 1
    ) -> bool:
        limit = self._config.max_epsilon if max_epsilon is None else max_epsilon
        if limit is None:
            return False
        trial = make_accountant(self._backend.name)
        trial.load_state_dict(self._backend.state_dict())
        trial.compose(self._event(event, count))
        return trial.epsilon(self._config.target_delta) > limit

    def state_dict(self) -> dict[str, object]:
        return {"accountant": self._backend.state_dict(), "target_delta": self._config.target_delta}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self._backend.load_state_dict(state["accountant"])  # type: ignore[arg-type]
