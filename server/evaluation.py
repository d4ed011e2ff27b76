"""Server-side evaluation of an adapter state on the held-out split."""

from __future__ import annotations

from common.config import RunConfig
from common.models import AdapterState, load_adapter_state
from common.runtime import initial_adapter, open_model, open_split
from common.tasks import make_task
from common.timing import phase


class Evaluator:
    """Holds the server's model copy and the tokenised test set; call it with a state."""

    def __init__(self, cfg: RunConfig, batch_size: int = 16) -> None:
        self.split = open_split(cfg)
        self.bundle = open_model(cfg, self.split)
        self.task = make_task(self.bundle.kind, self.split.corpus, self.bundle.tokenizer, cfg.max_length)
        test = self.split.test
        self.examples = self.task.encode(self.split.texts(test), self.split.labels(test))
        self.batch_size = batch_size
        self.cfg = cfg

    def initial_state(self) -> AdapterState:
        """Round 0's global adapter (common/runtime.py ``initial_adapter``)."""
        return initial_adapter(self.cfg, self.bundle, self.split)

    def __call__(self, state: AdapterState) -> dict[str, float]:
        with phase("evaluation"):
            load_adapter_state(self.bundle.model, state)
            self.bundle.model.eval()
            return self.task.evaluate(self.bundle.model, self.examples, self.bundle.device, self.batch_size)
