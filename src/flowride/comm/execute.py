"""One rank's program run with torch.distributed point-to-point operations.

Steps follow :func:`flowride.program.check_program`: ``s`` sends a slot to a peer, ``r``
receives into a slot, ``rrc`` writes src + received into dst, ``cpy`` copies locally; a send and
its receive share a tag. Ranks synchronize only through the messages themselves (no global
barrier per epoch unless asked for), which is what lets a schedule's pipelining show.

Three ways to issue the messages (``mode``):

- ``dataflow`` (gloo's default): every receive is posted up front, each into its own staging
  tensor (or straight into its output slot when no earlier step touches that slot, which saves
  a copy); then steps run as soon as the steps they depend on (chunk-level read/write conflicts
  and ``Step.deps``) are done: a send goes out as soon as its data is there, even if the list
  puts it after a receive it does not need, and among ready receives one whose message is in
  goes first. gloo matches messages by (peer, tag), so posting order does not matter; the list
  order is one valid order of the same dependencies, so nothing deadlocks that the symbolic
  check (:func:`~flowride.program.model.check_program`) lets finish.
- ``ordered``: the same, but the steps run strictly in list order (a send waits for the
  receives listed before it, even unrelated ones). Slower: it turns the schedule's epoch order
  into waits. Kept to compare, and used with ``barrier_per_epoch``.
- ``grouped`` (NCCL's default): NCCL ignores tags and runs the operations between two ranks in
  the order they were issued, on one stream per pair, so receives posted early would block sends
  queued behind them. Here operations are issued epoch by epoch: first the local and receive
  steps of epoch e, then one ``batch_isend_irecv`` with this rank's sends of epoch e and its
  receives of the transfers *sent* in epoch e. Every rank issues the groups in the same epoch
  order, so the per-pair order agrees on both ends; a transfer sent in epoch e arrives in a later
  epoch (every GPU-to-GPU hop takes at least one), so no group waits for itself. Runs on gloo
  too, which is how it is tested here; on NCCL it is untested.

With ``barrier_per_epoch`` every rank passes one barrier per epoch of the whole program (the
lock-step execution the epoch model describes; for comparison only).

A slot is never overwritten while a send that reads it is in flight: before a step writes a chunk,
the sends reading that chunk are waited for (and every send a step lists in ``deps``). Which
chunks a step reads and writes, and the order those accesses impose, come from
:mod:`flowride.program.model` (the rules the exporter and the symbolic check use); only the
bookkeeping of what is in flight while the program runs is kept here.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from flowride.errors import InputError
from flowride.program.model import Program, reads, slot_hazards, writes

MODES = ("auto", "dataflow", "ordered", "grouped")


class CommError(RuntimeError):
    """A point-to-point operation failed (a peer died, or the process-group timeout expired)."""

    def __init__(self, rank: int, peer: int | None, message: str) -> None:
        self.rank, self.peer = rank, peer
        super().__init__(message)


@dataclass(eq=False)
class _Recv:
    step: int
    peer: int
    tag: int
    target: torch.Tensor  # where the message lands: a staging tensor, or the dst slot itself
    direct: bool


class ProgramExecutor:
    """Buffers and a prepared plan for one rank of ``program``; ``run()`` executes it once.

    Buffers ``bufs["i"|"o"|"s"]`` are flat tensors of i_chunks/o_chunks/s_chunks times
    ``elems`` elements; the caller fills ``bufs["i"]`` and reads ``bufs["o"]``. Staging tensors
    are allocated once here, so repeated runs time communication, not allocation.
    """

    def __init__(self, program: Program, rank: int, elems: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, mode: str = "auto", barrier_per_epoch: bool = False,
                 group=None) -> None:
        if mode not in MODES:
            raise InputError("mode", f"{mode!r} is unknown", f"use one of {', '.join(MODES)}")
        if not 0 <= rank < program.ngpus:
            raise InputError("rank", f"{rank} is not a rank of this {program.ngpus}-GPU program", "run one process per GPU of the program")
        self.program, self.rank, self.elems, self.group = program, rank, int(elems), group
        self.device = torch.device(device or "cpu")
        backend = dist.get_backend(group) if dist.is_initialized() else "gloo"
        self.mode = ("grouped" if backend == "nccl" else "dataflow") if mode == "auto" else mode
        self.barrier_per_epoch = barrier_per_epoch
        gp = program.gpus[rank]
        self.steps = gp.steps
        E = self.elems
        self.bufs = {b: torch.zeros(n * E, dtype=dtype, device=self.device)
                     for b, n in (("i", gp.i_chunks), ("o", gp.o_chunks), ("s", gp.s_chunks))}
        self.waiting: str | None = None  # what the rank is blocked on, for hang diagnosis
        self.waiting_peer: int | None = None
        self.before_step: Callable[[int], None] | None = None  # test hook (fault injection)
        self._plan(program)

    # ------------------------------------------------------------------ preparation
    def view(self, slot: tuple[str, int], cnt: int = 1) -> torch.Tensor:
        b, off = slot
        return self.bufs[b][off * self.elems:(off + cnt) * self.elems]

    def _plan(self, program: Program) -> None:
        steps = self.steps
        send_epoch: dict[int, int] = {}
        send_order: dict[tuple[int, int], list[int]] = defaultdict(list)  # (sender, receiver) -> tags in send order
        epochs: set[int] = set()
        for g in program.gpus:
            for st in g.steps:
                epochs.add(st.epoch)
                if st.op == "s":
                    send_epoch[st.tag] = st.epoch
                    send_order[(g.rank, st.peer)].append(st.tag)
        self.epochs = sorted(epochs)
        conflicts = slot_hazards(steps)
        n = len(steps)
        if self.mode == "grouped":
            order = sorted(range(n), key=lambda i: (steps[i].epoch, steps[i].op == "s"))
            pos = {i: p for p, i in enumerate(order)}
            for i in range(n):
                bad = [d for d in conflicts[i] | set(steps[i].deps) if pos[d] > pos[i]]
                if bad:
                    raise InputError("mode", f"rank {self.rank} step {i} must follow step {bad[0]}, which grouped mode runs later",
                                     "use mode='dataflow' or 'ordered', or order the program by epoch")
        else:
            order = list(range(n))
        # the first step (in execution order) to touch each chunk: a receive that is first may
        # land in its slot directly
        first: dict[tuple[str, int], int] = {}
        for i in order:
            for ch in reads(steps[i]) + writes(steps[i]):
                first.setdefault(ch, i)
        self.recvs: dict[int, _Recv] = {}
        for i, st in enumerate(steps):
            if st.op not in ("r", "rrc"):
                continue
            direct = st.op == "r" and all(first.get(ch) == i for ch in writes(st))
            target = self.view(st.dst, st.cnt) if direct else torch.empty(st.cnt * self.elems, dtype=self.bufs["i"].dtype, device=self.device)
            self.recvs[i] = _Recv(i, st.peer, st.tag, target, direct)
        by_tag = {rv.tag: rv for rv in self.recvs.values()}
        # receives in the order their senders send them (what NCCL needs; harmless for gloo)
        self.post_order = [by_tag[t] for p in range(program.ngpus) if p != self.rank
                           for t in send_order.get((p, self.rank), []) if t in by_tag]
        posted = {rv.step for rv in self.post_order}
        self.post_order += [rv for rv in self.recvs.values() if rv.step not in posted]
        self.sends_before = {i: [d for d in steps[i].deps if steps[d].op == "s"] for i in range(n)}
        self.deps = [sorted(conflicts[i] | set(steps[i].deps)) for i in range(n)]
        self.dependents: list[list[int]] = [[] for _ in range(n)]
        for i, ds in enumerate(self.deps):
            for d in ds:
                self.dependents[d].append(i)
        plan: list[tuple[str, object]] = []
        if self.mode != "grouped":
            # every rank passes the same barriers (one per epoch of the whole program), each
            # before its first step of that epoch or a later one
            barriers = iter(self.epochs)
            pending = next(barriers, None)
            for i in order:
                while self.barrier_per_epoch and pending is not None and pending <= steps[i].epoch:
                    plan.append(("barrier", pending))
                    pending = next(barriers, None)
                plan.append(("step", i))
            while self.barrier_per_epoch and pending is not None:
                plan.append(("barrier", pending))
                pending = next(barriers, None)
        else:
            by_epoch: dict[int, list[int]] = defaultdict(list)
            for i in order:
                by_epoch[steps[i].epoch].append(i)
            recvs_sent_in: dict[int, list[_Recv]] = defaultdict(list)
            for rv in self.post_order:
                recvs_sent_in[send_epoch.get(rv.tag, -1)].append(rv)
            for e in self.epochs:
                if self.barrier_per_epoch:
                    plan.append(("barrier", e))
                for i in by_epoch.get(e, []):
                    if steps[i].op != "s":
                        plan.append(("step", i))
                sends = [i for i in by_epoch.get(e, []) if steps[i].op == "s"]
                if sends or recvs_sent_in.get(e):
                    plan.append(("group", (sends, recvs_sent_in.get(e, []))))
        self.plan = plan

    # ------------------------------------------------------------------ execution
    def _wait(self, work, what: str, peer: int | None) -> None:
        self.waiting, self.waiting_peer = what, peer
        try:
            work.wait()
        except Exception as e:  # gloo raises RuntimeError on a closed peer or a timeout
            raise CommError(self.rank, peer, f"rank {self.rank}: {what} failed: {e}") from e
        finally:
            self.waiting, self.waiting_peer = None, None

    def _wait_send(self, i: int) -> None:
        w = self._send_work.pop(i, None)
        if w is not None:
            st = self.steps[i]
            self._wait(w, f"send of transfer {st.tag} to rank {st.peer} (step {i})", st.peer)

    def _send_view(self, i: int) -> torch.Tensor:
        """The slot step ``i`` sends, registered as read by a send in flight."""
        st = self.steps[i]
        for ch in reads(st):
            self._readers[ch].append(i)
        return self.view(st.src, st.cnt)

    def _step(self, i: int) -> None:
        """Execute step ``i``: a receive blocks until its message is in; a send is only posted."""
        st = self.steps[i]
        if self.before_step is not None:
            self.before_step(self._executed)
        self._executed += 1
        for d in self.sends_before[i]:
            self._wait_send(d)
        for ch in writes(st):  # never overwrite what a send in flight is reading
            for d in self._readers.pop(ch, []):
                self._wait_send(d)
        if st.op == "s":
            src = self._send_view(i)
            if self.mode != "grouped":  # grouped: the send goes out with its epoch's group
                self._send_work[i] = dist.isend(src, dst=st.peer, tag=st.tag, group=self.group)
        elif st.op == "cpy":
            self.view(st.dst, st.cnt).copy_(self.view(st.src, st.cnt))
        else:
            rv = self.recvs[i]
            self._wait(self._recv_work.pop(i), f"receive of transfer {st.tag} from rank {st.peer} (step {i})", st.peer)
            if st.op == "r":
                if not rv.direct:
                    self.view(st.dst, st.cnt).copy_(rv.target)
            else:
                torch.add(self.view(st.src, st.cnt), rv.target, out=self.view(st.dst, st.cnt))

    def _group(self, sends: list[int], rvs: list[_Recv]) -> None:
        g, steps = self.group, self.steps
        ops = [dist.P2POp(dist.isend, self._send_view(i), steps[i].peer, g, steps[i].tag) for i in sends]
        ops += [dist.P2POp(dist.irecv, rv.target, rv.peer, g, rv.tag) for rv in rvs]
        works = dist.batch_isend_irecv(ops)
        if len(works) != len(ops):  # NCCL may return one work for the whole group
            works = [works[0]] * len(ops)
        for i, w in zip(sends, works[:len(sends)], strict=True):
            self._send_work[i] = w
        for rv, w in zip(rvs, works[len(sends):], strict=True):
            self._recv_work[rv.step] = w

    def _run_dataflow(self) -> None:
        """Steps in dependency order rather than list order: a send goes out as soon as the
        steps it depends on are done, even when the list puts it after a receive it does not
        need; among receives, one whose message is already in goes first. The list's order is
        one valid schedule of the same dependencies, so this cannot deadlock where it would not."""
        n = len(self.steps)
        left = [len(d) for d in self.deps]
        ready = [i for i in range(n) if not left[i]]
        heapq.heapify(ready)
        recvs: list[int] = []  # ready receives, by index
        done = 0
        while done < n:
            while ready:
                i = heapq.heappop(ready)
                if self.steps[i].op in ("r", "rrc"):
                    bisect.insort(recvs, i)
                    continue
                self._step(i)
                done += 1
                for d in self.dependents[i]:
                    left[d] -= 1
                    if not left[d]:
                        heapq.heappush(ready, d)
            if not recvs:
                if done < n:
                    raise AssertionError(f"rank {self.rank}: steps left with unmet dependencies")
                break
            pick = next((k for k, i in enumerate(recvs) if self._recv_work[i].is_completed()), 0)
            i = recvs.pop(pick)
            self._step(i)
            done += 1
            for d in self.dependents[i]:
                left[d] -= 1
                if not left[d]:
                    heapq.heappush(ready, d)

    def run(self) -> None:
        """Execute the program once (the input buffer must already hold this rank's data)."""
        self._recv_work: dict[int, object] = {}
        self._send_work: dict[int, object] = {}
        self._readers: dict[tuple[str, int], list[int]] = defaultdict(list)  # chunk -> sends in flight reading it
        self._executed = 0
        g = self.group
        if self.mode != "grouped":
            for rv in self.post_order:
                self._recv_work[rv.step] = dist.irecv(rv.target, src=rv.peer, tag=rv.tag, group=g)
        if self.mode == "dataflow" and not self.barrier_per_epoch:
            self._run_dataflow()
        else:
            for kind, arg in self.plan:
                if kind == "barrier":
                    self.waiting = f"barrier of epoch {arg}"
                    dist.barrier(group=g)
                    self.waiting = None
                elif kind == "group":
                    self._group(*arg)
                else:
                    self._step(arg)
        for i in list(self._send_work):
            self._wait_send(i)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def execute_program(program: Program, rank: int, elems: int, inp: torch.Tensor | None = None,
                    dtype: torch.dtype = torch.float32, device: torch.device | str | None = None,
                    barrier_per_epoch: bool = False, group=None, mode: str = "auto") -> torch.Tensor:
    """Run ``rank``'s part of ``program`` once on ``elems`` elements per chunk and return its
    output buffer. ``inp`` (i_chunks * elems elements) is copied into the input buffer; the
    process group must already be initialized. For repeated runs keep a :class:`ProgramExecutor`."""
    ex = ProgramExecutor(program, rank, elems, dtype, device, mode, barrier_per_epoch, group)
    if inp is not None:
        ex.bufs["i"].copy_(inp)
    ex.run()
    return ex.bufs["o"]
