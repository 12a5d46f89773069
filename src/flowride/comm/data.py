"""Test data whose right answer is known in closed form, and the comparison that names what is
wrong.

Every input element is an integer in [0, 1000) computed from (rank, input chunk, element), so
any rank can work out what any other rank holds without communicating, and sums over up to 16000
ranks stay exact in float32 (integers below 2**24). Each (rank, chunk) pair gets its own stride
and offset, so a chunk delivered to the wrong slot, from the wrong rank, or added twice shows up
as a wrong value rather than a coincidental match.

Buffer layout follows :func:`flowride.program.model.buffer_layout` (MSCCL's): C chunks per
block, N ranks, blocks in rank order; the executor sizes its buffers from the program.
:func:`expected_chunks` writes out, in numbers, what :func:`flowride.program.model.expected_outputs`
says symbolically (which chunk, with which contributions, lands in each output slot).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.schedule.metrics import run_bytes

MODULUS = 1000
UNWRITTEN = -1.0  # what an output slot holds before the collective: no input value is negative


def elements_per_chunk(coll: Collective, n: int, c: int, size_bytes: int, itemsize: int = 4) -> int:
    """Elements in one chunk when ``size_bytes`` is the schedule's size per rank: the AllGather
    output, the AlltoAll buffer, the ReduceScatter input or the AllReduce buffer. All four are
    N*C chunks, as in :func:`flowride.collectives.demand.make_demand`; at least one element. The
    rounding is :func:`~flowride.schedule.metrics.run_bytes`'s, the one place sizes are rounded."""
    if size_bytes < 1:
        raise InputError("size_bytes", f"{size_bytes} is not positive", "give the per-rank buffer size in bytes")
    return run_bytes(size_bytes, n, c, itemsize) // (n * c * itemsize)


def _mix(rank: int, chunk: int) -> tuple[int, int]:
    """A stride (odd, so elements of one chunk differ) and an offset for one (rank, chunk)."""
    h = (rank * 0x9E3779B1 + chunk * 0x85EBCA77 + 0x27D4EB2F) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x2C1B3C6D) & 0xFFFFFFFF
    h ^= h >> 12
    return 2 * (h % 499) + 1, (h >> 9) % MODULUS


def chunk_values(rank: int, chunk: int, elems: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``elems`` input values of ``rank``'s input chunk ``chunk`` (a CPU tensor)."""
    stride, offset = _mix(rank, chunk)
    idx = torch.arange(elems, dtype=torch.int64)
    return ((idx * stride + offset + idx // MODULUS) % MODULUS).to(dtype)


def fill_input(buf: torch.Tensor, rank: int, chunks: int, elems: int) -> None:
    """Write ``rank``'s input into ``buf`` (``chunks`` chunks of ``elems`` elements)."""
    for k in range(chunks):
        buf[k * elems:(k + 1) * elems].copy_(chunk_values(rank, k, elems, buf.dtype))


def expected_chunks(coll: Collective, n: int, c: int, rank: int, elems: int,
                    dtype: torch.dtype = torch.float32) -> Iterator[tuple[int, str, torch.Tensor]]:
    """(output chunk, what it is, expected values) for every output chunk of ``rank``: the
    collective's definition applied to the closed-form inputs. One chunk at a time, so a 64 MiB
    check never holds a second copy of the whole output."""
    if coll is Collective.ALLGATHER:
        for s in range(n):
            for k in range(c):
                yield s * c + k, f"block of rank {s}, chunk {k}", chunk_values(s, k, elems, dtype)
    elif coll is Collective.ALLTOALL:
        for s in range(n):
            for k in range(c):
                yield s * c + k, f"block from rank {s}, chunk {k}", chunk_values(s, rank * c + k, elems, dtype)
    elif coll is Collective.REDUCESCATTER:
        for k in range(c):
            yield k, f"sum of block {rank}, chunk {k}", _sum_over_ranks(n, rank * c + k, elems, dtype)
    else:
        for b in range(n):
            for k in range(c):
                yield b * c + k, f"sum of block {b}, chunk {k}", _sum_over_ranks(n, b * c + k, elems, dtype)


def _sum_over_ranks(n: int, chunk: int, elems: int, dtype: torch.dtype) -> torch.Tensor:
    acc = torch.zeros(elems, dtype=torch.float64)
    for r in range(n):
        acc += chunk_values(r, chunk, elems, torch.float64)
    return acc.to(dtype)


def count_wrong(out: torch.Tensor, coll: Collective, n: int, c: int, rank: int, elems: int) -> int:
    """Elements of ``out`` (this rank's output buffer) that differ from the collective's
    definition: nccl-tests' ``#wrong`` for one rank (the run sums it over ranks)."""
    out = out.detach().to("cpu")
    return sum(int((out[k * elems:(k + 1) * elems] != want).sum()) for k, _, want in expected_chunks(coll, n, c, rank, elems, out.dtype))


def _fmt(x: float) -> str:
    return "unwritten (-1)" if x == UNWRITTEN else f"{x:g}"


def compare_output(out: torch.Tensor, coll: Collective, n: int, c: int, rank: int, elems: int,
                   reference: torch.Tensor | None = None, ref_name: str = "torch.distributed",
                   limit: int = 8) -> list[str]:
    """Differences between ``out`` (this rank's output buffer) and the closed form and, if given,
    ``reference`` (torch.distributed's result on the same data). One line per wrong chunk, naming
    rank, chunk, what the chunk is, and the first element that differs; at most ``limit`` lines
    plus a count of the rest."""
    out = out.detach().to("cpu")
    ref = None if reference is None else reference.detach().to("cpu")
    problems: list[str] = []
    extra = 0
    for k, what, want in expected_chunks(coll, n, c, rank, elems, out.dtype):
        got = out[k * elems:(k + 1) * elems]
        lines = []
        if not torch.equal(got, want):
            e = int((got != want).nonzero()[0, 0])
            agree = f" ({ref_name} agrees)" if ref is not None and float(ref[k * elems + e]) == float(want[e]) else ""
            lines.append(f"rank {rank} chunk {k} ({what}): element {e} is {_fmt(float(got[e]))}, expected {float(want[e]):g}{agree}")
        if ref is not None:
            theirs = ref[k * elems:(k + 1) * elems]
            if not torch.equal(got, theirs):
                e = int((got != theirs).nonzero()[0, 0])
                if not lines or float(theirs[e]) != float(want[e]):
                    lines.append(f"rank {rank} chunk {k} ({what}): element {e} is {_fmt(float(got[e]))}, {ref_name} gives {float(theirs[e]):g}")
            if not torch.equal(theirs, want):
                e = int((theirs != want).nonzero()[0, 0])
                lines.append(f"rank {rank} chunk {k} ({what}): {ref_name} itself gives {float(theirs[e]):g} at element {e}, "
                             f"the closed form {float(want[e]):g} (the reference, not the schedule, disagrees)")
        for line in lines:
            if len(problems) < limit:
                problems.append(line)
            else:
                extra += 1
    if extra:
        problems.append(f"rank {rank}: {extra} more wrong chunk(s) not listed")
    return problems
