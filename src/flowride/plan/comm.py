"""Collectives and transfers of a plan, priced on the fabric two ways, and cached.

A job's tensor-parallel and data-parallel groups repeat across the cluster: every TP group is one
node's GPUs (or a few whole nodes), every DP group the same GPU of ``dp`` nodes. So a group is
priced once, on the smallest fabric that holds it (the group's nodes only, on the job's network):
a 10,240-GPU plan prices a handful of collectives, never a 10,240-GPU topology. Each is priced
as NCCL's best modelled algorithm (:func:`flowride.synth.nccl.model_nccl`: ring, NVLS, PAT, p2p
replayed by flowride's simulator) and, when synthesis is on, as flowride's synthesized schedule
(:func:`flowride.api.synthesize`, ``--chunks auto``, which keeps NCCL's schedules as candidates,
so it is never slower). Results go to a JSON cache keyed by (fabric, group, collective, size), so
a second plan, or a sweep over other pipeline settings, solves nothing again.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from flowride.errors import InputError
from flowride.files import read_json, write_json_atomic
from flowride.topology.fabrics import NODE_TYPES, FabricSpec, fabric, parse_nic
from flowride.topology.group import group_topology

CACHE_VERSION = 1
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flowride" / "plan-collectives.json"


@dataclass(frozen=True)
class Group:
    """A process group by shape: ``per_node`` GPUs (the first ones) of each of ``nodes`` nodes."""

    node: str
    network: str
    nic: str | None
    oversubscription: float
    nodes: int
    per_node: int

    @property
    def size(self) -> int:
        return self.nodes * self.per_node


@dataclass
class Priced:
    collective: str
    size_bytes: int
    group: Group
    nccl_us: float
    nccl_algorithm: str
    ours_us: float  # = nccl_us when synthesis is off or found nothing faster
    how: str  # "synthesized", "nccl only", "trivial" or "joint"
    seconds: float  # wall time the pricing took (0 from the cache)
    together: dict | None = None  # priced with the groups that run at once (price_together): what contention cost

    def as_dict(self) -> dict:
        d = asdict(self)
        d["group"] = asdict(self.group)
        return d


def _key(collective: str, size: int, g: Group, synth: bool) -> str:
    return json.dumps([CACHE_VERSION, collective, int(size), asdict(g), bool(synth)], sort_keys=True)


class Pricer:
    """Prices collectives, each (group, collective, size) once; ``cache`` a JSON file or None."""

    def __init__(self, cache: str | Path | None = DEFAULT_CACHE, synth: bool = True, time_limit_s: float = 30.0) -> None:
        self.path = Path(cache) if cache else None
        self.synth = synth
        self.time_limit_s = time_limit_s
        self.entries: dict[str, dict] = {}
        self.hits = 0
        self.solved = 0
        if self.path is not None and self.path.exists():
            data = read_json(self.path, "cache", "delete the cache file: it is rebuilt")
            if isinstance(data, dict) and data.get("version") == CACHE_VERSION and isinstance(data.get("entries"), dict):
                self.entries = data["entries"]

    def save(self) -> None:
        if self.path is not None and self.solved:
            write_json_atomic(self.path, {"version": CACHE_VERSION, "entries": self.entries})

    def price(self, collective: str, size_bytes: int, g: Group) -> Priced:
        """One collective of ``size_bytes`` per GPU buffer on group ``g``: from the cache, or
        modelled (and synthesized) now."""
        size = max(1, int(size_bytes))
        if g.size < 2:
            return Priced(collective, size, g, 0.0, "-", 0.0, "trivial", 0.0)
        k = _key(collective, size, g, self.synth)
        hit = self.entries.get(k)
        if hit is not None:
            self.hits += 1
            return Priced(collective, size, g, hit["nccl_us"], hit["nccl_algorithm"], hit["ours_us"], hit["how"], 0.0)
        t0 = time.perf_counter()
        topo = group_fabric(g)
        from flowride.synth.nccl import model_nccl

        nccl = model_nccl(topo, collective, size, time_limit=max(1.0, 0.15 * self.time_limit_s)).best
        ours, how = nccl.time_us, "nccl only"
        if self.synth:
            from flowride.api import synthesize

            out = synthesize(topo, collective, size, chunks="auto", time_limit=self.time_limit_s)
            ours, how = min(ours, float(out.report()["finish_time_us"])), "synthesized"
        self.solved += 1
        self.entries[k] = {"nccl_us": nccl.time_us, "nccl_algorithm": nccl.name, "ours_us": ours, "how": how}
        return Priced(collective, size, g, nccl.time_us, nccl.name, ours, how, time.perf_counter() - t0)


    def price_together(self, collective: str, size_bytes: int, g: Group) -> Priced:
        """``collective`` on every group of ``g``'s shape in ``g``'s nodes at once (the DP groups
        of a node's GPUs synchronise together), on those nodes' shared fabric: flowride's joint
        schedule and NCCL's algorithms run together (:mod:`flowride.concurrent`). The price is the
        last of them to finish; ``together`` keeps both ways alone and together."""
        per = NODE_TYPES[g.node].gpus
        k = per // g.per_node
        size = max(1, int(size_bytes))
        if g.size < 2 or g.nodes < 2 or k < 2 or not self.synth:  # nothing shared, or no joint schedule to make
            return self.price(collective, size, g)
        key = _key(collective, size, g, self.synth) + "|together"
        hit = self.entries.get(key)
        if hit is not None:
            self.hits += 1
            return Priced(collective, size, g, hit["nccl_us"], hit["nccl_algorithm"], hit["ours_us"], "joint", 0.0, hit["together"])
        from flowride.collectives.demand import Collective
        from flowride.concurrent import Item, report, synthesize_concurrent

        t0 = time.perf_counter()
        topo = nodes_fabric(g)
        items = [Item(f"dp{j}", Collective.parse(collective), tuple(c * per + j * g.per_node + i for c in range(g.nodes)
                                                                    for i in range(g.per_node)), size) for j in range(k)]
        rep = report(synthesize_concurrent(topo, items, self.time_limit_s))
        c0 = rep["collectives"][0]
        together = {"groups": k, "nccl_alone_us": max(c["nccl_alone_us"] for c in rep["collectives"]),
                    "nccl_together_us": rep["nccl_together_us"], "ours_alone_us": max(c["alone_us"] for c in rep["collectives"]),
                    "ours_together_us": rep["independent_together_us"], "joint_us": rep["joint"]["last_finish_us"],
                    "joint_how": rep["joint"]["how"], "joint_bound_us": rep["joint_bound_us"]}
        ours = min(rep["joint"]["last_finish_us"], rep["nccl_together_us"])
        self.solved += 1
        self.entries[key] = {"nccl_us": rep["nccl_together_us"], "nccl_algorithm": c0["nccl_algorithm"], "ours_us": ours,
                             "together": together}
        return Priced(collective, size, g, rep["nccl_together_us"], c0["nccl_algorithm"], ours, "joint", time.perf_counter() - t0,
                      together)


def nodes_fabric(g: Group):
    """The fabric of ``g``'s nodes, whole, on the job's network."""
    return fabric(FabricSpec(g.node, nodes=g.nodes, network=g.network, nic_Gbps=parse_nic(g.nic) if g.nic else None,
                             oversubscription=g.oversubscription))


def group_fabric(g: Group):
    """The topology of group ``g``: a fabric of ``g.nodes`` nodes, cut to the group's GPUs."""
    nt = NODE_TYPES[g.node]
    if not 1 <= g.per_node <= nt.gpus:
        raise InputError("group", f"{g.per_node} GPUs per node on a {g.node} node of {nt.gpus}", "check tp and the node type")
    topo = nodes_fabric(g)
    if g.per_node == nt.gpus:
        return topo
    members = [c * nt.gpus + i for c in range(g.nodes) for i in range(g.per_node)]
    return group_topology(topo, members)


def p2p_seconds(g: Group, size_bytes: int, same_node: bool) -> float:
    """One point-to-point transfer of ``size_bytes`` between two pipeline stages: over the
    node's GPU links when both stages share a node, else NIC to NIC through one switch (two NIC
    hops and, on a Clos, the leaf-spine hops are not modelled: one rail or leaf switch)."""
    nt = NODE_TYPES[g.node]
    if same_node and nt.link_GBps > 0:
        return 2 * nt.link_alpha_us * 1e-6 + size_bytes / (nt.link_GBps * 1e9)
    nic_GBps = (parse_nic(g.nic) if g.nic else nt.nic_Gbps) / 8
    return 2 * 1.0e-6 + size_bytes / (nic_GBps * 1e9)
