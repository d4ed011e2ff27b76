"""Device selection shared by every command: ``auto`` picks CUDA when present."""

import torch

from common.errors import FedloraError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """Map ``auto|cpu|cuda`` (or ``cuda:N``) to a torch device; fail clearly when CUDA is absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise FedloraError(f"device '{name}' requested but CUDA is not available on this machine")
        return torch.device(name)
    raise FedloraError(f"unknown device '{name}'; choose one of {', '.join(DEVICES)}")
