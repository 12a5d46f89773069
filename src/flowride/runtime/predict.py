"""What nccl-tests would print for a collective on a cluster: NCCL's choice of algorithm and
protocol and its time, by NCCL's own cost model corrected by a :class:`Calibration`.

A cluster is a node type of :data:`flowride.topology.fabrics.NODE_TYPES` times a node count, with
its NICs; :func:`machine_for` reads off what NCCL's model takes. Sizes are nccl-tests' ``size``
(AllGather: the gathered output per rank; ReduceScatter: the input per rank; AllReduce: the
buffer; AlltoAll: the whole send buffer per rank)."""

from __future__ import annotations

from dataclasses import dataclass

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.runtime.nccl_tuning import (
    IDENTITY,
    ONE_PER_THREAD,
    Calibration,
    Estimate,
    Launch,
    Machine,
    estimates,
)
from flowride.schedule.metrics import busbw_factor
from flowride.topology.fabrics import NODE_TYPES

# the per-channel caps of NCCL's tables each node type gets (RCCL's machines: the closest NVIDIA
# generation by link speed; the calibration absorbs the rest)
ARCH_OF_NODE = {"dgx-a100": "ampere", "a800": "ampere", "dgx-h100": "hopper", "h800": "hopper", "hgx-b200": "blackwell",
                "dgx2": "volta", "ndv2": "volta", "mi300x": "hopper", "mi250": "ampere"}
ALGORITHMS = ("ring", "tree", "nvls", "nvls_tree", "pat", "p2p")


def machine_for(node: str, nodes: int, nics: int | None = None, nic_Gbps: float | None = None) -> Machine:
    """NCCL's view of ``nodes`` nodes of type ``node``: one GPU's scale-up bandwidth (an NVSwitch
    port, or every mesh link added), each NIC's bandwidth, NICs per node, NVLS, the architecture."""
    if node not in NODE_TYPES:
        raise InputError("--node", f"unknown node type {node!r}", f"one of {', '.join(NODE_TYPES)}")
    if nodes < 1:
        raise InputError("--nodes", f"{nodes} nodes", "give 1 or more")
    nt = NODE_TYPES[node]
    if nt.inside == "nvswitch":
        intra = nt.link_GBps
    elif nt.inside == "mesh":
        intra = nt.link_GBps * (nt.gpus - 1)
    else:  # the TE-CCL hybrid meshes: NCCL's rings run at the slowest ring's pace; their links added is an upper figure
        intra = 150.0 if node == "ndv2" else 350.0
    k = nt.nics if nics is None else nics
    gbps = nt.nic_Gbps if nic_Gbps is None else nic_Gbps
    return Machine(nt.gpus * nodes, nodes, intra, gbps / 8.0 if nodes > 1 else 0.0, k, nt.multicast, ARCH_OF_NODE.get(node, "hopper"))


@dataclass(frozen=True)
class Prediction:
    bytes: int
    time_us: float
    algorithm: str
    protocol: str
    algbw_GBps: float
    busbw_GBps: float


def lower_bound_us(collective: Collective | str, m: Machine, size_bytes: int) -> float:
    """No algorithm moves the bytes faster than the links' line rates allow: each GPU's scale-up
    port (the datasheet figure of :func:`machine_for`) and each node's NICs added. AllReduce moves
    2(n-1)/n of the buffer through every GPU (Patarasuk and Yuan) unless the switch reduces (NVLS:
    the buffer once), and 2(N-1)/N of it through every node's NICs across N nodes; AllGather and
    ReduceScatter move (n-1)/n of the size; AlltoAll sends (n-1)/n of it, ppn(n-ppn)/n per node
    across the network. Latencies count nothing: the bound holds for any calibration."""
    c = collective if isinstance(collective, Collective) else Collective.parse(collective)
    n, nodes, ppn = m.ranks, max(1, m.nodes), m.ppn
    if n <= 1 or m.intra_GBps <= 0:
        return 0.0
    share = (n - 1) / n
    per_gpu = (1.0 if m.nvls else 2 * share) * size_bytes if c is Collective.ALLREDUCE else share * size_bytes
    t = per_gpu / (m.intra_GBps * 1e3)
    if nodes > 1 and m.nics and m.nic_GBps > 0:
        x = m.nics * m.nic_GBps * 1e3  # bytes per us through one node's NICs
        cross = {Collective.ALLREDUCE: 2 * (nodes - 1) / nodes * size_bytes,
                 Collective.ALLTOALL: ppn * (n - ppn) / n * size_bytes}.get(c, (nodes - 1) / nodes * size_bytes)
        t = max(t, cross / x)
    return t


def choose(collective: Collective | str, m: Machine, size_bytes: int, cal: Calibration = IDENTITY,
           algorithm: str | None = None, launch: Launch = ONE_PER_THREAD) -> Estimate:
    """NCCL's pick: the (algorithm, protocol) of least time, among ``algorithm``'s when a run
    forces one (NCCL_ALGO)."""
    c = collective if isinstance(collective, Collective) else Collective.parse(collective)
    es = estimates(c, m, size_bytes, cal, launch)
    if algorithm is not None:
        forced = [e for e in es if e.algorithm == algorithm]
        if not forced:
            raise InputError("algorithm", f"NCCL has no {algorithm} for {c.value} on this machine",
                             f"one of {', '.join(sorted({e.algorithm for e in es}))}")
        es = forced
    return min(es, key=lambda e: e.time_us)


def predict(collective: Collective | str, m: Machine, sizes: list[int], cal: Calibration = IDENTITY,
            algorithm: str | None = None, launch: Launch = ONE_PER_THREAD) -> list[Prediction]:
    """One row per size, as nccl-tests prints it (time in us, algbw and busbw in GB/s)."""
    c = collective if isinstance(collective, Collective) else Collective.parse(collective)
    out = []
    for s in sizes:
        e = choose(c, m, s, cal, algorithm, launch)
        alg = s / (e.time_us * 1e3)
        out.append(Prediction(int(s), e.time_us, e.algorithm, e.protocol, alg, alg * busbw_factor(c, m.ranks)))
    return out
