"""The elements of an MSCCL algorithm XML, read and checked one by one against what the executor's
parser accepts (:mod:`flowride.program.msccl_limits`); the executor's rules on the whole
algorithm are :mod:`flowride.program.msccl_rules`.

This is the first half of reading an algorithm: every attribute is checked where it stands, and a
bad one is an :class:`~flowride.errors.InputError` whose field names the element by its position
in document order (``algo.xml:gpu[2]/tb[1]/step[5].srcoff``). What the elements do together (which
send feeds which receive, in which order the thread blocks can run, whether two steps race) is
the second half, :mod:`flowride.program.msccl_read`.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

from flowride.collectives.demand import Collective
from flowride.errors import InputError, InvalidSchedule
from flowride.program.model import BUF_NAMES
from flowride.program.msccl_limits import (
    COLLS,
    MAX_CHANNELS,
    MAX_COUNT,
    MAX_OFFSET,
    MAX_STEPS_PER_TB,
    MAX_TBS,
    OTHER_COLLS,
    PROTOS,
    RECV_TYPES,
    REQUIRED_ALGO_ATTRS,
    SEND_TYPES,
    STEP_TYPES,
)


@dataclass
class XStep:
    path: str
    s: int
    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: int


@dataclass
class XTb:
    path: str
    id: int
    send: int
    recv: int
    chan: int
    steps: list[XStep]


@dataclass
class XGpu:
    path: str
    id: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: list[XTb]


class Reader:
    """Checked attribute reads, and errors that name a place in one source (the file's name)."""

    def __init__(self, source: str) -> None:
        self.source = source

    def err(self, where: str, problem: str, fix: str) -> InputError:
        """The XML cannot be read as an MSCCL algorithm (a usage error)."""
        return InputError(f"{self.source}:{where}" if where else self.source, problem, fix)

    def wrong(self, where: str, problem: str, fix: str) -> InvalidSchedule:
        """The XML was understood, and the algorithm it describes is wrong (a race, a deadlock)."""
        return InvalidSchedule(f"{self.source}:{where}" if where else self.source, problem, fix)

    def attr(self, el: ET.Element, name: str, where: str, required: bool = True, default: str | None = None) -> str | None:
        v = el.get(name)
        if v is None:
            if required:
                raise self.err(f"{where}.{name}", "is missing", f'add {name}="..." to <{el.tag}>')
            return default
        return v.strip()

    def int(self, el: ET.Element, name: str, where: str, lo: int | None = None, hi: int | None = None, required: bool = True, default: int | None = None) -> int:
        v = self.attr(el, name, where, required)
        if v is None:
            return default  # type: ignore[return-value]
        try:
            x = int(v, 10)
        except ValueError:
            raise self.err(f"{where}.{name}", f"{v!r} is not an integer", "write a whole number in decimal") from None
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise self.err(f"{where}.{name}", f"{x} is outside {span}", f"give {name} in {span}")
        return x


@dataclass
class Algo:
    """An algorithm's elements, each checked on its own: per GPU (in rank order) its thread
    blocks (in id order) and their steps."""

    reader: Reader
    gpus: list[XGpu]
    coll: Collective
    n: int
    chunks: int  # C: chunks per block (nchunksperloop / ngpus)
    inplace: bool  # read with in-place semantics (marked in place and not out of place)
    name: str
    proto: str | None = None
    inplace_flag: bool = False  # the executor picks it for in-place calls
    outofplace_flag: bool = True  # ... and for out-of-place calls
    min_bytes: int = 0
    max_bytes: int = 0
    missing: tuple[str, ...] = ()  # <algo> attributes the executor requires and the file lacks


def parse_algo(text: str, source_name: str = "xml") -> Algo:
    """The elements of the MSCCL algorithm ``text``, every attribute checked (see the module)."""
    rd = Reader(source_name)
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise rd.err("", f"is not well-formed XML ({e})", "give an MSCCL algorithm XML file") from None
    if root.tag != "algo":
        raise rd.err("", f"the top element is <{root.tag}>, not <algo>", "give an MSCCL algorithm XML file")
    a = "algo"
    coll_name = rd.attr(root, "coll", a)
    if coll_name not in COLLS:
        if coll_name in OTHER_COLLS:
            raise rd.err(f"{a}.coll", f"{coll_name!r} is not supported by flowride", f"flowride handles {', '.join(COLLS)}")
        raise rd.err(f"{a}.coll", f"{coll_name!r} is not an MSCCL collective", f"use one of {', '.join(COLLS)}")
    coll = COLLS[coll_name]
    n = rd.int(root, "ngpus", a, 2, 65536)
    loop = rd.int(root, "nchunksperloop", a, 1, MAX_OFFSET)
    if loop % n:
        raise rd.err(f"{a}.nchunksperloop", f"{loop} is not a multiple of ngpus ({n})", "flowride needs the same number of chunks per rank")
    C = loop // n
    proto = rd.attr(root, "proto", a, required=False)
    if proto is not None and proto not in PROTOS:
        raise rd.err(f"{a}.proto", f"{proto!r} is not an MSCCL protocol", f"use one of {', '.join(PROTOS)}")
    nchannels = rd.int(root, "nchannels", a, 1, MAX_CHANNELS, required=False)
    inplace_flag = rd.int(root, "inplace", a, 0, 1, required=False, default=0)
    outofplace = rd.int(root, "outofplace", a, 0, 1, required=False, default=1 - inplace_flag)
    if not (inplace_flag or outofplace):
        raise rd.err(f"{a}.inplace", "the algorithm is marked neither in place nor out of place", 'set inplace="1" or outofplace="1"')
    min_bytes, max_bytes = (rd.int(root, attr, a, 0, required=False, default=0) for attr in ("minBytes", "maxBytes"))
    missing = tuple(x for x in REQUIRED_ALGO_ATTRS if root.get(x) is None)
    inplace = bool(inplace_flag) and not outofplace

    gpus: dict[int, XGpu] = {}
    for gi, gel in enumerate(root.findall("gpu")):
        gp = f"gpu[{gi}]"
        gid = rd.int(gel, "id", gp, 0, n - 1)
        if gid in gpus:
            raise rd.err(f"{gp}.id", f"GPU {gid} appears twice", "give each GPU one <gpu> element")
        g = XGpu(gp, gid, rd.int(gel, "i_chunks", gp, 0), rd.int(gel, "o_chunks", gp, 0), rd.int(gel, "s_chunks", gp, 0), [])
        tbs: dict[int, XTb] = {}
        for ti, tel in enumerate(gel.findall("tb")):
            tp = f"{gp}/tb[{ti}]"
            tid = rd.int(tel, "id", tp, 0, MAX_TBS - 1)
            if tid in tbs:
                raise rd.err(f"{tp}.id", f"thread block {tid} appears twice on GPU {gid}", "number thread blocks 0, 1, 2, ...")
            send = rd.int(tel, "send", tp, -1, n - 1)
            recv = rd.int(tel, "recv", tp, -1, n - 1)
            for nm, v in (("send", send), ("recv", recv)):
                if v == gid:
                    raise rd.err(f"{tp}.{nm}", f"GPU {gid} cannot {nm} to itself", "name another GPU, or -1 for none")
            chan = rd.int(tel, "chan", tp, 0, MAX_CHANNELS - 1)
            if nchannels is not None and chan >= nchannels:
                raise rd.err(f"{tp}.chan", f"{chan} is not below nchannels ({nchannels})", "raise algo.nchannels or use a lower channel")
            steps = []
            for si, sel in enumerate(tel.findall("step")):
                sp = f"{tp}/step[{si}]"
                s = rd.int(sel, "s", sp, 0)
                if s != si:
                    raise rd.err(f"{sp}.s", f"is {s}, expected {si}", "number the steps of a thread block 0, 1, 2, ... in order")
                if s >= MAX_STEPS_PER_TB:
                    raise rd.err(f"{sp}.s", f"{s} is beyond the executor's {MAX_STEPS_PER_TB} steps per thread block", "split the thread block")
                kind = rd.attr(sel, "type", sp)
                if kind not in STEP_TYPES:
                    raise rd.err(f"{sp}.type", f"{kind!r} is not an MSCCL step type", f"use one of {', '.join(sorted(STEP_TYPES))}")
                bufs = {}
                for nm in ("srcbuf", "dstbuf"):
                    b = rd.attr(sel, nm, sp)
                    if b not in BUF_NAMES:
                        raise rd.err(f"{sp}.{nm}", f"{b!r} is not a buffer", "use i, o or s")
                    bufs[nm] = b
                st = XStep(
                    sp, s, kind, bufs["srcbuf"], rd.int(sel, "srcoff", sp, -1, MAX_OFFSET), bufs["dstbuf"], rd.int(sel, "dstoff", sp, -1, MAX_OFFSET),
                    rd.int(sel, "cnt", sp, 0, MAX_COUNT - 1), rd.int(sel, "depid", sp, -1), rd.int(sel, "deps", sp, -1), rd.int(sel, "hasdep", sp, 0, 1),
                )
                if kind != "nop" and st.cnt < 1:
                    raise rd.err(f"{sp}.cnt", "is 0", "give the number of chunks the step moves (1 or more)")
                if kind in SEND_TYPES and send < 0:
                    raise rd.err(f"{sp}.type", f"{kind} sends, but its thread block has send=\"-1\"", "set the thread block's send peer")
                if kind in RECV_TYPES and recv < 0:
                    raise rd.err(f"{sp}.type", f"{kind} receives, but its thread block has recv=\"-1\"", "set the thread block's recv peer")
                steps.append(st)
            tbs[tid] = XTb(tp, tid, send, recv, chan, steps)
        for k in range(len(tbs)):
            if k not in tbs:
                raise rd.err(f"{gp}", f"thread block {k} is missing (ids {sorted(tbs)})", "number thread blocks 0, 1, 2, ... without gaps")
        g.tbs = [tbs[k] for k in range(len(tbs))]
        gpus[gid] = g
    for k in range(n):
        if k not in gpus:
            raise rd.err(a, f"GPU {k} has no <gpu> element (ngpus={n})", "give one <gpu> per rank, ids 0..ngpus-1")
    glist = [gpus[k] for k in range(n)]

    return Algo(rd, glist, coll, n, C, inplace, root.get("name") or source_name, proto, bool(inplace_flag), bool(outofplace), min_bytes, max_bytes, missing)
