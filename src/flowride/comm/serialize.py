"""Per-GPU programs as plain JSON, so a worker process (or a torchrun on another machine) reads
exactly the program the launcher lowered, and a structural check that runs before any process is
spawned.

The structural check matters because a malformed program does not fail, it hangs: a receive whose
send was dropped waits for the process-group timeout. Catching it up front turns a hang into an
:class:`~flowride.errors.InputError` that names the rank and step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowride.collectives.demand import Collective
from flowride.errors import InputError, InvalidSchedule
from flowride.files import read_json, write_json_atomic
from flowride.program.model import GpuProgram, Program, Step

SCHEMA = "flowride.program/1"
OPS = ("s", "r", "rrc", "cpy")
BUFFERS = ("i", "o", "s")


def _slot(v: Any, where: str) -> tuple[str, int] | None:
    if v is None:
        return None
    if not (isinstance(v, list | tuple) and len(v) == 2 and v[0] in BUFFERS and isinstance(v[1], int) and not isinstance(v[1], bool)):
        raise InputError(where, f"{v!r} is not a slot", 'give ["i"|"o"|"s", chunk offset] or null')
    return (str(v[0]), int(v[1]))


def program_to_dict(prog: Program) -> dict[str, Any]:
    """The program as JSON-ready data; steps are [op, peer, src, dst, epoch, tag, deps, cnt]."""
    return {
        "schema": SCHEMA,
        "name": prog.name,
        "collective": prog.collective.value,
        "chunks": prog.chunks,
        "chunk_bytes": prog.chunk_bytes,
        "gpus": [
            {
                "rank": g.rank,
                "node": g.node,
                "i_chunks": g.i_chunks,
                "o_chunks": g.o_chunks,
                "s_chunks": g.s_chunks,
                "steps": [
                    [st.op, st.peer, list(st.src) if st.src else None, list(st.dst) if st.dst else None, st.epoch, st.tag, list(st.deps), st.cnt]
                    for st in g.steps
                ],
            }
            for g in prog.gpus
        ],
    }


GPU_KEYS = ("rank", "node", "i_chunks", "o_chunks", "s_chunks", "steps")


def program_from_dict(data: Any) -> Program:
    """Inverse of :func:`program_to_dict`; bad data is an InputError naming the field."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise InputError("program", "is not a flowride program", f"expected a JSON object with schema {SCHEMA!r}")
    known = ("schema", "name", "collective", "chunks", "chunk_bytes", "gpus")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise InputError(f"program.{unknown[0]}", "is not a known key", f"known keys: {', '.join(known)}")
    for key in ("name", "collective", "chunks", "gpus"):
        if key not in data:
            raise InputError(key, "is missing from the program", "write it with flowride.comm.save_program")
    for r, g in enumerate(data["gpus"] if isinstance(data["gpus"], list) else []):
        extra = sorted(set(g) - set(GPU_KEYS)) if isinstance(g, dict) else []
        if extra:
            raise InputError(f"gpus[{r}].{extra[0]}", "is not a known key", f"known keys: {', '.join(GPU_KEYS)}")
    if not isinstance(data["gpus"], list):
        raise InputError("gpus", "is not a list", "write it with flowride.comm.save_program")
    chunks = data["chunks"]
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise InputError("chunks", f"{chunks!r} is not a positive integer", "give chunks per block")
    gpus = []
    for r, g in enumerate(data["gpus"]):
        try:
            steps = []
            for k, s in enumerate(g["steps"]):
                op, peer, src, dst, epoch, tag, deps, cnt = s
                if op not in OPS:
                    raise InputError(f"gpus[{r}].steps[{k}]", f"op {op!r} is unknown", f"use one of {', '.join(OPS)}")
                steps.append(Step(op, int(peer), _slot(src, f"gpus[{r}].steps[{k}].src"), _slot(dst, f"gpus[{r}].steps[{k}].dst"),
                                  int(epoch), int(tag), [int(d) for d in deps], int(cnt)))
            gpus.append(GpuProgram(int(g["rank"]), int(g["node"]), int(g["i_chunks"]), int(g["o_chunks"]), int(g["s_chunks"]), steps))
        except InputError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"gpus[{r}]", f"is malformed ({type(e).__name__}: {e})", "write it with flowride.comm.save_program") from None
    return Program(str(data["name"]), Collective.parse(data["collective"]), chunks, gpus, float(data.get("chunk_bytes", 0.0)))


def save_program(prog: Program, path: str | Path) -> None:
    write_json_atomic(path, program_to_dict(prog))


def load_program(path: str | Path) -> Program:
    return program_from_dict(read_json(path, "program", "give a program JSON written by flowride.comm.save_program"))


def structural_problems(prog: Program) -> list[str]:
    """What would make the program hang or crash rather than compute a wrong answer: ranks out of
    order, slots outside their buffers, a receive whose send is missing (or the other way round),
    deps pointing forward. Empty when the program can run to the end."""
    problems: list[str] = []
    n = prog.ngpus
    sends: dict[int, tuple[int, int, int]] = {}  # tag -> (sender, receiver, cnt)
    recvs: dict[int, tuple[int, int, int]] = {}
    for r, g in enumerate(prog.gpus):
        if g.rank != r:
            problems.append(f"gpus[{r}] has rank {g.rank}; ranks must be 0..{n - 1} in order")
            continue
        size = {"i": g.i_chunks, "o": g.o_chunks, "s": g.s_chunks}
        for k, st in enumerate(g.steps):
            where = f"rank {r} step {k} ({st.op})"
            if st.cnt < 1:
                problems.append(f"{where}: count {st.cnt} is below 1")
            for name, slot in (("src", st.src), ("dst", st.dst)):
                if slot is not None and not 0 <= slot[1] <= size[slot[0]] - st.cnt:
                    problems.append(f"{where}: {name} {slot[0]}[{slot[1]}] (count {st.cnt}) is outside {slot[0]}[0:{size[slot[0]]}]")
            need_src = st.op in ("s", "rrc", "cpy")
            need_dst = st.op in ("r", "rrc", "cpy")
            if need_src and st.src is None:
                problems.append(f"{where}: has no source slot")
            if need_dst and st.dst is None:
                problems.append(f"{where}: has no destination slot")
            if any(not 0 <= d < k for d in st.deps):
                problems.append(f"{where}: depends on a step that does not come before it ({st.deps})")
            if st.op in ("s", "r", "rrc"):
                if not 0 <= st.peer < n or st.peer == r:
                    problems.append(f"{where}: peer {st.peer} is not another rank of 0..{n - 1}")
                    continue
                if st.tag < 0:
                    problems.append(f"{where}: tag {st.tag} is negative")
                table = sends if st.op == "s" else recvs
                if st.tag in table:
                    problems.append(f"{where}: transfer {st.tag} is {'sent' if st.op == 's' else 'received'} twice")
                table[st.tag] = (r, st.peer, st.cnt) if st.op == "s" else (st.peer, r, st.cnt)
    for tag, (u, v, cnt) in sorted(recvs.items()):
        if tag not in sends:
            problems.append(f"rank {v} receives transfer {tag} from rank {u}, which rank {u} never sends")
        elif sends[tag] != (u, v, cnt):
            su, sv, sc = sends[tag]
            problems.append(f"transfer {tag}: rank {v} expects {cnt} chunk(s) from rank {u}, but rank {su} sends {sc} to rank {sv}")
    for tag, (u, v, _) in sorted(sends.items()):
        if tag not in recvs:
            problems.append(f"rank {u} sends transfer {tag} to rank {v}, which rank {v} never receives")
    return problems


def check_structure(prog: Program) -> None:
    """Raise an InputError listing the first structural problems (see :func:`structural_problems`)."""
    problems = structural_problems(prog)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise InvalidSchedule("program", "; ".join(problems[:3]) + more, "lower a verified schedule, or fix the program")
