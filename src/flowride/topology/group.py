"""Process groups: a collective run by a subset of a topology's GPUs.

Real jobs run collectives inside groups (tensor-, pipeline-, data-parallel groups are subsets of
the machine's GPUs; PCCL, 2026, synthesizes for them). Rather than teach every stage of the
synthesis about groups, the group is a *topology transform*: the returned :class:`Topology` has
exactly the members as its GPUs (in group order, so member r is rank r of the group's
communicator), and demand, bounds, baselines, searches, the simulator and the lowering all work on
it unchanged.

- ``relay=False``: the member GPUs and the switches, with the links among them. Non-member GPUs
  and their links are dropped; so are switches (and chains of them) left as dead ends. The members
  must reach each other without a non-member GPU, or the group is refused.
- ``relay=True``: a non-member GPU may forward chunks (holding no buffer and having no demand).
  flowride's nodes are GPUs (which hold buffers and have demand) and switches (which forward in
  the epoch a chunk arrives). A relay GPU is modelled as *two* copy-capable switches, ``in`` and
  ``out``, joined by one internal link (alpha 0, the fastest kept link's bandwidth): its in-links
  end at ``in``, its out-links start at ``out``. A single switch would be wrong: a switch -> GPU hop
  is cut-through (it costs no transmission epoch of its own, :mod:`flowride.topology.timing`), so
  GPU -> relay -> GPU would cost one transmission where a GPU, which stores a chunk before it
  sends it, needs two. Through the internal link the chunk is held for a full epoch first, so
  every relay path costs at least what store-and-forward at the relay costs (exactly that when it
  goes on to a GPU). Forwarding in the arrival epoch, one fastest link's worth of chunks per epoch
  and forwarding partial sums one by one (a switch does not add) only restrict what a GPU could
  do, so every schedule found is realisable by a relaying GPU; bounds are those of this model.

The returned topology keeps the mapping in ``params["group"]`` (``of``: the base topology's
name, ``ranks``: the members' ranks there in group order, ``relay``, ``relays``: the ranks of the
relaying GPUs, ``nodes``: each new node's original node id) and in its name and description;
relay nodes are labelled ``relay:<rank>:in`` / ``relay:<rank>:out`` so a schedule saved as JSON
(which keeps labels, not params) still tells :func:`relay_ranks` that it relays.
"""

from __future__ import annotations

import re

import networkx as nx

from flowride.errors import InputError
from flowride.sizes import MAX_LINKS, MAX_NODES
from flowride.topology.model import Link, Node, Topology

MAX_GROUP_TEXT = 20_000  # characters of a --ranks spec (1,024 ranks listed one by one fit)
RELAY_LABEL = "relay:"
_INT = r"\d{1,7}"
_EVERY = re.compile(rf"every:({_INT})(?:\+({_INT}))?")
_RANGE = re.compile(rf"({_INT})-({_INT})")
_FIX = "write ranks as a list with ranges, e.g. 0,2,5-7, or every:8 (every 8th GPU) / every:8+1 (from GPU 1)"


def parse_group(text: str, ngpus: int) -> tuple[int, ...]:
    """The ranks (indices into ``topo.gpus``) a group spec names, in the order written.

    Tokens, comma-separated: a rank ``5``, a range ``5-7`` (both ends included), or ``every:K``
    (ranks 0, K, 2K, ...) / ``every:K+O`` (O, O+K, ...). Errors name the token and the fix."""
    text = str(text).strip()
    if len(text) > MAX_GROUP_TEXT:
        raise InputError("ranks", f"is {len(text):,} characters, over the limit of {MAX_GROUP_TEXT:,}", "use ranges or every:K")
    if not text:
        raise InputError("ranks", "is empty", _FIX)
    out: list[int] = []
    seen: dict[int, str] = {}
    for raw in text.split(","):
        tok = raw.strip().lower()
        if not tok:
            raise InputError("ranks", f"{text!r} has an empty item", _FIX)
        if m := _EVERY.fullmatch(tok):
            step, off = int(m[1]), int(m[2] or 0)
            if step < 1:
                raise InputError("ranks", f"{tok!r}: the step must be at least 1", "write every:K with K >= 1, e.g. every:8")
            if off >= ngpus:
                raise InputError("ranks", f"{tok!r}: offset {off} is outside 0..{ngpus - 1} (the topology has {ngpus} GPUs)",
                                 f"give an offset below {ngpus}")
            ranks = list(range(off, ngpus, step))
        elif m := _RANGE.fullmatch(tok):
            a, b = int(m[1]), int(m[2])
            if a > b:
                raise InputError("ranks", f"{tok!r} runs backwards", f"write {b}-{a}")
            if b >= ngpus:  # before the list is built: 0-9999999 would take hundreds of MB first
                raise InputError("ranks", f"{tok!r}: rank {max(a, ngpus)} is outside 0..{ngpus - 1} (the topology has {ngpus} GPUs)",
                                 f"give ranks below {ngpus}")
            ranks = list(range(a, b + 1))
        elif re.fullmatch(_INT, tok):
            ranks = [int(tok)]
        else:
            raise InputError("ranks", f"{raw.strip()!r} is not a rank, a range or every:K", _FIX)
        for r in ranks:
            if r >= ngpus:
                where = "" if tok == str(r) else f"{tok!r}: "
                raise InputError("ranks", f"{where}rank {r} is outside 0..{ngpus - 1} (the topology has {ngpus} GPUs)",
                                 f"give ranks below {ngpus}")
            if r in seen:
                raise InputError("ranks", f"rank {r} appears twice ({seen[r]!r} and {tok!r})", "name each rank once")
            seen[r] = tok
            out.append(r)
    if len(out) < 2:
        raise InputError("ranks", f"{text!r} names {len(out)} rank(s)", "a collective needs at least 2 ranks, e.g. 0,1")
    return tuple(out)


def format_ranks(ranks) -> str:
    """Ranks as parse_group reads them back, runs of three or more consecutive ranks as ranges."""
    parts: list[str] = []
    rs = list(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{rs[i]}-{rs[j]}")
        else:
            parts.extend(str(r) for r in rs[i:j + 1])
        i = j + 1
    return ",".join(parts)


def _prune(topo: Topology, keep: set[int], members: set[int]) -> set[int]:
    """``keep`` without the non-members that can carry nothing between members: no way in, no way
    out, or a single neighbour (a dead end), repeatedly."""
    keep = set(keep)
    while True:
        ins: dict[int, set[int]] = {v: set() for v in keep}
        outs: dict[int, set[int]] = {v: set() for v in keep}
        for lk in topo.links:
            if lk.src in keep and lk.dst in keep:
                outs[lk.src].add(lk.dst)
                ins[lk.dst].add(lk.src)
        dead = {v for v in keep - members if not ins[v] or not outs[v] or len(ins[v] | outs[v]) < 2}
        if not dead:
            return keep
        keep -= dead


def _check_reach(topo: Topology, keep: set[int], members: tuple[int, ...], ranks: tuple[int, ...]) -> None:
    """Relay off: every member reaches every other through members and switches only."""
    g = nx.DiGraph()
    g.add_nodes_from(keep)
    g.add_edges_from((lk.src, lk.dst) for lk in topo.links if lk.src in keep and lk.dst in keep)
    comp = {v: i for i, c in enumerate(nx.strongly_connected_components(g)) for v in c}
    for m, r in zip(members[1:], ranks[1:], strict=True):
        if comp[m] != comp[members[0]]:
            a, b = (ranks[0], r) if not nx.has_path(g, members[0], m) else (r, ranks[0])
            raise InputError("ranks", f"rank {b} cannot be reached from rank {a} without passing through GPUs outside the group",
                             "use --relay on to let those GPUs forward, or choose ranks that are linked")


def group_topology(topo: Topology, members, relay: bool = False) -> Topology:
    """The topology of the group ``members`` (ranks of ``topo``, in group order): see the module
    docstring. The group of every GPU in order, without relays, gives ``topo``'s nodes and links."""
    members = tuple(int(m) for m in members)
    gpus = topo.gpus
    if len(set(members)) != len(members) or len(members) < 2 or not all(0 <= m < len(gpus) for m in members):
        raise InputError("ranks", f"{members} is not a list of at least 2 distinct ranks in 0..{len(gpus) - 1}", _FIX)
    mnodes = tuple(gpus[m] for m in members)
    mset = set(mnodes)
    candidates = mset | set(topo.switches) | ({g for g in gpus if g not in mset} if relay else set())
    keep = _prune(topo, candidates, mset)
    if not relay:
        _check_reach(topo, keep, mnodes, members)
    rank_of = {g: r for r, g in enumerate(gpus)}
    outer = topo.params.get("group")
    base_rank = {g: outer["ranks"][r] if outer else r for g, r in rank_of.items()}  # as labels name them
    relays = tuple(g for g in gpus if g in keep and g not in mset)
    if relays and topo.teccl_compat:
        raise InputError("relay", f"{topo.name} is the published TE-CCL model, where a switch -> GPU hop costs only its alpha: "
                         "a relaying GPU cannot do that", "use --relay off, or the physical model (leave out --teccl-compat)")
    total = len(mset) + sum(1 for w in topo.switches if w in keep) + 2 * len(relays)
    if total > MAX_NODES or len(topo.links) + len(relays) > MAX_LINKS:
        raise InputError("relay", f"relaying through {len(relays):,} GPUs (two nodes and one link each) is over the topology "
                         f"limits of {MAX_NODES:,} nodes and {MAX_LINKS:,} links", "use --relay off or a smaller topology")
    # new ids: members in group order, then the kept switches, then each relay's in and out
    old_of: list[int] = list(mnodes) + [w for w in topo.switches if w in keep]
    new_id = {v: i for i, v in enumerate(old_of)}
    nodes = [Node(i, "gpu" if topo.nodes[v].is_gpu else "switch", copy=topo.nodes[v].copy, group=topo.nodes[v].group,
                  label=topo.nodes[v].label) for i, v in enumerate(old_of)]
    r_in: dict[int, int] = {}
    r_out: dict[int, int] = {}
    for g in relays:
        for side, table in (("in", r_in), ("out", r_out)):
            table[g] = len(nodes)
            nodes.append(Node(len(nodes), "switch", copy=True, group=topo.nodes[g].group, label=f"{RELAY_LABEL}{base_rank[g]}:{side}"))
            old_of.append(g)
    links = [Link(r_out.get(lk.src, new_id.get(lk.src)), r_in.get(lk.dst, new_id.get(lk.dst)), lk.bandwidth_GBps, lk.alpha_s)
             for lk in topo.links if lk.src in keep and lk.dst in keep]
    fastest = max(lk.bandwidth_GBps for lk in links)
    links += [Link(r_in[g], r_out[g], fastest, 0.0) for g in relays]
    return _finish(topo, members, relay, relays, rank_of, nodes, links, old_of)


def _finish(topo: Topology, members: tuple[int, ...], relay: bool, relays: tuple[int, ...], rank_of: dict[int, int],
            nodes: list[Node], links: list[Link], old_of: list[int]) -> Topology:
    """The group topology with its name, description and the mapping to ``topo`` (composed with
    ``topo``'s own when ``topo`` is itself a group)."""
    outer = topo.params.get("group")
    base, ranks, orig = topo.name, list(members), list(old_of)
    relayed = [rank_of[g] for g in relays]
    if outer:  # a group of a group: speak of the base topology
        base = outer["of"]
        ranks = [outer["ranks"][m] for m in members]
        orig = [outer["nodes"][v] for v in old_of]
        relayed = sorted({*outer["relays"], *(outer["ranks"][r] for r in relayed)})
        relay = relay or outer["relay"]
    shown = format_ranks(ranks)
    shown = f"ranks {shown}" if len(shown) <= 80 else f"{len(ranks)} ranks"
    tail = f"({shown}; relay {'on' if relay else 'off'})"
    name = base[: 200 - len(tail)] + tail
    via = f"; GPUs {format_ranks(relayed)} relay" if relayed else ""
    desc = f"ranks {format_ranks(ranks)} of {base}{via}. {topo.description}"[:10_000]
    whole = len(members) == len(topo.gpus)
    info = {"of": base, "ranks": ranks, "relay": relay, "relays": relayed, "nodes": orig}
    return Topology(name, tuple(nodes), tuple(links), nominal_gpus=topo.nominal_gpus if whole else None, description=desc,
                    teccl_compat=topo.teccl_compat, switching=topo.switching, params={**topo.params, "group": info})


def select_group(topo: Topology, ranks: str, relay: bool = False) -> Topology:
    """``group_topology`` of the ranks a spec names (the CLI's ``--ranks`` and ``--relay``)."""
    return group_topology(topo, parse_group(ranks, len(topo.gpus)), relay)


def group_info(topo: Topology) -> dict | None:
    """``{"of": base name, "ranks": [...], "relay": bool}`` of a group topology made in this
    process, else None (for reports; a topology read from JSON keeps its name and labels, not
    this)."""
    info = topo.params.get("group")
    return None if info is None else {"of": info["of"], "ranks": list(info["ranks"]), "relay": bool(info["relay"])}


def relay_nodes(topo: Topology) -> tuple[int, ...]:
    """Node ids of ``topo``'s relay nodes (both halves of every relaying GPU)."""
    return tuple(nd.id for nd in topo.nodes if not nd.is_gpu and nd.label.startswith(RELAY_LABEL))


def relay_ranks(topo: Topology, nodes=None) -> tuple[int, ...]:
    """Ranks (in the base topology) of the GPUs outside the group that relay in ``topo`` (among
    ``nodes``, node ids, when given: e.g. the nodes a schedule's sends touch), read from the relay
    nodes' labels so it holds for a topology read back from JSON too."""
    out: set[int] = set()
    for nd in topo.nodes if nodes is None else (topo.nodes[v] for v in nodes):
        if not nd.is_gpu and nd.label.startswith(RELAY_LABEL):
            rank = nd.label[len(RELAY_LABEL):].split(":", 1)[0]
            out.add(int(rank) if rank.isdigit() else -1)
    return tuple(sorted(out))


__all__ = ["format_ranks", "group_info", "group_topology", "parse_group", "relay_nodes", "relay_ranks", "select_group"]
