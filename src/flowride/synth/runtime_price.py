"""A flowride schedule priced as a runtime would run it, with the costs the calibrated model of
NCCL charges NCCL's own algorithms (:mod:`flowride.runtime`).

An exported schedule runs inside NCCL's runtime (MSCCL) or one like it (MSCCL++): each GPU's send
to another GPU is a step of a protocol, so it pays that protocol's per-step latency once (NCCL's
``hwLat`` for a hop inside a node or through the network proxy, scaled by the calibration; the
switches it passes add none) instead of the links' bare alphas, and moves bytes at what the link sustains under that protocol (the bandwidth NCCL
counts per NVLink or NIC, scaled by the calibration; LL carries half, LL128 0.92 of it) instead
of its line rate; the call pays the runtime's base latency and floors once. The schedule keeps
its routes, copies and order: it is retimed onto those link figures
(:func:`flowride.synth.greedy.retime`) and replayed by the simulator.

This is the same price on both sides of a "faster than NCCL": NCCL's algorithms by its calibrated
closed form, flowride's schedules by this. What it leaves out: thread blocks and channels as the
exporter deals them (a schedule is taken to run each link's sends in order, one channel per link),
and the kernel's own work per step beyond NCCL's per-step latency.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flowride.runtime.nccl_tuning import (
    BASE_LAT_US,
    HW_LAT_US,
    IDENTITY,
    NVLINK_NOMINAL,
    NVLINK_PER_LINK,
    PROTOS,
    Calibration,
)
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.greedy import retime
from flowride.topology.model import Link, Topology
from flowride.topology.timing import epoch_timing

# the share of a link's sustained bandwidth each protocol carries as data (NCCL's model: LL's
# 8-byte lines hold 4 bytes of data; LL128 0.92 of the bus)
PROTOCOL_SHARE = {"LL": 0.5, "LL128": 0.92, "Simple": 1.0}


@dataclass(frozen=True)
class RuntimePrice:
    time_us: float
    protocol: str
    floor_us: float  # what the call pays once: the runtime's base latency and the calibration's floors
    epochs: int
    crosses_nodes: bool


def crosses(topo: Topology, link: Link) -> bool:
    """A hop through the network (its ends in different nodes, or one of them a network switch)."""
    a, b = topo.nodes[link.src].group, topo.nodes[link.dst].group
    return a is None or b is None or a != b


def runtime_links(topo: Topology, cal: Calibration, protocol: str, arch: str = "hopper") -> list[Link]:
    """Each link at what it sustains under ``protocol``; a link out of a GPU carries the protocol's
    per-step latency for its hop kind, a link out of a switch none: a step is one GPU's send to
    another, whatever switches it passes (NCCL's ``hwLat`` is per step, not per cable)."""
    p = PROTOS.index(protocol)
    per_link = NVLINK_PER_LINK.get(arch, NVLINK_PER_LINK["hopper"]) / NVLINK_NOMINAL.get(arch, NVLINK_NOMINAL["hopper"])
    out = []
    for lk in topo.links:
        net = crosses(topo, lk)
        bw = lk.bandwidth_GBps * (cal.bw_net if net else per_link * cal.bw_intra) * PROTOCOL_SHARE[protocol]
        lat = HW_LAT_US["net" if net else "nvlink"]["ring"][p] * (cal.lat_net if net else cal.lat_intra)
        out.append(Link(lk.src, lk.dst, bw, lat * 1e-6 if topo.nodes[lk.src].is_gpu else 0.0))
    return out


def runtime_price(sched: Schedule, protocol: str, cal: Calibration = IDENTITY, arch: str = "hopper") -> RuntimePrice:
    """``sched`` run by the runtime under ``protocol`` (LL, LL128, Simple) with calibration ``cal``."""
    topo = sched.topology
    net = any(crosses(topo, topo.links[s.link]) for s in sched.sends)
    nodes = 2 if net else 1
    ramp = cal.ramp(sched.demand.size_bytes, nodes)
    links = [replace(lk, bandwidth_GBps=lk.bandwidth_GBps * ramp) for lk in runtime_links(topo, cal, protocol, arch)]
    rt = replace(topo, links=tuple(links))
    timing = epoch_timing(rt, sched.demand.chunk_bytes, "fast")
    if any(s.reduce for s in sched.sends):
        raise ValueError("runtime_price takes schedules that move chunks (AllGather, AlltoAll); price a reduction "
                         "by the AllGathers it reverses")
    sends = retime(rt, [(s.epoch, s.link, s.source, s.chunk) for s in sched.sends], sched.timing, timing)
    priced = Schedule.from_tuples(rt, sched.demand, timing.tau, sends, dict(sched.meta))
    sim = simulate(priced)
    if not sim.valid:  # retime keeps every rule; this guards it
        raise AssertionError(f"the schedule retimed onto the runtime's links is invalid: {sim.first_violation}")
    last = max((timing.arrival(s.link, s.epoch) for s in priced.sends), default=0)
    finish_us = max(sim.finish_time_s, last * timing.tau) * 1e6
    p = PROTOS.index(protocol)
    floor = BASE_LAT_US["ring"][p] * cal.lat_intra + cal.floor_us + (cal.floor_net_us if net else 0.0)
    return RuntimePrice(floor + finish_us, protocol, floor, int(sim.epochs or 0), net)


def best_runtime_price(sched: Schedule, cal: Calibration = IDENTITY, arch: str = "hopper") -> RuntimePrice:
    """The protocol the runtime would run ``sched`` fastest with, and its price."""
    return min((runtime_price(sched, p, cal, arch) for p in PROTOS), key=lambda r: r.time_us)
