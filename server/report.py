"""A run's directory: config, per-round metrics (JSONL), final PEFT adapter, summary."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from common.config import RunConfig
from common.errors import FedloraError
from common.models import AdapterState, ModelBundle, load_adapter_state


def default_run_dir(cfg: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{stamp}-{cfg.model.replace('/', '_')}-{cfg.dataset}"


class RunDir:
    """Files of one run. A new run never writes into a directory that already holds a run."""

    def __init__(self, path: Path, cfg: RunConfig) -> None:
        self.path = path
        if (path / "config.json").exists():
            raise FedloraError(f"run directory {path} already holds a run; choose another --out")
        path.mkdir(parents=True, exist_ok=True)
        self._write_json("config.json", asdict(cfg))
        self.metrics_path = path / "metrics.jsonl"

    def log(self, record: dict) -> None:
        """Append one JSON line and fsync it (a crash loses at most the line being written)."""
        with open(self.metrics_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def save_adapter(self, bundle: ModelBundle, state: AdapterState) -> Path:
        """Standard PEFT checkpoint (``PeftModel.from_pretrained`` loads it), published atomically."""
        load_adapter_state(bundle.model, state)
        final, tmp = self.path / "adapter", self.path / ".adapter.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        bundle.model.save_pretrained(tmp)
        bundle.tokenizer.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        return final

    def write_summary(self, summary: dict) -> None:
        self._write_json("summary.json", summary)

    def _write_json(self, name: str, obj: dict) -> None:
        tmp = self.path / f".{name}.tmp"
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path / name)


def format_summary(s: dict) -> str:
    """Readable end-of-run summary."""
    metric = s["metric"]
    lines = [
        "",
        f"fedlora run summary  ({s['model']} on {s['dataset']}, mechanism {s['mechanism']})",
        f"  rounds             {s['rounds_completed']} completed, {s['rounds_skipped']} skipped (nobody sampled)",
        f"  clients            {s['num_clients']} nodes, sample rate p = {s['sample_rate']}",
        f"  held-out {metric:<9} {s['before'][metric]:.4f} before -> {s['after'][metric]:.4f} after"
        f"  ({s['eval_examples']} examples)",
        f"  bytes per round    {s['bytes_down_per_round'] / 1e6:.2f} MB down, "
        f"{s['bytes_up_per_round'] / 1e6:.2f} MB up (mean over completed rounds)",
        f"  client privacy     {s['privacy']}",
        f"  wall time          {s['wall_time_s']:.1f} s",
        f"  adapter            {s['adapter']}",
        f"  metrics            {s['metrics_file']}",
    ]
    return "\n".join(lines)
