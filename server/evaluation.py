"""Server-side evaluation of an adapter state on the held-out split."""

from __future__ import annotations

from common.config import RunConfig
from common.errors import FedloraError
from common.models import AdapterState, adapter_state, load_adapter_state
from common.models.head_init import apply_zero_shot_head, descriptions
from common.models.lora_init import apply_lora_init
from common.runtime import open_model, open_split
from common.tasks import make_task


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
        """Round 0's global adapter: the model as loaded, LoRA re-initialised per ``lora-init``
        (seeded, so every process computes the same factors), the head per ``head-init``."""
        load_adapter_state(self.bundle.model, self.bundle.initial)
        apply_lora_init(self.bundle.model, self.cfg.init_kind, self.cfg.seed)
        if self.cfg.head_init == "zero-shot":
            if self.bundle.kind != "seq-cls":
                raise FedloraError(
                    f"--head-init zero-shot is for encoder classifiers; {self.cfg.model} scores label words"
                )
            corpus = self.split.corpus
            texts = descriptions(corpus.name, corpus.label_names)
            apply_zero_shot_head(self.bundle.model, self.bundle.tokenizer, texts, self.bundle.device)
        return adapter_state(self.bundle.model)

    def __call__(self, state: AdapterState) -> dict[str, float]:
        load_adapter_state(self.bundle.model, state)
        self.bundle.model.eval()
        return self.task.evaluate(self.bundle.model, self.examples, self.bundle.device, self.batch_size)
