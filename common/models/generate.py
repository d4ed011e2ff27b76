"""``fedlora generate``: sample text from a saved causal-LM adapter on its base model.

The adapter directory is the one a run saves (``runs/<run>/adapter``, common/models/portable.py);
its base model is resolved from the Hub id it names (packaged models offline). Generation is
post-processing of the released adapter: it costs no privacy budget.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import FedloraError
from common.progress import bar

if TYPE_CHECKING:
    import torch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", required=True, help="a saved adapter directory (runs/<run>/adapter)")
    parser.add_argument(
        "--prompt", required=True, help="the text to continue (with --chat: the user's message)"
    )
    parser.add_argument(
        "--chat",
        action="store_true",
        help="send --prompt as a user message through the model's chat template (a stated fallback "
        "for a tokenizer without one: common/tasks/chat.py) and print the assistant's answer",
    )
    parser.add_argument("--system", help="with --chat: a system message before the user's")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    parser.add_argument(
        "--temperature", type=float, default=0.8, help="sampling temperature; 0 = greedy (default 0.8)"
    )
    parser.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95)")
    parser.add_argument("--samples", type=int, default=1, help="independent samples to print (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument(
        "--with-base",
        action="store_true",
        help="also sample from the base model alone (the adapter disabled), same prompt and seed, "
        "printed before the adapter's: what the adapter changed",
    )


class _Counted:
    """A logits processor that changes nothing and counts each generated token on ``progress``."""

    def __init__(self, progress) -> None:
        self.progress = progress

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.progress.update(1)
        return scores


def generate(
    model,
    tokenizer,
    prompt: str,
    max_new_tokens: int = 64,
    temperature: float = 0.8,
    top_p: float = 0.95,
    seed: int = 0,
) -> str:
    """The continuation of ``prompt`` (without the prompt): greedy when ``temperature`` is 0, else
    nucleus sampling seeded by ``seed``."""
    import torch
    from transformers import LogitsProcessorList

    inputs = tokenizer(prompt, return_tensors="pt").to(next(model.parameters()).device)
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {}
    torch.manual_seed(seed)
    with torch.no_grad(), bar(max_new_tokens, "generating", "token") as progress:
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            logits_processor=LogitsProcessorList([_Counted(progress)]),
            **({"do_sample": False} | sampling),
        )
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def chat_prompt(tokenizer, message: str, system: str | None = None) -> tuple[str, str]:
    """``(prompt, shown)``: ``message`` as the user's turn (after ``system``, if any) rendered by the
    chat template with the assistant's generation prompt, and what to print before the answer
    (nothing: the answer alone)."""
    from common.tasks.chat import render

    turns = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": message}
    ]
    return render(tokenizer, turns, generation_prompt=True), ""


def _check(args: argparse.Namespace) -> None:
    if args.system and not args.chat:
        raise FedloraError("--system goes with --chat")
    if args.max_new_tokens < 1 or args.samples < 1:
        raise FedloraError("--max-new-tokens and --samples must be >= 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        raise FedloraError("--temperature must be >= 0 and --top-p in (0, 1]")
    sidecar = Path(args.adapter) / "fedlora.json"
    kind = json.loads(sidecar.read_text(encoding="utf-8")).get("kind") if sidecar.is_file() else None
    if kind not in (None, "causal-lm"):
        raise FedloraError(
            f"{args.adapter} is a {kind} adapter (a classifier head); generate needs a causal LM adapter"
        )


def run(args: argparse.Namespace) -> int:
    from common.models.portable import load_adapter

    _check(args)
    if sys.stderr.isatty():  # loading a base model takes a while: say what is happening
        print(f"loading {args.adapter} on its base model ...", file=sys.stderr)
    model, tokenizer = load_adapter(args.adapter)
    if "CausalLM" not in type(model.get_base_model()).__name__:
        raise FedloraError(f"{args.adapter}: the base model is not a causal LM; nothing to generate")

    prompt, shown = (
        chat_prompt(tokenizer, args.prompt, args.system) if args.chat else (args.prompt, args.prompt)
    )

    def sample(k: int) -> str:
        return shown + generate(
            model, tokenizer, prompt, args.max_new_tokens, args.temperature, args.top_p, args.seed + k
        )

    for k in range(args.samples):
        if args.with_base:
            with model.disable_adapter():  # PEFT: the base model's own forward, same weights otherwise
                base = sample(k)
            print(f"[base, seed {args.seed + k}]\n{base}\n[adapter, seed {args.seed + k}]")
        print(sample(k))
        if k + 1 < args.samples:
            print("---")
    return 0
