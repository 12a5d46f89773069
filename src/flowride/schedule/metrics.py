"""What a schedule's finish time means to a user: algorithmic bandwidth (and, with the bounds of
:mod:`flowride.synth.bounds`, how far from the floor it is; the report in :mod:`flowride.api`
puts the two together), and the columns nccl-tests prints for a size sweep, defined once here so
that a synthesized sweep (modelled times) and a run sweep (measured times) agree on them.

nccl-tests' conventions (NVIDIA/nccl-tests ``doc/PERFORMANCE.md`` and ``src/common.cu``):

- ``size`` (B): AllReduce the buffer; AllGather the whole output (``recvcount*n``); ReduceScatter
  the whole input (``sendcount*n``); AlltoAll the whole send buffer of a rank. These are
  flowride's per-GPU sizes (:mod:`flowride.collectives.demand`), one for one.
- ``count`` (elements): the count passed to NCCL: AllReduce the whole buffer; AllGather and
  ReduceScatter the count per rank (size / n); AlltoAll the count per peer (size / n).
- ``algbw`` = size / time (decimal GB/s); ``busbw`` = algbw times the collective's factor:
  AllReduce 2(n-1)/n, ReduceScatter, AllGather and AlltoAll (n-1)/n.
"""

from __future__ import annotations

from flowride.collectives.demand import Collective

ELEMENT_TYPE, ELEMENT_BYTES = "float", 4  # what flowride's runs move (float32), nccl-tests' default type


def algbw_GBps(size_bytes: float, seconds: float) -> float:
    """Algorithmic bandwidth: the output buffer over the finish time (decimal GB/s)."""
    return size_bytes / seconds / 1e9


def busbw_factor(collective: Collective | str, n: int) -> float:
    """nccl-tests' bus-bandwidth correction for ``n`` ranks (doc/PERFORMANCE.md, "Summary"):
    AllReduce 2(n-1)/n; ReduceScatter, AllGather, AlltoAll (n-1)/n."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    if n < 1:
        raise ValueError(f"{n} ranks")
    f = (n - 1) / n
    return 2 * f if coll is Collective.ALLREDUCE else f


def busbw_GBps(collective: Collective | str, n: int, size_bytes: float, seconds: float) -> float:
    """Bus bandwidth: :func:`algbw_GBps` times :func:`busbw_factor` (comparable to link speed)."""
    return algbw_GBps(size_bytes, seconds) * busbw_factor(collective, n)


def run_bytes(size_bytes: int, n: int, chunks: int = 1, itemsize: int = ELEMENT_BYTES) -> int:
    """The bytes per rank that a collective of ``size_bytes`` moves, in whole elements: the count
    (size / itemsize) rounded down to a multiple of n*chunks, and at least one element per chunk.
    flowride rounds every collective, AllReduce included, because its programs cut the buffer
    into n blocks of ``chunks`` equal chunks (n*C chunks: MSCCL's layout, and its executor's
    ``nchunksperloop``). nccl-tests rounds only AllGather, ReduceScatter and AlltoAll, whose
    per-rank count is size / n, to a multiple of n elements (its newer versions to n aligned
    blocks of 16 bytes); its AllReduce runs the count as given (``AllReduceGetCollByteCount``:
    sendcount = recvcount = count), so at a size that is not a multiple of 4·n·C bytes an
    AllReduce row of flowride's is a little smaller than nccl-tests' row of the same size."""
    unit = n * chunks * itemsize
    return max(1, int(size_bytes) // unit) * unit


def nccl_count(collective: Collective | str, n: int, size_bytes: int, itemsize: int = ELEMENT_BYTES) -> int:
    """nccl-tests' ``count`` column for a size: the buffer's elements for AllReduce, the count
    per rank (AllGather, ReduceScatter) or per peer (AlltoAll) otherwise."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    count = int(size_bytes) // itemsize
    return count if coll is Collective.ALLREDUCE else count // n


def redop(collective: Collective | str) -> str:
    """nccl-tests' ``redop`` column: the reduction (sum) of a reducing collective, else none."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    return "sum" if coll.reduces else "none"
