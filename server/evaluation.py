"""Server-side evaluation of an adapter state on the held-out split."""

from __future__ import annotations

import time
from pathlib import Path

from common.config import RunConfig
from common.models import AdapterState, load_adapter_state
from common.runtime import initial_adapter, open_model, open_split
from common.tasks import make_task
from common.timing import phase
from server import eval_cache

#: options that shape an evaluation beyond the adapter's tensors and the held-out examples
_SHAPING = ("precision", "max_length", "lm_blocks", "rank", "lora_alpha", "targets", "pooling", "head_init")


class Evaluator:
    """Holds the server's model copy and the tokenised test set; call it with a state."""

    def __init__(self, cfg: RunConfig, batch_size: int = 16) -> None:
        self.split = open_split(cfg)
        self.bundle = open_model(cfg, self.split)
        self.task = make_task(self.bundle, self.split.corpus, cfg.max_length, cfg.lm_blocks)
        test = self.split.test
        self.examples = self.task.encode(self.split.texts(test), self.split.labels(test))
        self.batch_size = batch_size
        self.cfg = cfg

    def initial_state(self) -> AdapterState:
        """Round 0's global adapter (common/runtime.py ``initial_adapter``)."""
        return initial_adapter(self.cfg, self.bundle, self.split)

    def __call__(self, state: AdapterState) -> dict[str, float]:
        """The held-out metrics of ``state`` (read from ``--eval-cache`` when computed before)."""
        return self.timed(state)[0]

    def timed(self, state: AdapterState) -> tuple[dict[str, float], float, bool]:
        """``(metrics, seconds the evaluation took, whether it came from the cache)``."""
        key = self._cache_key(state) if self.cfg.eval_cache else None
        if key is not None and (hit := eval_cache.read(Path(self.cfg.eval_cache), key)) is not None:
            return hit[0], hit[1], True
        start = time.monotonic()
        with phase("evaluation"):
            load_adapter_state(self.bundle.model, state)
            self.bundle.model.eval()
            metrics = self.task.evaluate(
                self.bundle.model, self.examples, self.bundle.device, self.batch_size
            )
        seconds = time.monotonic() - start
        if key is not None:
            eval_cache.write(Path(self.cfg.eval_cache), key, metrics, seconds)
        return metrics, seconds, False

    def _cache_key(self, state: AdapterState) -> str:
        """server/eval_cache.py's key: what shapes the evaluation besides the examples and ``state``."""
        cfg, model = self.cfg, self.bundle.model
        settings = {
            "model": cfg.model,
            "dtype": str(next(model.parameters()).dtype),
            "device": str(self.bundle.device),
            "task": f"{type(self.task).__module__}.{type(self.task).__qualname__}",
            "task_code": eval_cache.code_digest(type(self.task)),
            "batch_size": self.batch_size,
            **{k: getattr(cfg, k) for k in _SHAPING},
        }
        test = self.split.test
        examples = zip(self.split.texts(test), self.split.labels(test), strict=True)
        return eval_cache.cache_key(settings, examples, state)

    def samples(self, state: AdapterState, count: int = 2, max_new_tokens: int = 40) -> list[tuple[str, str]]:
        """``(prompt, continuation)`` for the first line of the first ``count`` held-out texts, from
        ``state`` (a language-modelling corpus only; [] otherwise). Seeded by the run's seed: the
        adapter is public once released, so sampling from it needs no private randomness."""
        if self.split.corpus.task != "lm":
            return []
        from common.models.generate import generate

        load_adapter_state(self.bundle.model, state)
        self.bundle.model.eval()
        prompts = [text.split("\n", 1)[0][:200] for text in self.split.texts(self.split.test[:count])]
        tokenizer = self.bundle.tokenizer
        return [
            (p, generate(self.bundle.model, tokenizer, p, max_new_tokens, seed=self.cfg.seed + k))
            for k, p in enumerate(prompts)
        ]
