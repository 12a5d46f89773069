"""How a flowride Program is spread over MSCCL++ thread blocks, so that a plan fits the
executor's fixed tables (64 ops, 16 channels and 16 remote buffers of a type per thread block).

The chunks of a collective move independently: a step only ever touches one chunk of the
collective (a *key*: the block and chunk it belongs to, :data:`Key`), and what a step needs
before it runs is an earlier step on the same key (it was received, or summed, before it is
forwarded). So the keys can be dealt out to thread blocks, every GPU running the steps of the keys
of thread block ``t`` in its own program order, with no ordering between thread blocks at all:
no barrier, no semaphore. Two things would tie thread blocks together, and both are removed
here:

- a scratch slot the program reuses for another key (:func:`private_scratch` gives every
  (scratch slot, key) pair its own slot; the scratch buffer grows by what the reuse saved);
- an input or output slot holding two keys over time: flowride's buffer layouts never do this,
  and a program that did is refused.

:func:`spread` deals the keys in order, each to the first thread block where every GPU's share
stays within an op budget and the channel and remote-buffer tables (first fit), so a thread block
light on one GPU takes the keys heavy there. :func:`bundle` ties chunks whose steps are alike into
one unit (a coarser pipeline), so that one op moves them all. Each thread block keeps its own channel to
each of its peers, so the signals it counts on a channel are its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from flowride.program.model import GpuProgram, Program, Slot, initial_buffers, run_program

Key = tuple[int, int]  # (block owner or source rank, chunk): the chunk of the collective a step moves


def step_keys(program: Program) -> list[list[Key]]:
    """The key of every step of every GPU (``keys[rank][step]``), found by running the program
    symbolically (:func:`~flowride.program.model.run_program`). A program that does not run is a
    ValueError: it has no keys to spread."""
    order: list[tuple[int, int]] = []
    problems, sent = run_program(program, order=order)
    if problems:
        raise ValueError(f"the program does not run: {problems[0]}")
    held = [{slot: content[0] for slot, content in initial_buffers(program, g.rank).items()} for g in program.gpus]
    keys: list[list[Key]] = [[(-1, -1)] * len(g.steps) for g in program.gpus]
    for r, i in order:
        st = program.gpus[r].steps[i]
        if st.op in ("r", "rrc"):
            k = sent[st.tag][0]
        else:
            k = held[r][st.src]
        if st.op != "s":
            held[r][st.dst] = k
        keys[r][i] = k
    return keys


def private_scratch(program: Program, keys: list[list[Key]], bundles: Bundles | None = None) -> Program:
    """A copy of ``program`` in which every (scratch slot, key) pair has a scratch slot of its own,
    so that no slot is shared by two keys (and so by two thread blocks). A send's ``dst`` follows
    its receive's new slot. An input or output slot that holds two keys is a ValueError. With
    ``bundles``, the members of a bundle get side-by-side slots (their q-th scratch slots are
    ``base + member``), so one op can move them all."""
    gpus: list[GpuProgram] = []
    dst_of: dict[int, Slot] = {}
    for g in program.gpus:
        places = Places(bundles)
        new: dict[tuple[int, Key], int] = {}
        owner: dict[Slot, Key] = {}
        steps = []
        for st, k in zip(g.steps, keys[g.rank], strict=True):
            st2 = replace(st, src=_own(st.src, k, new, owner, places, g.rank),
                          dst=st.dst if st.op == "s" else _own(st.dst, k, new, owner, places, g.rank), deps=list(st.deps))
            if st.op in ("r", "rrc"):
                dst_of[st.tag] = st2.dst
            steps.append(st2)
        gpus.append(replace(g, s_chunks=places.next, steps=steps))
    for g in gpus:
        for st in g.steps:
            if st.op == "s":
                st.dst = dst_of.get(st.tag, st.dst)
    return replace(program, gpus=gpus)


def _own(slot: Slot | None, k: Key, new: dict[tuple[int, Key], int], owner: dict[Slot, Key], places: Places,
         rank: int) -> Slot | None:
    """``slot`` as key ``k`` sees it: a scratch slot of its own, or the input/output slot itself."""
    if slot is None:
        return None
    if slot[0] == "s":
        if (slot[1], k) not in new:
            new[(slot[1], k)] = places.take(k, "scratch")
        return ("s", new[(slot[1], k)])
    if owner.setdefault(slot, k) != k:
        raise ValueError(f"rank {rank} {slot[0]}[{slot[1]}] holds chunk {owner[slot]} and chunk {k}: "
                         "its thread blocks could not be kept apart")
    return slot


@dataclass
class Bundles:
    """Chunks of one block tied together ``size`` at a time (a coarser pipeline): on every GPU the
    members' steps are alike (same ops, peers and buffers, input/output slots side by side), and
    each member's i-th step runs in the latest epoch of the members' i-th steps (``epoch``), so the
    members' steps stand side by side in a thread block and share one op."""

    rep: dict[Key, Key]  # key -> its bundle's first key
    member: dict[Key, int]  # key -> its place in the bundle
    size: dict[Key, int]  # first key -> how many members
    epoch: list[list[int]]  # rank -> step -> the epoch it runs in


class Places:
    """Allocates a GPU's extra slots (private scratch, staging, packets) so that the members of a
    bundle get side-by-side ones: the q-th slot of a kind that key ``k`` takes is ``base + member``,
    ``base`` taken for the whole bundle when its first member asks."""

    def __init__(self, bundles: Bundles | None, start: int = 0) -> None:
        self.bundles, self.next = bundles, start
        self.taken: dict[tuple[Key, str], int] = defaultdict(int)
        self.base: dict[tuple[Key, str, int], int] = {}

    def take(self, k: Key, kind: str) -> int:
        b = self.bundles
        rep, j, size = (b.rep[k], b.member[k], b.size[b.rep[k]]) if b is not None else (k, 0, 1)
        q = self.taken[(k, kind)]
        self.taken[(k, kind)] += 1
        if (rep, kind, q) not in self.base:
            self.base[(rep, kind, q)] = self.next
            self.next += size
        return self.base[(rep, kind, q)] + j


def bundle(program: Program, keys: list[list[Key]], size: int) -> Bundles:
    """Tie up to ``size`` consecutive chunks of each block into a bundle where their steps are
    alike on every GPU (:class:`Bundles`), greedily from the block's first chunk; chunks unlike
    their neighbours stay alone. :func:`relabel` first puts the chunks that are alike side by side."""
    epochs = [[st.epoch for st in g.steps] for g in program.gpus]
    every = {k for ks in keys for k in ks}
    rep = {k: k for k in every}
    member = dict.fromkeys(every, 0)
    sizes = dict.fromkeys(every, 1)
    if size <= 1:
        return Bundles(rep, member, sizes, epochs)
    steps_of = _steps_of(keys)
    C = program.chunks

    def alike(group: list[Key]) -> bool:
        return all(_alike(program.gpus[r].steps, [steps_of[r].get(k, []) for k in group]) for r in range(program.ngpus))

    for k0 in sorted(every):
        if rep[k0] != k0 or sizes[k0] > 1 or member[k0]:
            continue
        group = [k0]
        while (len(group) < size and (k0[1] + len(group)) % C and (nxt := (k0[0], k0[1] + len(group))) in every
               and alike(group + [nxt])):
            group.append(nxt)
        if len(group) < 2:
            continue
        for j, k in enumerate(group):
            rep[k], member[k] = k0, j
        sizes[k0] = len(group)
        for r in range(program.ngpus):
            seqs = [steps_of[r].get(k, []) for k in group]
            for i in range(len(seqs[0])):
                e = max(epochs[r][s[i]] for s in seqs)
                for s in seqs:
                    epochs[r][s[i]] = e
    return Bundles(rep, member, sizes, epochs)


def _steps_of(keys: list[list[Key]]) -> list[dict[Key, list[int]]]:
    """Per rank, each key's step indices in program order."""
    out: list[dict[Key, list[int]]] = []
    for ks in keys:
        d: dict[Key, list[int]] = defaultdict(list)
        for i, k in enumerate(ks):
            d[k].append(i)
        out.append(d)
    return out


def relabel(program: Program, keys: list[list[Key]]) -> Program:
    """``program`` with each block's chunks renumbered so that chunks whose steps are alike (same
    ops and peers on every GPU: the same tree or path) stand side by side, where a bundle can tie
    them. A chunk's number only says which bytes of its block it is; renaming chunk c of a block to
    c' in every input and output slot of every GPU leaves a program that computes the same
    collective, with the same routes and epochs. A key (``k0``, ``k1``) is chunk ``k1 % C`` of
    block (``k0``, ``k1 // C``), and every input or output slot it touches is at that chunk of
    some block of the buffer (:func:`~flowride.program.model.buffer_layout`)."""
    C = program.chunks
    steps_of = _steps_of(keys)
    every = sorted({k for ks in keys for k in ks})
    shape = {k: tuple(tuple((program.gpus[r].steps[i].op, program.gpus[r].steps[i].peer) for i in steps_of[r].get(k, []))
                      for r in range(program.ngpus)) for k in every}
    new_chunk: dict[Key, int] = {}
    by_block: dict[tuple[int, int], list[Key]] = defaultdict(list)
    for k in every:
        by_block[(k[0], k[1] // C)].append(k)
    for ks in by_block.values():
        for c, k in enumerate(sorted(ks, key=lambda k: (shape[k], k))):
            new_chunk[k] = c

    def moved(slot: Slot | None, k: Key) -> Slot | None:
        if slot is None or slot[0] == "s":
            return slot
        if slot[1] % C != k[1] % C:
            raise ValueError(f"{slot[0]}[{slot[1]}] is not chunk {k[1] % C} of a block: chunks cannot be renumbered")
        return (slot[0], slot[1] - slot[1] % C + new_chunk[k])

    gpus = []
    for g, ks in zip(program.gpus, keys, strict=True):
        gpus.append(replace(g, steps=[replace(st, src=moved(st.src, k), dst=moved(st.dst, k), deps=list(st.deps))
                                      for st, k in zip(g.steps, ks, strict=True)]))
    return replace(program, gpus=gpus)


def _alike(steps: list, seqs: list[list[int]]) -> bool:
    """Whether the members' steps on one GPU are alike: same ops and peers, input and output slots
    side by side (member j's at the first member's plus j), scratch in scratch."""
    if any(len(s) != len(seqs[0]) for s in seqs):
        return False
    for i in range(len(seqs[0])):
        first = steps[seqs[0][i]]
        for j, s in enumerate(seqs[1:], 1):
            st = steps[s[i]]
            if st.op != first.op or st.peer != first.peer:
                return False
            for a, b in ((first.src, st.src), (None if first.op == "s" else first.dst, None if st.op == "s" else st.dst)):
                if (a is None) != (b is None) or (a is not None and (a[0] != b[0] or (a[0] != "s" and b[1] != a[1] + j))):
                    return False
    return True


@dataclass
class _Fill:
    """A thread block's peers and remote buffers so far, per (rank, channel type)."""

    peers: dict[tuple[int, str], set[int]] = field(default_factory=lambda: defaultdict(set))
    bufs: dict[tuple[int, str], set[tuple[int, str]]] = field(default_factory=lambda: defaultdict(set))


def spread(keys: list[list[Key]], cost: Callable[[int, int], int], peer: Callable[[int, int], tuple[str, int] | None],
           rbuf: Callable[[int, int], tuple[str, int, str] | None], op_budget: int, max_channels: int,
           order: Callable[[Key], tuple] = lambda k: k) -> list[list[int]]:
    """Deal the keys out to thread blocks (module docstring): the thread block of every step,
    ``[rank][step]``, an index shared by all GPUs (a GPU may have none of a thread block's keys).
    ``cost(rank, step)``: the ops the
    step may take at most; ``peer(rank, step)``: the (channel type, peer) it talks over, or None;
    ``rbuf(rank, step)``: the (channel type, peer, buffer) it writes remotely, or None; ``order``:
    the order keys are dealt in, each to the first thread block it fits (first fit: thread blocks
    light on one GPU take the keys heavy there)."""
    per_key: dict[Key, list[tuple[int, int]]] = defaultdict(list)
    for r, ks in enumerate(keys):
        for i, k in enumerate(ks):
            per_key[k].append((r, i))
    n = len(keys)
    tb = [[0] * len(ks) for ks in keys]
    fills: list[_Fill] = []
    load = np.zeros((16, n), dtype=np.int64)  # thread block x rank: the ops dealt so far (rows grown by doubling)

    def fits(add: _Fill, into: _Fill) -> bool:
        return (all(len(into.peers[rt] | ps) <= max_channels for rt, ps in add.peers.items())
                and all(len(into.bufs[rt] | bs) <= max_channels for rt, bs in add.bufs.items()))

    for k in sorted(per_key, key=order):
        add, need = _Fill(), np.zeros(n, dtype=np.int64)
        for r, i in per_key[k]:
            need[r] += cost(r, i)
            if (p := peer(r, i)) is not None:
                add.peers[(r, p[0])].add(p[1])
            if (b := rbuf(r, i)) is not None:
                add.bufs[(r, b[0])].add((b[1], b[2]))
        # first fit: the first thread block with room on every GPU and channels to spare; a key
        # that alone exceeds the room gets a thread block of its own (the plan's limits, checked
        # afterwards, say whether it fits)
        room = np.nonzero((load[:len(fills)] + need <= op_budget).all(axis=1))[0]
        t = next((int(t) for t in room if fits(add, fills[t])), None)
        if t is None:
            t = len(fills)
            fills.append(_Fill())
            if t == len(load):
                load = np.vstack([load, np.zeros_like(load)])
        load[t] += need
        for rt, ps in add.peers.items():
            fills[t].peers[rt] |= ps
        for rt, bs in add.bufs.items():
            fills[t].bufs[rt] |= bs
        for r, i in per_key[k]:
            tb[r][i] = t
    return tb
