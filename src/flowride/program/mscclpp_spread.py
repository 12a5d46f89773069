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

:func:`spread` deals the keys in their order (a block's chunks together, so a thread block keeps
to few peers) to thread block after thread block, each filled while every GPU's share stays within
an op budget and the channel and remote-buffer tables. Each thread block keeps its own channel to
each of its peers, so the signals it counts on a channel are its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace

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


def private_scratch(program: Program, keys: list[list[Key]]) -> Program:
    """A copy of ``program`` in which every (scratch slot, key) pair has a scratch slot of its own,
    so that no slot is shared by two keys (and so by two thread blocks). A send's ``dst`` follows
    its receive's new slot. An input or output slot that holds two keys is a ValueError."""
    gpus: list[GpuProgram] = []
    dst_of: dict[int, Slot] = {}
    for g in program.gpus:
        new: dict[tuple[int, Key], int] = {}
        owner: dict[Slot, Key] = {}
        steps = []
        for st, k in zip(g.steps, keys[g.rank], strict=True):
            st2 = replace(st, src=_own(st.src, k, new, owner, g.rank),
                          dst=st.dst if st.op == "s" else _own(st.dst, k, new, owner, g.rank), deps=list(st.deps))
            if st.op in ("r", "rrc"):
                dst_of[st.tag] = st2.dst
            steps.append(st2)
        gpus.append(replace(g, s_chunks=len(new), steps=steps))
    for g in gpus:
        for st in g.steps:
            if st.op == "s":
                st.dst = dst_of.get(st.tag, st.dst)
    return replace(program, gpus=gpus)


def _own(slot: Slot | None, k: Key, new: dict[tuple[int, Key], int], owner: dict[Slot, Key], rank: int) -> Slot | None:
    """``slot`` as key ``k`` sees it: a scratch slot of its own, or the input/output slot itself."""
    if slot is None:
        return None
    if slot[0] == "s":
        return ("s", new.setdefault((slot[1], k), len(new)))
    if owner.setdefault(slot, k) != k:
        raise ValueError(f"rank {rank} {slot[0]}[{slot[1]}] holds chunk {owner[slot]} and chunk {k}: "
                         "its thread blocks could not be kept apart")
    return slot


@dataclass
class Spread:
    """Where each step runs: ``tb[rank][step]``, a thread block index shared by all GPUs (a key's
    steps run in the same thread block on every GPU; a GPU may have none of a thread block's keys)."""

    tb: list[list[int]]
    count: int


@dataclass
class _Fill:
    ops: dict[int, int]
    peers: dict[tuple[int, str], set[int]]
    bufs: dict[tuple[int, str], set[tuple[int, str]]]


def spread(keys: list[list[Key]], cost: Callable[[int, int], int], peer: Callable[[int, int], tuple[str, int] | None],
           rbuf: Callable[[int, int], tuple[str, int, str] | None], op_budget: int, max_channels: int,
           order: Callable[[Key], tuple] = lambda k: k) -> Spread:
    """Deal the keys out to thread blocks (module docstring). ``cost(rank, step)``: the ops the
    step may take at most; ``peer(rank, step)``: the (channel type, peer) it talks over, or None;
    ``rbuf(rank, step)``: the (channel type, peer, buffer) it writes remotely, or None; ``order``:
    the order keys are dealt in. A key that alone exceeds the room gets a thread block of its own
    (the plan's limits, checked afterwards, say whether it fits)."""
    per_key: dict[Key, list[tuple[int, int]]] = defaultdict(list)
    for r, ks in enumerate(keys):
        for i, k in enumerate(ks):
            per_key[k].append((r, i))
    tb = [[0] * len(ks) for ks in keys]
    fill = _Fill(defaultdict(int), defaultdict(set), defaultdict(set))
    count = 1

    def fits(add: _Fill, into: _Fill) -> bool:
        return (all(into.ops[r] + n <= op_budget for r, n in add.ops.items())
                and all(len(into.peers[rt] | ps) <= max_channels for rt, ps in add.peers.items())
                and all(len(into.bufs[rt] | bs) <= max_channels for rt, bs in add.bufs.items()))

    for k in sorted(per_key, key=order):
        add = _Fill(defaultdict(int), defaultdict(set), defaultdict(set))
        for r, i in per_key[k]:
            add.ops[r] += cost(r, i)
            if (p := peer(r, i)) is not None:
                add.peers[(r, p[0])].add(p[1])
            if (b := rbuf(r, i)) is not None:
                add.bufs[(r, b[0])].add((b[1], b[2]))
        if fill.ops and not fits(add, fill):  # a key that alone exceeds the room gets a thread block of its own
            fill, count = _Fill(defaultdict(int), defaultdict(set), defaultdict(set)), count + 1
        for r, n in add.ops.items():
            fill.ops[r] += n
        for rt, ps in add.peers.items():
            fill.peers[rt] |= ps
        for rt, bs in add.bufs.items():
            fill.bufs[rt] |= bs
        for r, i in per_key[k]:
            tb[r][i] = count - 1
    return Spread(tb, count)
