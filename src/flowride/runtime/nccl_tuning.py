"""NCCL's own closed-form cost model: how NCCL itself estimates each algorithm and protocol.

NCCL picks an algorithm (ring, tree, NVLS, NVLS-tree, PAT) and a protocol (LL, LL128, Simple) per
call by ``time = latency + bytes / bandwidth`` from tables (NVIDIA/nccl ``src/graph/tuning.cc``,
v2.29: ``ncclTunerConstants``, ``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``). This is that model,
fed with what the topology says instead of NCCL's topology search: the search channels and their
bandwidths (intra-node: the GPU's NVLink at NCCL's per-link rate; inter-node: one channel per NIC,
at the NIC's speed), so it is an estimate of NCCL's estimate. flowride reports it beside the
algorithms it models as schedules (:mod:`flowride.synth.nccl`) and uses it to choose the MSCCL
protocol per size (:func:`nccl_protocol`).

What is left out: NCCL's topology search itself (the per-channel speed steps), the tree
correction table for medium sizes, CollNet/SHARP, the tuner plugins, and the per-channel caps of
architectures other than the one named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flowride.collectives.demand import Collective

NCCL_TUNING_SOURCE = "NVIDIA/nccl v2.29 src/graph/tuning.cc"
PROTOS = ("LL", "LL128", "Simple")

# {algorithm: (LL, LL128, Simple)} in microseconds
BASE_LAT_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "nvls": (0.0, 0.0, 0.0), "nvls_tree": (0.0, 0.0, 0.0),
               "pat": (8.0, 8.0, 8.0)}
HW_LAT_US = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": (0.0, 0.0, 25.0), "nvls_tree": (0.0, 0.0, 25.0),
               "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "nvls": (0.0, 0.0, 18.0), "nvls_tree": (0.0, 0.0, 20.9),
            "pat": (0.0, 0.0, 14.0)},
}
# per-channel caps (GB/s) by architecture, [1 node, 2 nodes, >= 3 nodes]
LL_MAX_BW = {"volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0), "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0)}
RING_LL128_MAX_BW = {"volta": 20.0, "ampere": 20.0, "hopper": 36.7, "blackwell": 40.0}
TREE_MAX_BW = {"volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8), "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0)}
NVLS_TREE_MAX_BW = {"hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 43.8)}
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}
NVLINK_PER_LINK = {"volta": 20.0, "ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}  # GB/s NCCL counts per NVLink
NVLINK_NOMINAL = {"volta": 25.0, "ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}  # per direction, datasheet


@dataclass(frozen=True)
class Machine:
    """What NCCL's model needs to know of the machine."""

    ranks: int
    nodes: int
    intra_GBps: float  # one GPU's scale-up bandwidth per direction (NVLink/xGMI; PCIe if none)
    nic_GBps: float  # one NIC's bandwidth (0: single node)
    nics: int  # NICs per node
    nvls: bool  # the node's NVSwitch multicasts (NVLink SHARP)
    arch: str = "hopper"  # volta, ampere, hopper, blackwell: the per-channel caps used

    @property
    def ppn(self) -> int:
        return self.ranks // max(1, self.nodes)


@dataclass(frozen=True)
class Estimate:
    algorithm: str
    protocol: str
    time_us: float
    latency_us: float
    busbw_GBps: float


def _idx(nodes: int) -> int:
    return 0 if nodes <= 1 else (1 if nodes == 2 else 2)


def _log2i(n: int) -> int:
    return max(0, int(math.floor(math.log2(n)))) if n > 0 else 0


def assumed_channels(nodes: int, nics: int) -> int:
    """The channels this model gives NCCL: one per NIC across nodes, 12 within one node."""
    return max(1, nics if nodes > 1 else 12)


def estimates(coll: Collective | str, m: Machine, size_bytes: int) -> list[Estimate]:
    """Every (algorithm, protocol) NCCL would consider for ``coll`` of ``size_bytes`` (the output
    per GPU for AllGather, the input for ReduceScatter, the buffer for AllReduce and AlltoAll),
    each with its estimated time."""
    c = coll if isinstance(coll, Collective) else Collective.parse(coll)
    n, nodes, ppn = m.ranks, max(1, m.nodes), m.ppn
    arch = m.arch if m.arch in LL_MAX_BW else "hopper"
    intra_bw = m.intra_GBps * NVLINK_PER_LINK[arch] / NVLINK_NOMINAL[arch]  # what NCCL counts of the NVLink
    if nodes > 1:
        inter_bw = m.nics * m.nic_GBps
        ring_bus = min(intra_bw, inter_bw)
    else:
        inter_bw = 0.0
        ring_bus = intra_bw
    ring_channels = assumed_channels(nodes, m.nics)
    nsteps = 2 * (n - 1) if c is Collective.ALLREDUCE else n - 1
    n_inter = 0 if nodes == 1 else (2 * (nodes - 1) if c is Collective.ALLREDUCE else nodes - 1)
    net_overhead = 1.0 if nodes > 1 else 0.0
    out: list[Estimate] = []

    def add(algo: str, p: int, lat: float, bus: float, to_alg: float) -> None:
        if bus <= 0:
            return
        algbw = bus * to_alg
        out.append(Estimate(algo, PROTOS[p], lat + size_bytes / (1000.0 * algbw), lat, bus))

    algos = ["ring"]
    if c is Collective.ALLREDUCE:
        algos.append("tree")
        if m.nvls:
            algos.append("nvls" if nodes == 1 else "nvls_tree")
    elif c in (Collective.ALLGATHER, Collective.REDUCESCATTER):
        if m.nvls and nodes == 1:
            algos.append("nvls")
        if nodes > 1 and ppn == 1:
            algos.append("pat")
    elif c is Collective.ALLTOALL:  # no algorithm: grouped send/receive; priced like a ring step each way
        algos = ["p2p"]
    for algo in algos:
        for p in range(3):
            if algo in ("nvls", "nvls_tree", "pat", "p2p") and PROTOS[p] != "Simple":
                continue
            if algo == "ring":
                intra_lat = HW_LAT_US["nvlink"]["ring"][p]
                inter_lat = HW_LAT_US["net"]["ring"][p]
                lat = BASE_LAT_US["ring"][p] + (nsteps - n_inter) * max(intra_lat, net_overhead * (3 if p == 2 else 1)) + n_inter * inter_lat
                bus = ring_bus
                if p == 0:
                    bus = min(LL_MAX_BW[arch][_idx(nodes)], 0.5 * bus)
                elif p == 1:
                    bus = min(0.92 * bus, ring_channels * RING_LL128_MAX_BW[arch])
                if c is Collective.ALLREDUCE and nodes > 1 and p == 2:
                    lat *= 1.4  # the Simple ring AllReduce plateau factor
                add("ring", p, lat, bus, n / nsteps)
            elif algo == "tree":
                intra_lat = HW_LAT_US["nvlink"]["tree"][p]
                inter_lat = HW_LAT_US["net"]["tree"][p]
                lat = BASE_LAT_US["tree"][p] + 2 * ((ppn - 1) * intra_lat + _log2i(nodes) * inter_lat)
                bus = min(0.92 * ring_bus, ring_channels * TREE_MAX_BW[arch][_idx(nodes)])
                if p == 0:
                    bus = min(bus / 3.8, LL_MAX_BW[arch][_idx(nodes)])
                elif p == 1:
                    bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), ring_channels * RING_LL128_MAX_BW[arch])
                add("tree", p, lat, bus, 0.5)
            elif algo == "nvls":
                eff = NVLS_EFFICIENCY.get(arch, 0.85)
                heads = max(2, min(n, 32))
                per = intra_bw / (heads + 1)  # each head's share (the head pays twice)
                f = 2.0 if c is Collective.ALLREDUCE else (ppn - 1) / ppn
                bus = heads * per * eff * (heads - 1) / heads * f
                to_alg = n / nsteps if c is Collective.ALLREDUCE else 1.0
                add("nvls", p, HW_LAT_US["nvlink"]["nvls"][p], bus, to_alg)
            elif algo == "nvls_tree":
                eff = NVLS_EFFICIENCY.get(arch, 0.85)
                heads = max(2, m.nics)
                per = intra_bw / (heads + 1)
                intra = per * eff * (heads - 1) / heads * 2.0
                inter = m.nic_GBps * (2.0 if nodes <= 2 else 1.0)
                cap = NVLS_TREE_MAX_BW.get(arch, (0, 57.7, 45.5))[_idx(nodes)]
                bus = heads * min(intra, inter, cap)
                lat = HW_LAT_US["nvlink"]["nvls_tree"][p] + 2 * _log2i(nodes) * HW_LAT_US["net"]["nvls_tree"][p]
                add("nvls_tree", p, lat, bus, n / nsteps)
            elif algo == "pat":
                lat = BASE_LAT_US["pat"][p] + _log2i(nodes) * HW_LAT_US["net"]["tree"][p] / 3.5 + n * 2.8
                add("pat", p, lat, 0.75 * min(ring_bus, m.nic_GBps * m.nics), 1.0)
            else:  # p2p AlltoAll: every peer at once; a GPU's NVLink carries all it sends, its NICs what leaves the node
                if intra_bw <= 0 or (nodes > 1 and inter_bw <= 0):
                    continue  # a machine the model has no figures for
                lat = BASE_LAT_US["ring"][p] + HW_LAT_US["net" if nodes > 1 else "nvlink"]["ring"][p]
                secs_per_byte = (n - 1) / n / intra_bw
                if nodes > 1:
                    secs_per_byte = max(secs_per_byte, (n - ppn) / n / (inter_bw / ppn))
                out.append(Estimate("p2p", PROTOS[p], lat + size_bytes * secs_per_byte / 1000.0, lat, 1.0 / secs_per_byte))
    return out


def best_per_algorithm(coll: Collective | str, m: Machine, size_bytes: int) -> dict[str, Estimate]:
    """NCCL's pick of protocol per algorithm (the least estimated time)."""
    best: dict[str, Estimate] = {}
    for e in estimates(coll, m, size_bytes):
        if e.algorithm not in best or e.time_us < best[e.algorithm].time_us:
            best[e.algorithm] = e
    return best


def nccl_protocol(collective: Collective | str, n: int, size_bytes: int, bus_GBps: float) -> str:
    """The protocol NCCL's ring model predicts fastest for ``size_bytes`` on one node of ``n`` GPUs
    whose scale-up bandwidth is ``bus_GBps`` per GPU: LL for small messages, LL128 between,
    Simple for large ones. AlltoAll, which that model leaves out, is costed like AllGather."""
    coll = collective if isinstance(collective, Collective) else Collective.parse(collective)
    if coll is Collective.ALLTOALL:
        coll = Collective.ALLGATHER
    m = Machine(n, 1, bus_GBps, 0.0, 0, False)
    ring = [e for e in estimates(coll, m, size_bytes) if e.algorithm == "ring"]
    return min(ring, key=lambda e: e.time_us).protocol


PROTOCOL_RULE = (f"NCCL's ring cost model ({NCCL_TUNING_SOURCE}, single node, NVLink: baseLat LL/LL128/Simple "
                 "6.6/14.0/8.4 us, hwLat 0.6/1.9/3.4 us per step): per size the protocol of least latency + size / "
                 "bandwidth, where LL has half the bus bandwidth (capped per channel) and the lowest latency, LL128 0.92 "
                 "of it, Simple all of it and the highest latency")
