"""How many examples one forward/backward of a DP step takes (the micro-batch).

On the CPU it is what the run asked for (``--microbatch``, else at most 16): memory there is the
process's, and a CPU step is bound by arithmetic, not by how many passes it takes. On CUDA a step of
small passes is bound by kernel launches (issue 54: at 128 × 128 tokens two passes of 64 cost 2.6× a
plain step's one), so with ``fit`` the first micro-batch of the run is measured (its peak allocated
bytes per padded token) and every later step takes as many examples per pass as fill ``FILL`` of
the memory the device can still hand out, for the client's longest example: a logical batch that
fits runs as one pass. The sum over a step does not depend on how it is cut (client/dp/engine.py),
so neither does any result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from common.tasks.base import by_length, chunks, example_length

#: the share of the device's available memory a fitted micro-batch may fill
FILL = 0.8


def fit_microbatch(bytes_per_token: float, longest: int, available: int, floor: int, ceiling: int) -> int:
    """Examples per pass that fill ``FILL`` of ``available`` bytes at ``bytes_per_token`` for examples of
    ``longest`` tokens, at least ``floor`` (the configured size) and at most ``ceiling`` (all examples)."""
    per_example = max(bytes_per_token * longest, 1.0)
    return max(floor, min(ceiling, int(FILL * available / per_example)))


def cuda_available_bytes(device: torch.device) -> int:
    """Bytes a CUDA device can still hand out: free on the device plus what PyTorch's caching
    allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class Microbatches:
    """Cuts each DP step's logical batch into micro-batches of :attr:`size` examples (in order of
    length); with ``fit`` on CUDA, sizes them from the device's memory after measuring the first."""

    def __init__(self, size: int, examples: Sequence[dict], device: torch.device, fit: bool = False) -> None:
        self.size, self.examples, self.device = size, examples, device
        self.measure = fit and device.type == "cuda"

    def parts(self, idx: Sequence[int]) -> Iterator[list[int]]:
        """``idx`` by length in micro-batches. While measuring, the work the caller does on a part
        between two ``next`` calls is what is measured."""
        for part in chunks(by_length(idx, self.examples), self.size):
            if not self.measure:
                yield part
                continue
            torch.cuda.synchronize(self.device)
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield part
            torch.cuda.synchronize(self.device)
            used = torch.cuda.max_memory_allocated(self.device) - base
            tokens = len(part) * max(example_length(self.examples[i]) for i in part)
            longest = max(example_length(ex) for ex in self.examples)
            self.size = fit_microbatch(
                used / max(tokens, 1),
                longest,
                cuda_available_bytes(self.device),
                self.size,
                len(self.examples),
            )
            self.measure = False  # from the next step on (this step's cut is fixed)
