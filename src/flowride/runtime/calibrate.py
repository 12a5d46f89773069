"""``flowride calibrate``: the model fitted to one cluster's own nccl-tests logs.

The logs' rows become observations (the out-of-place time of a collective at a size); the fit
starts from the built-in calibration of the cluster's node type and network and moves only the
fields the logs can tell: a one-node log, what happens inside the node; a log across nodes, what
crossing adds (the node's part held at its built-in figures, which one-node logs can replace).
With few points, only the most telling fields move (at most one per three points)."""

from __future__ import annotations

from dataclasses import asdict

from flowride.collectives.demand import Collective
from flowride.errors import InputError
from flowride.runtime.defaults import builtin
from flowride.runtime.fit import (
    INTRA_FIELDS,
    NET_FIELDS,
    NVLS_FIELDS,
    Observed,
    fit,
    judge,
    summary,
)
from flowride.runtime.nccl_tests import TestRun
from flowride.runtime.nccl_tuning import Launch
from flowride.runtime.predict import machine_for
from flowride.runtime.profile import Profile
from flowride.topology.fabrics import NODE_TYPES

MODELLED = {"allreduce", "allgather", "reducescatter", "alltoall"}


def _launch(run: TestRun) -> Launch:
    """-g (GPUs one thread drives) and -G (CUDA graph) as the log's header states them."""
    s = run.settings
    g = int(s.get("nGpus", 1) or 1)
    graph = bool(int(s.get("graph", 0) or 0))
    return Launch(max(1, g), graph)


def observations(runs: list[TestRun], node: str, nodes: int, nics: int | None, nic_Gbps: float | None) -> tuple[list[Observed], list[str]]:
    """Every usable row of ``runs`` as an observation on the cluster, and notes on what was left out."""
    m = machine_for(node, nodes, nics, nic_Gbps)
    obs, notes = [], []
    for run in runs:
        if run.ranks and run.ranks != m.ranks:
            raise InputError(f"--nccl-tests {run.source}", f"the log ran on {run.ranks} ranks; {nodes} x {node} has {m.ranks} GPUs",
                             "give --node/--nodes that match the log (or the log of this cluster)")
        if run.collective not in MODELLED:
            notes.append(f"{run.source}: {run.collective} left out (the model prices AllReduce, AllGather, ReduceScatter, AlltoAll)")
            continue
        if run.settings.get("cputime"):
            notes.append(f"{run.source}: run at line {run.line} left out (nccl-tests -C: its time column is CPU time)")
            continue
        if not run.out_of_place:
            notes.append(f"{run.source}: run at line {run.line} has in-place times only (rccl-tests -O 0): fitted on those")
        coll, launch = Collective.parse(run.collective), _launch(run)
        for r in run.rows:
            if r.size_bytes > 0 and r.time_us > 0:
                obs.append(Observed(f"{run.source} line {r.line}", m, coll, r.size_bytes, r.time_us, None, launch))
    return obs, notes


def calibrate(runs: list[TestRun], node: str, nodes: int, nics: int | None = None, nic_Gbps: float | None = None,
              network: str = "ib") -> tuple[Profile, list[str]]:
    """The profile of ``nodes`` x ``node`` fitted to ``runs``, and notes for the user."""
    if not runs:
        raise InputError("--nccl-tests", "no log given", "give one or more nccl-tests output files")
    obs, notes = observations(runs, node, nodes, nics, nic_Gbps)
    if not obs:
        raise InputError("--nccl-tests", "no row of a collective the model prices", "give logs of all_reduce_perf, "
                         "all_gather_perf, reduce_scatter_perf or alltoall_perf")
    start = builtin(node, nodes, network)
    if nodes == 1:
        names = tuple(f for f in INTRA_FIELDS if NODE_TYPES[node].multicast or f not in NVLS_FIELDS)
    else:
        names = NET_FIELDS
    names = names[:max(1, len(obs) // 3)]
    cal = fit(obs, names, start.calibration)
    judged = judge(cal, obs)
    rows = [{"where": j.label, "collective": o.collective.value, "bytes": j.bytes, "measured_us": j.measured_us,
             "predicted_us": j.predicted_us, "ratio": j.ratio, "algorithm": j.algorithm, "protocol": j.protocol}
            for j, o in zip(judged, obs, strict=True)]
    m = obs[0].machine
    cluster = {"node": node, "nodes": nodes, "nics": m.nics, "nic_Gbps": m.nic_GBps * 8, "network_kind": network, "ranks": m.ranks}
    if start.borrowed:
        notes.append(f"started from {start.borrowed}'s built-in figures ({node} has no measured curve)")
    prof = Profile(cal, cluster, tuple(sorted({r.source for r in runs})), names, rows,
                   {**summary(judged), "started_from": start.name, "start": asdict(start.calibration)})
    return prof, notes
