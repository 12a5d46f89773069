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


@dataclass(frozen=True)
class Calibration:
    """Corrections to NCCL's own figures, fitted to measured collectives (:mod:`flowride.runtime.fit`).

    The identity (every field at its default) is NCCL's model as NCCL computes it. ``floor_us`` is
    what every call pays beyond NCCL's latencies (the launch, the kernel's start and completion),
    ``floor_net_us`` what a call across nodes pays on top (the proxy's and the network's start);
    ``lat_intra``/``lat_net`` scale the per-step latencies of hops inside a node and through the
    network proxy; ``bw_intra``/``bw_net`` scale the bandwidth NCCL counts per NVLink and per NIC
    (what the hardware sustains against NCCL's table); ``nvls_eff`` replaces NCCL's NVLS
    efficiency; ``ramp_MiB`` is how much data an algorithm needs in flight before it runs at its
    bandwidth: a call of S bytes gets ``1 / (1 + sqrt(ramp / S))`` of it (0: no ramp), so its
    time is ``S / B + sqrt(S * ramp) / B``: the fill and drain of its pipeline grow with the chunk
    it pipelines, which grows with S. ``launch_us`` is one kernel launch: a process that drives g
    GPUs (nccl-tests ``-g g``) launches g kernels one after another, and a launch replayed from a
    CUDA graph (``-G``) costs none of it; ``lat_nvls`` scales NVLS's own latencies."""

    floor_us: float = 0.0
    floor_net_us: float = 0.0  # added where the call crosses nodes
    lat_intra: float = 1.0
    lat_net: float = 1.0
    bw_intra: float = 1.0
    bw_net: float = 1.0
    nvls_eff: float | None = None
    ramp_MiB: float = 0.0
    launch_us: float = 0.0
    lat_nvls: float = 1.0
    ramp_net_MiB: float = 0.0  # added to ramp_MiB where the call crosses nodes (the network's pipeline)
    # what a tree may carry across exactly two nodes against NCCL's cap (NCCL counts a ring's NIC
    # share; on two nodes each NIC carries half of what the bus bandwidth counts: up to 2x)
    tree_net: float = 1.0

    def ramp(self, size_bytes: float, nodes: int = 1) -> float:
        r = self.ramp_MiB + (self.ramp_net_MiB if nodes > 1 else 0.0)
        if r <= 0 or size_bytes <= 0:
            return 1.0
        return 1.0 / (1.0 + math.sqrt(r * 2**20 / size_bytes))


@dataclass(frozen=True)
class Launch:
    """How the measured program launched the collective: GPUs driven by one thread (nccl-tests
    ``-g``), and whether launches were replayed from a CUDA graph (``-G``)."""

    gpus_per_thread: int = 1
    cuda_graph: bool = False


ONE_PER_THREAD = Launch()


IDENTITY = Calibration()


def _idx(nodes: int) -> int:
    return 0 if nodes <= 1 else (1 if nodes == 2 else 2)


def _log2i(n: int) -> int:
    return max(0, int(math.floor(math.log2(n)))) if n > 0 else 0


def assumed_channels(nodes: int, nics: int) -> int:
    """The channels this model gives NCCL: one per NIC across nodes, 12 within one node."""
    return max(1, nics if nodes > 1 else 12)


def estimates(coll: Collective | str, m: Machine, size_bytes: int, cal: Calibration = IDENTITY,
              launch: Launch = ONE_PER_THREAD) -> list[Estimate]:
    """Every (algorithm, protocol) NCCL would consider for ``coll`` of ``size_bytes`` (the output
    per GPU for AllGather, the input for ReduceScatter, the buffer for AllReduce and AlltoAll),
    each with its estimated time; ``cal`` corrects NCCL's figures (:class:`Calibration`)."""
    c = coll if isinstance(coll, Collective) else Collective.parse(coll)
    n, nodes, ppn = m.ranks, max(1, m.nodes), m.ppn
    arch = m.arch if m.arch in LL_MAX_BW else "hopper"
    intra_bw = m.intra_GBps * NVLINK_PER_LINK[arch] / NVLINK_NOMINAL[arch] * cal.bw_intra  # what NCCL counts of the NVLink
    nic_bw = m.nic_GBps * cal.bw_net
    base_lat = {a: tuple(x * cal.lat_intra for x in v) for a, v in BASE_LAT_US.items()}
    hw_lat = {"nvlink": {a: tuple(x * (cal.lat_nvls if a.startswith("nvls") else cal.lat_intra) for x in v)
                         for a, v in HW_LAT_US["nvlink"].items()},
              "net": {a: tuple(x * cal.lat_net for x in v) for a, v in HW_LAT_US["net"].items()}}
    ramp = cal.ramp(size_bytes, nodes)
    floor = cal.floor_us + (cal.floor_net_us if nodes > 1 else 0.0) + cal.launch_us * (launch.gpus_per_thread - 1)
    if launch.cuda_graph:
        floor = max(0.0, floor - cal.launch_us)
    if nodes > 1:
        inter_bw = m.nics * nic_bw
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
        algbw = bus * to_alg * ramp
        lat += floor
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
                intra_lat = hw_lat["nvlink"]["ring"][p]
                inter_lat = hw_lat["net"]["ring"][p]
                lat = base_lat["ring"][p] + (nsteps - n_inter) * max(intra_lat, net_overhead * (3 if p == 2 else 1)) + n_inter * inter_lat
                bus = ring_bus
                if p == 0:
                    bus = min(LL_MAX_BW[arch][_idx(nodes)], 0.5 * bus)
                elif p == 1:
                    bus = min(0.92 * bus, ring_channels * RING_LL128_MAX_BW[arch])
                if c is Collective.ALLREDUCE and nodes > 1 and p == 2:
                    lat *= 1.4  # the Simple ring AllReduce plateau factor
                add("ring", p, lat, bus, n / nsteps)
            elif algo == "tree":
                intra_lat = hw_lat["nvlink"]["tree"][p]
                inter_lat = hw_lat["net"]["tree"][p]
                lat = base_lat["tree"][p] + 2 * ((ppn - 1) * intra_lat + _log2i(nodes) * inter_lat)
                two = cal.tree_net if nodes == 2 else 1.0
                tree_bus = min(intra_bw, inter_bw * two) if nodes > 1 else ring_bus
                bus = min(0.92 * tree_bus, ring_channels * TREE_MAX_BW[arch][_idx(nodes)] * two)
                if p == 0:
                    bus = min(bus / 3.8, LL_MAX_BW[arch][_idx(nodes)])
                elif p == 1:
                    bus = min(bus * (7 / 9 if nodes == 1 else 120 / 128), ring_channels * RING_LL128_MAX_BW[arch])
                add("tree", p, lat, bus, 0.5)
            elif algo == "nvls":
                eff = cal.nvls_eff or NVLS_EFFICIENCY.get(arch, 0.85)
                heads = max(2, min(n, 32))
                per = intra_bw / (heads + 1)  # each head's share (the head pays twice)
                f = 2.0 if c is Collective.ALLREDUCE else (ppn - 1) / ppn
                bus = heads * per * eff * (heads - 1) / heads * f
                to_alg = n / nsteps if c is Collective.ALLREDUCE else 1.0
                add("nvls", p, hw_lat["nvlink"]["nvls"][p], bus, to_alg)
            elif algo == "nvls_tree":
                eff = cal.nvls_eff or NVLS_EFFICIENCY.get(arch, 0.85)
                heads = max(2, m.nics)
                per = intra_bw / (heads + 1)
                intra = per * eff * (heads - 1) / heads * 2.0
                inter = nic_bw * (2.0 if nodes <= 2 else 1.0)
                cap = NVLS_TREE_MAX_BW.get(arch, (0, 57.7, 45.5))[_idx(nodes)]
                bus = heads * min(intra, inter, cap)
                lat = hw_lat["nvlink"]["nvls_tree"][p] + 2 * _log2i(nodes) * hw_lat["net"]["nvls_tree"][p]
                add("nvls_tree", p, lat, bus, n / nsteps)
            elif algo == "pat":
                lat = base_lat["pat"][p] + _log2i(nodes) * hw_lat["net"]["tree"][p] / 3.5 + n * 2.8
                add("pat", p, lat, 0.75 * min(ring_bus, nic_bw * m.nics), 1.0)
            else:  # p2p AlltoAll: every peer at once; a GPU's NVLink carries all it sends, its NICs what leaves the node
                if intra_bw <= 0 or (nodes > 1 and inter_bw <= 0):
                    continue  # a machine the model has no figures for
                lat = base_lat["ring"][p] + hw_lat["net" if nodes > 1 else "nvlink"]["ring"][p]
                secs_per_byte = (n - 1) / n / intra_bw
                if nodes > 1:
                    secs_per_byte = max(secs_per_byte, (n - ppn) / n / (inter_bw / ppn))
                lat += floor
                out.append(Estimate("p2p", PROTOS[p], lat + size_bytes * secs_per_byte / (1000.0 * ramp), lat, 1.0 / secs_per_byte))
    return out


def best_per_algorithm(coll: Collective | str, m: Machine, size_bytes: int, cal: Calibration = IDENTITY,
                       launch: Launch = ONE_PER_THREAD) -> dict[str, Estimate]:
    """NCCL's pick of protocol per algorithm (the least estimated time)."""
    best: dict[str, Estimate] = {}
    for e in estimates(coll, m, size_bytes, cal, launch):
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
