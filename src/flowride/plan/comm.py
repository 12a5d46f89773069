"""Collectives and transfers of a plan, priced on the fabric two ways, and cached.

A job's tensor-parallel and data-parallel groups repeat across the cluster: every TP group is one
node's GPUs (or a few whole nodes), every DP group the same GPU of ``dp`` nodes. So a group is
priced once, on the smallest fabric that holds it (the group's nodes only, on the job's network):
a 10,240-GPU plan prices a handful of collectives, never a 10,240-GPU topology. Each is priced
as NCCL is predicted to run it by the calibrated model (:mod:`flowride.runtime`: NCCL's cost model
fitted to measured nccl-tests runs, or to the user's own with ``--calibration``) and, when
synthesis is on, as flowride's synthesized schedule priced the same way, as the runtime would run
it (:mod:`flowride.api.priced`); where that is slower, the plan keeps NCCL's. Collectives priced
together (:meth:`Pricer.price_together`) take their contention from the joint schedule's epoch
model (together over alone) applied to the calibrated prices alone. Results go to a JSON cache
keyed by (fabric, group, collective, size, calibration), so a second plan, or a sweep over other
pipeline settings, solves nothing again.
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

CACHE_VERSION = 2  # 2: priced by the calibrated runtime model
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


def _key(collective: str, size: int, g: Group, synth: bool, calibration: str) -> str:
    return json.dumps([CACHE_VERSION, collective, int(size), asdict(g), bool(synth), calibration], sort_keys=True)


class Pricer:
    """Prices collectives, each (group, collective, size) once; ``cache`` a JSON file or None."""

    def __init__(self, cache: str | Path | None = DEFAULT_CACHE, synth: bool = True, time_limit_s: float = 30.0,
                 calibration: str | None = None, network_kind: str | None = "ib") -> None:
        self.path = Path(cache) if cache else None
        self.synth = synth
        self.time_limit_s = time_limit_s
        self.calibration = calibration  # what --calibration takes: None (the built-in fit), nccl, ib, efa, a profile
        self.network_kind = network_kind or "ib"
        self._profile = ""
        if calibration not in (None, "default", "nccl", "ib", "efa"):  # a profile: read now (refused before any work),
            from flowride.runtime.profile import (
                read_profile,  # keyed by its fields so an edited profile prices again
            )

            self._profile = json.dumps(asdict(read_profile(calibration).calibration), sort_keys=True)
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
        k = _key(collective, size, g, self.synth, self.calibration_key)
        hit = self.entries.get(k)
        if hit is not None:
            self.hits += 1
            return Priced(collective, size, g, hit["nccl_us"], hit["nccl_algorithm"], hit["ours_us"], hit["how"], 0.0)
        t0 = time.perf_counter()
        topo = group_fabric(g)
        nccl_us, nccl_name = self._predicted(topo, collective, size)
        ours, how = nccl_us, "nccl only"
        if self.synth:
            ours, how = min(ours, self._synthesized(topo, collective, size)), "synthesized"
        self.solved += 1
        self.entries[k] = {"nccl_us": nccl_us, "nccl_algorithm": nccl_name, "ours_us": ours, "how": how}
        return Priced(collective, size, g, nccl_us, nccl_name, ours, how, time.perf_counter() - t0)

    @property
    def calibration_key(self) -> str:
        return f"{self.calibration or 'default'}|{self.network_kind}|{self._profile}"

    def chosen(self, topo):
        from flowride.runtime.defaults import for_topology

        return for_topology(topo, self.calibration, self.network_kind)

    def _predicted(self, topo, collective: str, size: int) -> tuple[float, str]:
        """NCCL's time for the call by the calibrated model, and its algorithm/protocol."""
        from flowride.runtime.predict import choose
        from flowride.synth.nccl import machine

        e = choose(collective, machine(topo), size, self.chosen(topo).calibration)
        return e.time_us, f"{e.algorithm}/{e.protocol}"

    def _synthesized(self, topo, collective: str, size: int) -> float:
        """flowride's schedule, priced as the runtime would run it (inf where it could not be priced)."""
        from flowride.api import synthesize

        out = synthesize(topo, collective, size, chunks="auto", time_limit=self.time_limit_s, calibration=self.chosen(topo))
        h = out.headline
        return h.flowride.time_us if h is not None and h.flowride is not None else float("inf")


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
        key = _key(collective, size, g, self.synth, self.calibration_key) + "|together"
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
        alone = self.price(collective, size, g)  # the calibrated prices of one group alone
        nccl_alone = max(c["nccl_alone_us"] for c in rep["collectives"])
        ours_alone = max(c["alone_us"] for c in rep["collectives"])
        # contention from the epoch model (together over alone), times from the calibrated one; NCCL's
        # alone as its algorithm priced as a schedule (the closed form sees no spines; api/priced.py)
        from flowride.api.priced import nccl_priced

        gt = group_fabric(g)
        priced = nccl_priced(gt, Collective.parse(collective), size, c0["nccl_algorithm"], self.chosen(gt))
        nccl_base = priced if priced is not None else alone.nccl_us
        nccl_us = nccl_base * rep["nccl_together_us"] / nccl_alone
        ours = min(nccl_us, alone.ours_us * rep["joint"]["last_finish_us"] / ours_alone)
        together = {"groups": k, "nccl_alone_us": nccl_base, "nccl_together_us": nccl_us, "ours_alone_us": alone.ours_us,
                    "ours_together_us": alone.ours_us * rep["independent_together_us"] / ours_alone, "joint_us": ours,
                    "joint_how": rep["joint"]["how"], "epoch_model": {"nccl_alone_us": nccl_alone, "nccl_together_us": rep["nccl_together_us"],
                                                                      "ours_alone_us": ours_alone, "joint_us": rep["joint"]["last_finish_us"],
                                                                      "joint_bound_us": rep["joint_bound_us"]}}
        self.solved += 1
        self.entries[key] = {"nccl_us": nccl_us, "nccl_algorithm": alone.nccl_algorithm, "ours_us": ours, "together": together}
        return Priced(collective, size, g, nccl_us, alone.nccl_algorithm, ours, "joint", time.perf_counter() - t0, together)


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
