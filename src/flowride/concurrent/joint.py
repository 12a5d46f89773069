"""Several collectives at once on shared links, scheduled jointly (``flowride synth --concurrent``).

Read top to bottom:

1. **alone**: each collective synthesized on its group topology with every link whole
   (:func:`flowride.api.synthesize`, NCCL's algorithms modelled beside it; 30% of the time);
   what each schedule puts on every base link is counted;
2. **jointly**: capacity partitioned (:mod:`.sharing`): every shared link split evenly, and split
   in proportion to what each collective put on it alone; each collective synthesized on its
   shares (the rest of the time), so every schedule is verified by the simulator on a slice of the
   links that never overlaps another's. Beside them, the alone schedules on whole links: kept as
   they are where no shared link is used by two at once, and *in turn* (each held back until the
   ones before it are off the shared links it uses). The valid one with the earliest last finish
   is kept;
3. **made alone, run together**: the fastest schedule found for each collective (one made for a
   share runs on the whole links as it is) and NCCL's choices, run side by side in the fluid model
   of :mod:`.contention` (what independent scheduling gives);
4. **bound**: :mod:`.bound` on the last finish.

Collectives whose problems are the same (the DP groups of a symmetric fabric, each on its share)
are synthesized once; the time limit is split over the distinct problems of each step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np

from flowride.api import synthesize
from flowride.api.clock import Clock
from flowride.api.priced import Headline, nccl_priced
from flowride.concurrent.bound import JointBound, joint_bound
from flowride.concurrent.contention import run_together
from flowride.concurrent.sharing import (
    Member,
    apart_shares,
    ecmp_classes,
    equal_shares,
    load_shares,
    member,
    pooled,
    problem_key,
    scaled,
    shared_links,
)
from flowride.concurrent.spec import Item
from flowride.errors import InputError
from flowride.runtime.defaults import for_topology
from flowride.schedule.ir import Schedule
from flowride.schedule.simulate import simulate
from flowride.synth.nccl import NcclModel
from flowride.synth.result import Progress
from flowride.topology.model import Topology

ALONE_SHARE = 0.3  # of the time limit for the schedules made alone; the shares take the rest
MAX_GPUS_JOINT = 1024


@dataclass
class Solved:
    """One collective's verified schedule on the topology it was made for (whole links or shares)."""

    schedule: Schedule
    finish_s: float  # from its own start
    bound_s: float  # its own lower bound on that topology
    chunks: int
    method: str
    via: Member  # the group topology it was made on (whole links or shares) and its links' base names
    nccl: NcclModel | None = None
    headline: Headline | None = None  # NCCL's calibrated prediction and this schedule's runtime price (api/priced.py)


@dataclass
class Candidate:
    name: str  # alone | equal | load
    solved: list[Solved]
    finish_s: np.ndarray  # per collective, from the first start
    shares: np.ndarray | None  # [collective, base link]; None: every link whole
    valid: bool
    why: str = ""
    held_s: np.ndarray | None = None  # in turn: how long each collective is held back after its start

    @property
    def last_s(self) -> float:
        return float(self.finish_s.max())


@dataclass
class JointOutcome:
    topo: Topology
    items: list[Item]
    members: list[Member]
    best: Candidate
    candidates: list[Candidate]
    alone: list[Solved]
    together_s: np.ndarray  # flowride's alone schedules run together (fluid model, flows spread over spines)
    nccl_alone_s: np.ndarray
    nccl_together_s: np.ndarray  # NCCL's choices run together (the same model)
    together_routed_s: np.ndarray  # the same two, each flow kept on the links its schedule chose alone
    nccl_together_routed_s: np.ndarray
    nccl_algorithms: list[str]
    bound: JointBound
    link_use: dict
    wall_s: float
    notes: list[str] = field(default_factory=list)


def synthesize_concurrent(topo: Topology, items: list[Item], time_limit: float = 60.0, epoch: str | float = "fast",
                          progress: Progress | None = None) -> JointOutcome:
    """One joint, verified schedule of ``items`` on ``topo`` within ``time_limit`` seconds."""
    if not items:
        raise InputError("--concurrent", "names no collective", "give at least one")
    if len(topo.gpus) > MAX_GPUS_JOINT:
        raise InputError("--concurrent", f"{len(topo.gpus):,} GPUs is over the limit of {MAX_GPUS_JOINT:,}", "use a smaller fabric")
    clock = Clock(time_limit)
    t0 = time.perf_counter()
    t_first = min(it.start_s for it in items)
    items = [Item(it.name, it.collective, it.ranks, it.size_bytes, it.start_s - t_first, it.relay) for it in items]
    members = [member(topo, it) for it in items]
    n_base = len(topo.links)
    caps = np.array([lk.bytes_per_s for lk in topo.links])
    starts = np.array([it.start_s for it in items])
    cache: dict[tuple, Solved] = {}

    def solve(phases: list[tuple[str, np.ndarray | None]], fraction: float) -> list[list[Solved]]:
        """Each phase's schedules (shares None: whole links); the distinct problems of all of them
        share ``fraction`` of the time left equally."""
        vias = [[m if x is None else scaled(m, x[i]) for i, m in enumerate(members)] for _, x in phases]
        keys = [[None if v is None else problem_key(v.topo, v.item) for v in vs] for vs in vias]
        where = {}
        for p, ks in enumerate(keys):
            for i, k in enumerate(ks):
                if k is not None and k not in cache:
                    where.setdefault(k, (p, i))
        budget = clock.share(fraction) or 60.0
        for j, (k, (p, i)) in enumerate(where.items()):
            if progress:
                progress({"stage": "concurrent", "phase": phases[p][0], "name": members[i].item.name, "i": j + 1, "of": len(where)})
            seconds = max(1.0, budget / len(where))
            v = vias[p][i]
            out = synthesize(v.topo, v.item.collective, v.item.size_bytes, epoch, "auto", seconds,
                             nccl=True)  # NCCL's algorithms as candidates on every share too
            cache[k] = Solved(out.schedule, out.finish_time_s, out.bounds.best_s, out.demand.chunks,
                              str(out.schedule.meta.get("method", "")), v, out.nccl, out.headline)
        return [[None if k is None else _rewrap(cache[k], v) for k, v in zip(ks, vs, strict=True)]
                for ks, vs in zip(keys, vias, strict=True)]

    (alone,) = solve([("alone", None)], ALONE_SHARE)
    loads = np.array([s.via.loads(s.schedule, n_base) for s in alone])
    candidates = [_alone_candidate(members, alone, starts, shared_links(members, n_base))]
    if not candidates[0].valid:
        phases = [("equal", equal_shares(members, n_base)), ("load", load_shares(members, loads)),
                  ("spines apart", apart_shares(members, topo))]
        for (name, shares), solved in zip(phases, solve(phases, 1.0), strict=True):
            if any(s is None for s in solved):  # a group cut off from itself by these shares
                candidates.append(Candidate(name, [], np.full(len(members), np.inf), shares, False, "a group is cut off"))
                continue
            fin = starts + np.array([s.finish_s for s in solved])
            candidates.append(Candidate(name, solved, fin, shares, _shares_hold(shares)))
    alone = [_fastest_alone([c.solved[i] for c in candidates if c.solved]) for i in range(len(members))]
    loads = np.array([s.via.loads(s.schedule, n_base) for s in alone])
    alone_fin = np.array([s.finish_s for s in alone])
    if not candidates[0].valid:
        shared = shared_links(members, n_base)
        for name, key in (("in turn, shortest first", alone_fin), ("in turn, longest first", -alone_fin)):
            order = sorted(range(len(members)), key=lambda i: (starts[i], key[i], i))
            candidates.append(_in_turn(alone, starts, shared, name, order))
    valid = [c for c in candidates if c.valid]
    best = min(valid, key=lambda c: c.last_s)
    ecmp = ecmp_classes(topo)  # run together, flows spread over interchangeable spines
    together = run_together(starts, alone_fin, pooled(loads, ecmp), pooled(caps, ecmp))
    nccl_alone, nccl_loads, nccl_names, notes = _nccl(members, alone, n_base)
    nccl_together = run_together(starts, nccl_alone, pooled(nccl_loads, ecmp), pooled(caps, ecmp))
    routed = run_together(starts, alone_fin, loads, caps), run_together(starts, nccl_alone, nccl_loads, caps)
    for m, s in zip(members, best.solved, strict=True):  # the simulator judges every schedule kept, on its own links
        sim = simulate(s.schedule)
        if not sim.valid:
            raise AssertionError(f"{m.item.name}: the joint schedule failed verification: {sim.first_violation}")
    bound = joint_bound(topo, items, [s.bound_s for s in alone])
    use = link_use(topo, best, caps)
    return JointOutcome(topo, items, members, best, candidates, alone, together, nccl_alone, nccl_together, *routed, nccl_names,
                        bound, use, time.perf_counter() - t0, notes)


def _rewrap(s: Solved, via: Member) -> Solved:
    """``s`` on ``via``: the same problem up to node labels (another group of the same shape)."""
    if s.via is via:
        return s
    sched = Schedule(via.topo, s.schedule.collective, s.schedule.size_bytes, s.schedule.chunks, s.schedule.tau,
                     list(s.schedule.sends), dict(s.schedule.meta))
    return Solved(sched, s.finish_s, s.bound_s, s.chunks, s.method, via, s.nccl, s.headline)


def _fastest_alone(tried: list[Solved]) -> Solved:
    """The fastest of ``tried`` (the first made alone). A schedule verified on a share of the
    links runs on the whole links as it is (each link only paced below its rate; it is not
    retimed, since in the epoch model a faster link would move arrivals a switch forwards in), so
    a schedule made for a share that beats the one made alone is the independent schedule: the
    comparison is with the best flowride found, not with a shorter search."""
    best = tried[0]
    for s in tried[1:]:
        if s.finish_s < best.finish_s - 1e-15:
            h, h0 = s.headline, tried[0].headline  # NCCL's prediction is the whole links' one
            if h is not None and h0 is not None:
                h = replace(h0, flowride=h.flowride, why_unpriced=h.why_unpriced)
            best = Solved(s.schedule, s.finish_s, tried[0].bound_s, s.chunks, s.method, s.via, tried[0].nccl, h)
    return best


def _nccl(members: list[Member], alone: list[Solved], n_base: int) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """NCCL's best algorithm for each collective alone (its own choice) and what it puts on each
    base link (from the modelled schedule; where the best is only NCCL's estimate, the links of
    the fastest modelled schedule, a note says so)."""
    times, loads, names, notes = [], [], [], []
    for m, s in zip(members, alone, strict=True):
        model = s.nccl
        if model is None:
            raise InputError("--concurrent", f"{m.item.name}: NCCL's algorithms could not be modelled on its group", "report this")
        best = model.best
        with_sched = [a for a in model.algorithms.values() if a.schedule is not None]
        times.append(best.time_us * 1e-6)
        names.append(best.name)
        if best.schedule is not None:
            loads.append(m.loads(best.schedule, n_base))
        elif with_sched:
            a = min(with_sched, key=lambda a: a.time_us)
            loads.append(m.loads(a.schedule, n_base))
            notes.append(f"{m.item.name}: NCCL's best ({best.name}) is its own estimate; its links are taken from {a.name}'s")
        else:
            loads.append(np.zeros(n_base))
            notes.append(f"{m.item.name}: no NCCL schedule was modelled, so its NCCL time is not slowed by sharing")
    return np.array(times), np.array(loads), names, notes


def _spans(s: Solved, shared: np.ndarray) -> dict[int, tuple[float, float]]:
    """When ``s`` uses each shared base link, from its own start: its first send there to the end
    of its last (its transfer epochs included)."""
    sched, timing = s.schedule, s.schedule.timing
    out: dict[int, tuple[float, float]] = {}
    for snd in sched.sends:
        b = int(s.via.base_link[snd.link])
        if b < 0 or not shared[b]:
            continue
        t0 = snd.epoch * sched.tau
        t1 = (snd.epoch + int(timing.beta_epochs[snd.link]) + 1) * sched.tau
        lo, hi = out.get(b, (t0, t1))
        out[b] = (min(lo, t0), max(hi, t1))
    return out


def _clash(spans: list[dict], begin: np.ndarray, i: int, j: int) -> tuple[int, float] | None:
    """A shared link ``i`` and ``j`` use at once, started at ``begin``, and how far ``i`` must be
    held back to come after ``j`` there; None if they never meet."""
    for b in spans[i].keys() & spans[j].keys():
        (a0, a1), (b0, b1) = spans[i][b], spans[j][b]
        if begin[i] + a0 < begin[j] + b1 - 1e-15 and begin[j] + b0 < begin[i] + a1 - 1e-15:
            return b, begin[j] + b1 - a0
    return None


def _alone_candidate(members: list[Member], alone: list[Solved], starts: np.ndarray, shared: np.ndarray) -> Candidate:
    """The schedules made alone, kept as they are: valid only if no shared link is used by two of
    them at once."""
    fin = starts + np.array([s.finish_s for s in alone])
    spans = [_spans(s, shared) for s in alone]
    for i in range(len(alone)):
        for j in range(i):
            if (hit := _clash(spans, starts, i, j)) is not None:
                return Candidate("alone", alone, fin, None, False,
                                 f"{members[j].item.name} and {members[i].item.name} use link {hit[0]} at once")
    return Candidate("alone", alone, fin, None, True)


def _in_turn(alone: list[Solved], starts: np.ndarray, shared: np.ndarray, name: str, order: list[int]) -> Candidate:
    """The schedules made alone, on whole links, each held back (in ``order``) until the ones
    before it are off every shared link it uses: what wins when collectives are short (their
    latency, not the links, sets their time) or start apart."""
    spans = [_spans(s, shared) for s in alone]
    begin = starts.astype(float).copy()
    placed: list[int] = []
    for i in order:
        moved = True
        while moved:
            moved = False
            for j in placed:
                if (hit := _clash(spans, begin, i, j)) is not None:
                    begin[i] = hit[1]
                    moved = True
        placed.append(i)
    fin = begin + np.array([s.finish_s for s in alone])
    return Candidate(name, alone, fin, None, True, held_s=begin - starts)


def _shares_hold(shares: np.ndarray) -> bool:
    return bool((shares.sum(axis=0) <= 1.0 + 1e-9).all() and (shares >= 0).all())


def link_use(topo: Topology, cand: Candidate, caps: np.ndarray, windows: int = 32) -> dict:
    """Every collective's sends placed in time on the base links, checked together: in any window of
    ``windows`` times the longest (b+1)-epoch span on a link, the bytes sent stay within the link's
    capacity over the window plus one such span of each collective (the most a sender verified at
    its share can put in before the window's edge). Also each link's busy share over the joint run."""
    per_link: dict[int, list[tuple[float, float]]] = {}
    slack: dict[int, float] = {}
    span: dict[int, float] = {}
    for s, t0 in zip(cand.solved, cand.finish_s - np.array([x.finish_s for x in cand.solved]), strict=True):
        sched = s.schedule
        timing = sched.timing
        cb = sched.demand.chunk_bytes
        seen: set[int] = set()
        for snd in sched.sends:
            b = int(s.via.base_link[snd.link])
            if b < 0:
                continue
            per_link.setdefault(b, []).append((float(t0) + snd.epoch * sched.tau, cb))
            if b not in seen:
                seen.add(b)
                slack[b] = slack.get(b, 0.0) + float(timing.window_cap[snd.link]) * cb
                span[b] = max(span.get(b, 0.0), (float(timing.beta_epochs[snd.link]) + 1) * sched.tau)
    worst, worst_link, busiest, busiest_link = 0.0, -1, 0.0, -1
    horizon = max(cand.last_s, 1e-12)
    for b, sends in per_link.items():
        arr = np.array(sends)
        order = np.argsort(arr[:, 0])
        t, by = arr[order, 0], np.cumsum(arr[order, 1])
        w = windows * span[b]
        hi = np.searchsorted(t, t + w, side="left") - 1
        lo = np.arange(len(t))
        in_window = by[hi] - np.concatenate(([0.0], by))[lo]
        ratio = float((in_window / (caps[b] * w + slack[b])).max())
        if ratio > worst:
            worst, worst_link = ratio, b
        busy = float(by[-1] / (caps[b] * horizon))
        if busy > busiest:
            busiest, busiest_link = busy, b
    return {"peak_window_use": worst, "peak_link": link_name(topo, worst_link), "within_capacity": worst <= 1.0 + 1e-9,
            "busiest_link": link_name(topo, busiest_link), "busiest_link_busy": busiest}


def link_name(topo: Topology, b: int) -> str:
    if b < 0:
        return ""
    lk = topo.links[b]
    return f"{topo.nodes[lk.src].label or lk.src}->{topo.nodes[lk.dst].label or lk.dst}"


CONTENTION_MODEL = ("schedules made alone and NCCL's run together in a fluid max-min model (flowride.concurrent.contention): "
                    "'spread' pools interchangeable spines (perfect ECMP / adaptive routing, the kindest case for them), "
                    "'as routed' keeps each schedule's links as chosen alone")


def report(out: JointOutcome) -> dict:
    """The joint outcome as plain data (what ``flowride synth --concurrent --report`` writes)."""
    us = 1e6
    best = out.best
    per = []
    for i, (it, s) in enumerate(zip(out.items, best.solved, strict=True)):
        shared = out.members[i].base_link
        share = None if best.shares is None else best.shares[i, shared[shared >= 0]]
        per.append({
            **it.as_dict(),
            "finish_us": float(best.finish_s[i]) * us,
            "alone_us": out.alone[i].finish_s * us,
            "own_bound_us": (it.start_s + out.alone[i].bound_s) * us,
            "independent_together_us": float(out.together_s[i]) * us,
            "independent_together_as_routed_us": float(out.together_routed_s[i]) * us,
            "nccl_algorithm": out.nccl_algorithms[i],
            "nccl_alone_us": (it.start_s + float(out.nccl_alone_s[i])) * us,
            "nccl_together_us": float(out.nccl_together_s[i]) * us,
            "nccl_together_as_routed_us": float(out.nccl_together_routed_s[i]) * us,
            "chunks": s.chunks, "method": s.method, "verified": True,
            "min_link_share": None if share is None or not (share > 0).any() else float(share[share > 0].min()),
        })
    last = best.last_s
    together, nccl = float(out.together_s.max()), float(out.nccl_together_s.max())
    cal = calibrated(out)
    return {
        "topology": out.topo.name, "gpus": len(out.topo.gpus), "collectives": per,
        "joint": {"how": best.name, "last_finish_us": last * us, "verified": True, "link_use": out.link_use},
        "independent_together_us": together * us,
        "independent_together_as_routed_us": float(out.together_routed_s.max()) * us,
        "nccl_together_us": nccl * us,
        "nccl_together_as_routed_us": float(out.nccl_together_routed_s.max()) * us,
        "joint_bound_us": out.bound.seconds * us, "joint_bound_kind": out.bound.binding, "joint_bound_cut": out.bound.cut,
        "ratio_to_joint_bound": last / out.bound.seconds,
        # the headline: the calibrated model's figures (see :func:`calibrated`); the epoch model's as detail
        "calibrated": cal, "speedup_vs_nccl": cal["speedup_vs_nccl"] if cal else None,
        "speedup_vs_independent": together / last, "speedup_vs_nccl_epoch_model": nccl / last,
        "speedup_vs_independent_as_routed": float(out.together_routed_s.max()) / last,
        "speedup_vs_nccl_as_routed": float(out.nccl_together_routed_s.max()) / last,
        "candidates": [{"how": c.name, "valid": c.valid, "why": c.why, "last_finish_us": c.last_s * us} for c in out.candidates],
        "contention_model": CONTENTION_MODEL, "notes": out.notes, "wall_time_s": out.wall_s,
    }


def calibrated(out: JointOutcome) -> dict | None:
    """The joint run restated on the calibrated runtime model (docs/calibration.md): each
    collective's duration alone priced by that model as the runtime runs it (flowride's schedule,
    and NCCL's algorithm as the epoch model builds it, both by :mod:`flowride.api.priced`: NCCL's
    closed form sees no spines), stretched by the contention the epoch model found (together over
    alone, NCCL's and the joint schedule's each their own). None where a collective has no price."""
    nccl_t, joint_t, errs, names, seen = [], [], [], set(), {}
    for i, it in enumerate(out.items):
        s = out.alone[i]
        h = s.headline
        if h is None or h.flowride is None:
            return None
        topo = s.via.topo
        key = (it.collective, it.size_bytes, out.nccl_algorithms[i], tuple((lk.src, lk.dst, lk.bandwidth_GBps) for lk in topo.links))
        if key not in seen:
            seen[key] = nccl_priced(topo, it.collective, it.size_bytes, out.nccl_algorithms[i], for_topology(topo))
        nccl_alone_us = seen[key] if seen[key] is not None else h.nccl_us  # the closed form where no schedule is built
        alone_s, nccl_alone_s = s.finish_s, float(out.nccl_alone_s[i])
        nccl_dur = float(out.nccl_together_s[i]) - it.start_s
        joint_dur = float(out.best.finish_s[i]) - it.start_s
        nccl_t.append(it.start_s * 1e6 + (nccl_alone_us * nccl_dur / nccl_alone_s if nccl_alone_s > 0 else nccl_alone_us))
        joint_t.append(it.start_s * 1e6 + (h.flowride.time_us * joint_dur / alone_s if alone_s > 0 else h.flowride.time_us))
        errs.append(h.model_error)
        names.add(h.calibration)
    nccl_last, joint_last = max(nccl_t), max(joint_t)
    known = [e for e in errs if e is not None]
    return {"nccl_together_us": nccl_last, "joint_us": joint_last, "speedup_vs_nccl": nccl_last / joint_last,
            "model_error": max(known) if len(known) == len(errs) else None, "calibration": "; ".join(sorted(names)),
            "per_collective": [{"nccl_together_us": a, "joint_us": b} for a, b in zip(nccl_t, joint_t, strict=True)],
            "how": "each collective alone priced as the runtime runs it (NCCL's algorithm and flowride's schedule alike), "
                   "stretched by the epoch model's contention (together / alone)"}
