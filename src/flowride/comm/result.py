"""What a run of a schedule on real processes found: correctness and time against torch.distributed.

Built by rank 0 of the worker (so ``torchrun`` users get the same report) and returned by
:func:`flowride.comm.run_schedule`. Times are per repeat, the slowest rank's (an all_reduce MAX),
because a collective is done only when its last rank is; the summary is the median over repeats,
which one slow repeat on a shared CPU does not move.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from flowride.schedule.metrics import algbw_GBps

MAX_ERRORS = 40
# worker exit codes: correct; failed; bad input; ran to the end but some output is wrong
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_WRONG = 0, 1, 2, 3


@dataclass
class RunResult:
    collective: str
    ranks: int
    program: str
    size_bytes: int  # requested per-rank size (the schedule's convention)
    actual_bytes: int  # what ran: N * C chunks of chunk_bytes
    chunk_bytes: int
    chunks: int
    elements_per_chunk: int
    repeats: int
    warmup: int
    ours_s: list[float] = field(default_factory=list)  # per repeat, max over ranks
    torch_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wrong_elements: int = 0  # nccl-tests' #wrong: output elements off the definition, summed over ranks
    torch_wrong_elements: int = 0  # the same for torch.distributed's output
    backend: str = "gloo"
    device: str = "cpu"
    mode: str = "dataflow"
    reference: str = ""  # the torch.distributed call compared against
    barrier_per_epoch: bool = False
    dtype: str = "float32"
    wall_s: float | None = None  # launcher: spawn to last exit
    # per rank: its monotonic clock minus rank 0's, and the bound on that (flowride.clocks)
    clock_offsets: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every rank's output equals the closed form and torch.distributed's result."""
        return not self.errors

    @property
    def ours_median_s(self) -> float | None:
        return statistics.median(self.ours_s) if self.ours_s else None

    @property
    def torch_median_s(self) -> float | None:
        return statistics.median(self.torch_s) if self.torch_s else None

    @property
    def ratio(self) -> float | None:
        """Our median time over torch.distributed's (below 1: faster)."""
        a, b = self.ours_median_s, self.torch_median_s
        return a / b if a is not None and b else None

    def algbw_GBps(self, seconds: float | None) -> float | None:
        """:func:`flowride.schedule.metrics.algbw_GBps` of what ran (None without a time)."""
        return algbw_GBps(self.actual_bytes, seconds) if seconds else None

    def report(self) -> dict[str, Any]:
        d = asdict(self)
        d.update({
            "ours_median_s": self.ours_median_s,
            "torch_median_s": self.torch_median_s,
            "ratio": self.ratio,
            "algbw_GBps": self.algbw_GBps(self.ours_median_s),
            "torch_algbw_GBps": self.algbw_GBps(self.torch_median_s),
            "correct": self.ok,
        })
        return d

    @classmethod
    def from_report(cls, d: dict[str, Any]) -> RunResult:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})
