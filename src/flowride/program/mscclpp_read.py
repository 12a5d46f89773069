"""An MSCCL++ execution plan read into flowride's Program IR (any plan, not only flowride's own).

The plan is checked first (:func:`~flowride.program.mscclpp_rules.check_rules`) and run
symbolically (:func:`~flowride.program.mscclpp_exec.run_plan`); the run's events, in the order
they happened, become steps:

- a chunk copied within a GPU: ``cpy``;
- a chunk written into a peer's memory (``put``, ``ppkt``, the remote outputs of ``res``,
  ``rres``, ``respkt``) or read from it (``get``): a transfer, ``s`` on the GPU that holds it and
  ``r`` on the other;
- a sum: the first of its terms is the base; a peer's term read in place (``rre``, ``rres``) is a
  transfer received with ``rrc``; a local term that arrived by a transfer no op has read yet (a
  scratch slot filled by a peer's ``put`` or ``ppkt``) turns that transfer's ``r`` into an
  ``rrc`` at the sum's place. A sum of two local values that came from no transfer has no
  Program step (the Program has no local add): such a plan reads, checks and runs, but cannot
  become a Program (:class:`~flowride.errors.InputError`);
- an in-place plan's buffers are the Program's out-of-place ones through
  :func:`~flowride.program.model.inplace_alias`, with copies in (AllGather) or out (the others).
"""

from __future__ import annotations

from pathlib import Path

from flowride.errors import InputError, InvalidSchedule
from flowride.files import read_json
from flowride.program.model import (
    GpuProgram,
    Program,
    Slot,
    Step,
    expected_outputs,
    inplace_alias,
    validate_program,
)
from flowride.program.mscclpp_exec import (
    ExecResult,
    Loc,
    plan_chunks,
    run_plan,
    stub_program,
    unmodelled_features,
)
from flowride.program.mscclpp_plan import Plan, parse_plan
from flowride.program.mscclpp_rules import check_rules

FIX = "fix the plan; docs/mscclpp.md lists the rules"
UNMODELLED_FIX = "flowride models memory and port channels (Simple and LL); docs/mscclpp.md lists what it does not"


def load_plan(path: str | Path) -> Plan:
    """The plan in the JSON file at ``path`` (parsed, not yet checked)."""
    obj = read_json(path, "plan", "give an MSCCL++ execution plan JSON")
    return parse_plan(obj, "plan")


def checked_run(plan: Plan) -> ExecResult:
    """The rules, then the symbolic run; the first thing wrong is an :class:`InvalidSchedule`."""
    unmodelled = unmodelled_features(plan)  # first: flowride's rules do not cover what it does not model
    if unmodelled:
        raise InputError("plan", f"cannot be checked: it {unmodelled}", UNMODELLED_FIX)
    found = check_rules(plan)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise InvalidSchedule("plan", f"breaks the executor's rules: {found[0]}{more}", FIX)
    res = run_plan(plan)
    if res.unmodelled:
        raise InputError("plan", f"cannot be checked: {res.unmodelled}", UNMODELLED_FIX)
    if res.problems:
        more = f" (and {len(res.problems) - 1} more problem(s))" if len(res.problems) > 1 else ""
        raise InvalidSchedule("plan", f"does not compute the {plan.collective}: {res.problems[0]}{more}", FIX)
    return res


class _Builder:
    def __init__(self, plan: Plan, c: int) -> None:
        self.plan, self.c = plan, c
        self.steps: list[list[Step | None]] = [[] for _ in plan.gpus]
        self.pending: dict[Loc, tuple[int, int]] = {}  # a slot's value delivered by an r step nothing has read yet
        self.tag = 0

    def add(self, rank: int, st: Step) -> int:
        self.steps[rank].append(st)
        return len(self.steps[rank]) - 1

    def transfer(self, src: Loc, dst: Loc, op: str, base: Slot | None = None) -> None:
        self.pending.pop(src, None)
        self.add(src[0], Step("s", dst[0], (src[1], src[2]), (dst[1], dst[2]), 0, self.tag))
        k = self.add(dst[0], Step(op, src[0], base, (dst[1], dst[2]), 0, self.tag))
        self.tag += 1
        if op == "r":
            self.pending[dst] = (dst[0], k)

    def event(self, target: Loc, sources: list[Loc]) -> None:
        t = target[0]
        tslot = (target[1], target[2])
        if len(sources) == 1:
            s = sources[0]
            if s == target:
                return
            self.pending.pop(target, None)
            if s[0] == t:
                self.pending.pop(s, None)
                self.add(t, Step("cpy", -1, (s[1], s[2]), tslot, 0))
            else:
                self.transfer(s, target, "r")
            return
        local = [s for s in sources if s[0] == t]
        remote = [s for s in sources if s[0] != t]
        folds = [s for s in local if s in self.pending and s != target]
        base = [s for s in local if s not in folds]
        if len(base) > 1:
            raise InputError("plan", f"GPU {t} adds {len(base)} of its own chunks ({', '.join(f'{b[1]}[{b[2]}]' for b in base)}) "
                             "that no transfer just delivered; flowride's Program has no local add",
                             "such a plan is checked and run symbolically, but cannot be turned into a schedule")
        for b in base:
            self.pending.pop(b, None)
        cur: Slot | None = (base[0][1], base[0][2]) if base else None
        if cur is None and folds:
            first = folds.pop(0)
            self.pending.pop(first, None)
            cur = (first[1], first[2])
        if cur is None:
            self.transfer(remote.pop(0), target, "r")
            self.pending.pop(target, None)
            cur = tslot
        for f in folds:
            rank, k = self.pending.pop(f)
            old = self.steps[rank][k]
            self.steps[rank][k] = None
            self.add(t, Step("rrc", old.peer, cur, tslot, 0, old.tag))
            cur = tslot
        for q in remote:
            self.transfer(q, target, "rrc", cur)
            cur = tslot
        self.pending.pop(target, None)
        if cur != tslot:
            self.add(t, Step("cpy", -1, cur, tslot, 0))


def plan_to_program(plan: Plan, res: ExecResult) -> Program:
    """The Program doing what ``plan`` did in its symbolic run ``res`` (see the module text)."""
    c = plan_chunks(plan)
    stub = stub_program(plan, c)
    coll = stub.collective
    b = _Builder(plan, c)
    if plan.inplace and plan.collective == "allgather":
        for r in range(plan.ngpus):
            for k in range(c):
                b.add(r, Step("cpy", -1, ("i", k), inplace_alias(coll, r, c, ("i", k)), 0))
    for ev in res.events:
        b.event(ev.target, ev.sources)
    if plan.inplace and plan.collective != "allgather":
        for r in range(plan.ngpus):
            for slot in expected_outputs(stub, r):
                b.add(r, Step("cpy", -1, inplace_alias(coll, r, c, slot), slot, 0))
    gpus = []
    for g in plan.gpus:
        steps = [st for st in b.steps[g.id] if st is not None]
        gpus.append(GpuProgram(g.id, g.id, stub.gpus[g.id].i_chunks, stub.gpus[g.id].o_chunks, g.scratch_chunks, steps))
    prog = Program(plan.name, coll, c, gpus)
    validate_program(prog)
    return prog


def from_mscclpp_json(obj: dict, where: str = "plan") -> Program:
    """A flowride Program from a parsed MSCCL++ plan (checked and run first)."""
    plan = parse_plan(obj, where)
    return plan_to_program(plan, checked_run(plan))


def read_mscclpp(path: str | Path) -> Program:
    """A flowride Program from the MSCCL++ execution plan JSON at ``path``."""
    plan = load_plan(path)
    return plan_to_program(plan, checked_run(plan))
