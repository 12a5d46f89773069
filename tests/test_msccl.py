"""MSCCL XML: export obeys the executor's parser, import reads any MSCCL algorithm, and both
round-trip through the symbolic check and the independent simulator."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from functools import cache

import pytest

from flowride.api import synthesize
from flowride.collectives.demand import make_demand
from flowride.errors import InputError
from flowride.program import (
    check_program,
    from_msccl_xml,
    lower,
    program_to_schedule,
    read_msccl,
    to_msccl_xml,
    transfers,
    write_msccl,
)
from flowride.schedule.ir import Schedule
from flowride.schedule.reduce import allreduce_from_allgather, reduce_scatter_from_allgather
from flowride.schedule.simulate import simulate
from flowride.synth.greedy import baseline_sends
from flowride.topology.builtins import build_topology
from flowride.topology.timing import epoch_timing

# ---------------------------------------------------------------------------------------------
# The executor's rules (Azure/msccl-executor-nccl: msccl_parser.cc, msccl_struct.h, msccl_kernel.cu)

ALGO_ATTRS = ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes", "maxBytes")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
CHECKED_SRC = {"s", "rrs", "rrcs", "cpy", "re", "rrc"}  # local source (rrc's too, though the parser skips it)
CHECKED_DST = {"r", "rcs", "rrcs", "cpy", "re", "rrc"}
SENDS = {"s", "rcs", "rrs", "rrcs"}
RECVS = {"r", "rcs", "rrs", "rrc", "rrcs"}
ELEMENT = re.compile(r'^ *(<(algo|gpu|tb|step)( [A-Za-z_]+="[^"]*")*(/?)>|</(algo|gpu|tb)>)$')


def check_executor_rules(text: str, unfused: bool = False) -> dict:
    """Assert everything the executor's parser and kernel need; return a few counts."""
    assert not text.lstrip().startswith("<?"), "no XML declaration: the executor's tokenizer reads it as an element"
    assert "\t" not in text and "<!--" not in text
    for line in text.splitlines():
        # one element per line, attributes separated by single spaces, values double-quoted
        assert ELEMENT.match(line), line
    root = ET.fromstring(text)
    assert root.tag == "algo"
    assert set(ALGO_ATTRS) <= set(root.attrib) and len(root.attrib) <= 16
    assert root.get("coll") in ("allgather", "alltoall", "reducescatter", "allreduce")
    assert root.get("proto") in ("Simple", "LL128", "LL")
    assert (root.get("inplace"), root.get("outofplace")) == (("1", "0") if unfused else ("0", "1"))
    n, nch, loop = int(root.get("ngpus")), int(root.get("nchannels")), int(root.get("nchunksperloop"))
    assert 1 <= nch <= 32 and loop % n == 0
    gpus = root.findall("gpu")
    assert sorted(int(g.get("id")) for g in gpus) == list(range(n))
    tbs_total = steps_total = split = 0
    for g in gpus:
        gid = int(g.get("id"))
        size = {"i": int(g.get("i_chunks")), "o": int(g.get("o_chunks")), "s": int(g.get("s_chunks"))}
        tbs = g.findall("tb")
        assert sorted(int(t.get("id")) for t in tbs) == list(range(len(tbs))), "thread block ids 0..k-1"
        by_id = {int(t.get("id")): t for t in tbs}
        conns: set = set()
        per_chan: dict = defaultdict(int)
        peers: dict = defaultdict(int)
        waited: set = set()
        hasdep: set = set()
        nops: set = set()
        nodes = 1 + n + len(tbs)
        for t in tbs:
            tid, send, recv, chan = (int(t.get(k)) for k in ("id", "send", "recv", "chan"))
            assert send != gid and recv != gid and -1 <= send < n and -1 <= recv < n
            assert 0 <= chan < nch
            for kind, peer in (("send", send), ("recv", recv)):
                if peer >= 0:
                    assert (kind, peer, chan) not in conns, "one thread block per connection and channel"
                    conns.add((kind, peer, chan))
                    per_chan[(kind, chan)] += 1
                    assert per_chan[(kind, chan)] <= 32
                    peers[(kind, peer)] += 1
            steps = t.findall("step")
            nodes += len(steps)
            assert 1 <= len(steps) <= 64
            chain = 0
            for k, st in enumerate(steps):
                assert set(st.attrib) == set(STEP_ATTRS)
                assert int(st.get("s")) == k, "steps numbered 0..n-1"
                typ = st.get("type")
                assert typ in ({"s", "r", "rrc", "nop"} if unfused else SENDS | RECVS | {"cpy", "nop"})
                assert st.get("srcbuf") in size and st.get("dstbuf") in size
                cnt = int(st.get("cnt"))
                assert 1 <= cnt < 72
                for which, checked in (("src", CHECKED_SRC), ("dst", CHECKED_DST)):
                    off = int(st.get(which + "off"))
                    assert off >= -1
                    if typ in checked:
                        assert 0 <= off and off + cnt <= size[st.get(which + "buf")], (gid, t.get("id"), k, which)
                if typ in SENDS:
                    assert send >= 0
                if typ in RECVS:
                    assert recv >= 0
                depid, deps = int(st.get("depid")), int(st.get("deps"))
                if depid >= 0:
                    assert depid in by_id and depid != tid and depid <= 127
                    assert 0 <= deps < len(by_id[depid].findall("step"))
                    waited.add((depid, deps))
                else:
                    assert deps == -1
                if st.get("hasdep") == "1":
                    hasdep.add((tid, k))
                if typ == "nop":
                    nops.add((tid, k))
                    assert depid >= 0, "a nop carries exactly one dependency"
                    chain += 1
                else:
                    if chain:
                        assert depid >= 0, "a run of nops ends in a real step with a dependency"
                    chain = 0
            assert chain == 0, "a thread block does not end in nops"
        assert waited <= hasdep, "every step waited on has hasdep=1"
        assert not (waited & nops), "no dependency points at a nop"
        assert nodes < 4096
        tbs_total += len(tbs)
        steps_total += sum(len(t.findall("step")) for t in tbs)
        split += sum(1 for v in peers.values() if v > 1)
    return {"tbs": tbs_total, "steps": steps_total, "nchannels": nch, "split_connections": split}


# ---------------------------------------------------------------------------------------------
# Schedules of every collective, quickly: the classic baselines, reductions run backwards


def _baseline(topo, coll: str, chunks: int) -> Schedule:
    demand = make_demand(topo, coll, 1 << 20, chunks)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    return Schedule.from_tuples(topo, demand, timing.tau, baseline_sends(topo, demand, timing)[1], {"method": "baseline"})


@cache
def schedules(name: str, chunks: int, **params) -> tuple[Schedule, ...]:
    topo = build_topology(name, **params)
    fwd = _baseline(topo, "allgather", chunks)
    rev = _baseline(topo.reversed(), "allgather", chunks)
    return (fwd, _baseline(topo, "alltoall", chunks), reduce_scatter_from_allgather(rev, topo), allreduce_from_allgather(rev, fwd, topo))


TOPOLOGIES = [("ring", {"n": 4}), ("dgx1", {}), ("switch", {"n": 4}), ("ndv2", {"chassis": 2})]


def round_trip(sched: Schedule, **kw) -> dict:
    prog = lower(sched)
    text = to_msccl_xml(prog, **kw)
    info = check_executor_rules(text, unfused=kw.get("unfused", False))
    back = from_msccl_xml(text)
    assert check_program(back) == []
    assert back.collective is prog.collective and back.chunks == prog.chunks and back.ngpus == prog.ngpus
    again = program_to_schedule(back)
    sim = simulate(again)
    assert sim.valid, sim.first_violation
    n_transfers = len(transfers(sched))
    assert sum(st.op == "s" for g in back.gpus for st in g.steps) == n_transfers
    assert len(again.sends) == n_transfers
    return info


@pytest.mark.parametrize("unfused", [False, True], ids=["fused", "unfused"])
@pytest.mark.parametrize("chunks", [1, 2])
@pytest.mark.parametrize(("name", "params"), TOPOLOGIES, ids=[t for t, _ in TOPOLOGIES])
def test_round_trip_every_collective(name, params, chunks, unfused):
    for sched in schedules(name, chunks, **params):
        round_trip(sched, unfused=unfused)


@pytest.mark.parametrize(("name", "params"), [("ring", {"n": 4}), ("switch", {"n": 4}), ("torus", {"rows": 2, "cols": 3})])
def test_round_trip_synthesized(name, params):
    """MILP schedules relay through scratch and reorder freely; they export and verify too."""
    topo = build_topology(name, **params)
    fwd = synthesize(topo, "allgather", 1 << 20, "fast", chunks=2, time_limit=5).schedule
    rev = synthesize(topo.reversed(), "allgather", 1 << 20, "fast", chunks=2, time_limit=5).schedule
    a2a = synthesize(topo, "alltoall", 1 << 20, "fast", chunks=2, time_limit=5).schedule
    for sched in (fwd, a2a, reduce_scatter_from_allgather(rev, topo), allreduce_from_allgather(rev, fwd, topo)):
        for unfused in (False, True):
            round_trip(sched, unfused=unfused)


def test_large_schedule_is_split_over_thread_blocks_and_channels():
    a2a = schedules("ndv2", 2, chassis=2)[1]
    info = round_trip(a2a)
    assert info["tbs"] > 16
    tight = round_trip(a2a, max_steps_per_tb=6, max_tbs_per_channel=8)
    assert tight["split_connections"] > 0 and tight["nchannels"] > 1 and tight["tbs"] > info["tbs"]
    ar = schedules("dgx1", 2)[3]
    small = round_trip(ar, max_steps_per_tb=3, max_tbs_per_channel=2, unfused=True)
    assert small["nchannels"] > 1


def test_unfused_writes_only_s_r_rrc_nop_in_place():
    for sched in schedules("dgx1", 1):
        text = to_msccl_xml(lower(sched), unfused=True)
        assert set(re.findall(r'type="(\w+)"', text)) <= {"s", "r", "rrc", "nop"}
        assert 'inplace="1" outofplace="0"' in text
    ag = to_msccl_xml(lower(schedules("dgx1", 1)[0]))
    assert 'type="cpy"' in ag and 'inplace="0" outofplace="1"' in ag


def test_layout_and_header():
    ag, a2a, rs, ar = (lower(s) for s in schedules("ring", 2, n=4))
    for prog, i_chunks, o_chunks in ((ag, 2, 8), (a2a, 8, 8), (rs, 8, 2), (ar, 8, 8)):
        root = ET.fromstring(to_msccl_xml(prog, name="my algo!", proto="LL128", min_bytes=1024, max_bytes=0))
        assert root.get("nchunksperloop") == "8" and root.get("ngpus") == "4"
        assert root.get("name") == "my_algo" and root.get("proto") == "LL128" and root.get("minBytes") == "1024"
        g = root.find("gpu")
        assert (int(g.get("i_chunks")), int(g.get("o_chunks"))) == (i_chunks, o_chunks)


def test_write_and_read_files(tmp_path):
    prog = lower(schedules("ring", 1, n=4)[3])
    path = tmp_path / "sub" / "ar.xml"
    write_msccl(prog, path, unfused=True)
    back = read_msccl(path)
    assert check_program(back) == [] and back.name == "reversed_baseline_+_baseline"
    assert not list(path.parent.glob("*.tmp"))
    with pytest.raises(InputError) as e:
        read_msccl(tmp_path / "missing.xml")
    assert "missing.xml" in e.value.field


def test_export_refuses_bad_options_and_wrong_programs():
    prog = lower(schedules("ring", 1, n=4)[0])
    for kw, field in (({"proto": "Fast"}, "proto"), ({"max_steps_per_tb": 65}, "max_steps_per_tb"), ({"max_tbs_per_channel": 0}, "max_tbs_per_channel")):
        with pytest.raises(InputError) as e:
            to_msccl_xml(prog, **kw)
        assert e.value.field == field
    broken = lower(schedules("ring", 1, n=4)[0])
    next(st for st in broken.gpus[1].steps if st.op == "cpy").dst = ("o", 0)
    with pytest.raises(InputError, match="o\\[1\\] holds nothing"):
        to_msccl_xml(broken)
    with pytest.raises(InputError, match="holds nothing"):
        program_to_schedule(broken)
    selfish = lower(schedules("ring", 1, n=4)[0])
    st = next(st for st in selfish.gpus[0].steps if st.op == "s")
    st.peer = 0
    with pytest.raises(InputError) as e:
        to_msccl_xml(selfish)
    assert e.value.field.endswith(".peer")


# ---------------------------------------------------------------------------------------------
# Hand-written msccl-tools-style algorithms


def step(s, typ, sb="i", so=-1, db="o", do=-1, cnt=1, depid=-1, deps=-1, hasdep=0) -> str:
    return f'<step s="{s}" type="{typ}" srcbuf="{sb}" srcoff="{so}" dstbuf="{db}" dstoff="{do}" cnt="{cnt}" depid="{depid}" deps="{deps}" hasdep="{hasdep}"/>'


def allreduce2(last: str = "r") -> str:
    """2-GPU in-place AllReduce: send the peer's half, reduce own half and send it back (rrcs)."""
    x = '<algo name="ar2" proto="Simple" nchannels="1" nchunksperloop="2" ngpus="2" coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">'
    for g in (0, 1):
        o = 1 - g
        x += f'<gpu id="{g}" i_chunks="2" o_chunks="0" s_chunks="0"><tb id="0" send="{o}" recv="{o}" chan="0">'
        x += step(0, "s", "i", o, "i", o) + step(1, "rrcs", "i", g, "i", g)
        if last != "drop" or g == 0:
            x += step(2, last if g == 1 else "r", "i", o, "i", o)
        x += "</tb></gpu>"
    return x + "</algo>"


def ring_allgather(n: int = 4) -> str:
    """In-place ring AllGather: each GPU's chunk already sits at o[rank]; rcs forwards."""
    x = f'<algo name="ring" proto="LL" nchannels="1" nchunksperloop="{n}" ngpus="{n}" coll="allgather" inplace="1" outofplace="0" minBytes="0" maxBytes="0">\n'
    for g in range(n):
        x += f' <gpu id="{g}" i_chunks="0" o_chunks="{n}" s_chunks="0">\n  <tb id="0" send="{(g + 1) % n}" recv="{(g - 1) % n}" chan="0">\n'
        x += "   " + step(0, "s", "o", g, "o", g) + "\n"
        for k in range(1, n - 1):
            x += "   " + step(k, "rcs", "o", (g - k) % n, "o", (g - k) % n) + "\n"
        x += "   " + step(n - 1, "r", "o", (g + 1) % n, "o", (g + 1) % n) + "\n  </tb>\n </gpu>\n"
    return x + "</algo>\n"


def alltoall2_counts() -> str:
    """2-GPU out-of-place AlltoAll moving whole blocks with cnt=2, a local copy in its own thread
    block, and a receive that waits (through a nop) for both the copy and the send."""
    x = '<algo name="a2a" proto="Simple" nchannels="1" nchunksperloop="4" ngpus="2" coll="alltoall" inplace="0" outofplace="1" minBytes="0" maxBytes="0">'
    for g in (0, 1):
        o = 1 - g
        x += f'<gpu id="{g}" i_chunks="4" o_chunks="4" s_chunks="0">'
        x += f'<tb id="0" send="{o}" recv="-1" chan="0">{step(0, "s", "i", 2 * o, "o", 2 * g, cnt=2, hasdep=1)}</tb>'
        x += f'<tb id="1" send="-1" recv="-1" chan="0">{step(0, "cpy", "i", 2 * g, "o", 2 * g, cnt=2, hasdep=1)}</tb>'
        x += f'<tb id="2" send="-1" recv="{o}" chan="0">{step(0, "nop", depid=1, deps=0)}{step(1, "r", "i", 2 * g, "o", 2 * o, cnt=2, depid=0, deps=0)}</tb>'
        x += "</gpu>"
    return x + "</algo>"


def allpairs_allreduce(n: int = 3) -> str:
    """In-place all-pairs AllReduce as the executor's own ap*.xml do it: receive each peer's
    contribution into scratch, add them with local reductions (re) in a thread block of their own,
    send the sum back."""
    x = f'<algo name="allpairs" proto="LL" nchannels="1" nchunksperloop="{n}" ngpus="{n}" coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">'
    for g in range(n):
        peers = [p for p in range(n) if p != g]
        x += f'<gpu id="{g}" i_chunks="{n}" o_chunks="0" s_chunks="{n - 1}">'
        for k, p in enumerate(peers):
            x += f'<tb id="{k}" send="{p}" recv="{p}" chan="0">'
            x += step(0, "s", "i", p, "s", g - (g > p)) + step(1, "r", "i", g, "s", k, hasdep=1)
            x += step(2, "s", "i", g, "i", g, depid=n - 1, deps=n - 2) + step(3, "r", "i", p, "i", p) + "</tb>"
        x += f'<tb id="{n - 1}" send="-1" recv="-1" chan="0">'
        x += "".join(step(k, "re", "s", k, "i", g, depid=k, deps=1, hasdep=int(k == n - 2)) for k in range(n - 1))
        x += "</tb></gpu>"
    return x + "</algo>"


def multichannel_allgather(n: int = 8, per: int = 4) -> str:
    """In-place AllGather laid out like the executor's ndv5/ag-*.xml: every chunk of a GPU's block
    goes straight to every peer, each chunk on its own channel, one thread block per peer and
    channel (here 8 GPUs, 32 channels, 56 thread blocks per GPU)."""
    order = [0, 2, 1, 3]
    nch = 2 * n + 2 * n

    def chans(g):
        return [2 * g, 2 * g + 1, 2 * n + 2 * g, 2 * n + 2 * g + 1]

    x = f'<algo name="all_gather_llm" proto="LL" nchannels="{nch}" nchunksperloop="{n * per}" ngpus="{n}" coll="allgather" inplace="1" outofplace="0" minBytes="1048576" maxBytes="2097151">\n'
    for g in range(n):
        x += f'  <gpu id="{g}" i_chunks="0" o_chunks="{n * per}" s_chunks="0">\n'
        tb = 0
        for kind in ("recv", "send"):
            for p in (q for q in range(n) if q != g):
                owner = p if kind == "recv" else g
                for j, ch in zip(order, chans(owner), strict=True):
                    send, recv = (-1, p) if kind == "recv" else (p, -1)
                    off = owner * per + j
                    x += f'    <tb id="{tb}" send="{send}" recv="{recv}" chan="{ch}">\n      '
                    x += step(0, "r" if kind == "recv" else "s", "o", off, "o", off) + "\n    </tb>\n"
                    tb += 1
        x += "  </gpu>\n"
    return x + "</algo>\n"


@pytest.mark.parametrize(
    "text",
    [allreduce2(), ring_allgather(4), ring_allgather(3), alltoall2_counts(), allpairs_allreduce(3), allpairs_allreduce(4), multichannel_allgather()],
    ids=["allreduce2-rrcs", "ring-ag4", "ring-ag3", "alltoall2-cnt", "allpairs3-re", "allpairs4-re", "ndv5-style-ag"],
)
def test_msccl_tools_style_algorithms_import_and_verify(text):
    prog = from_msccl_xml(text)
    assert check_program(prog) == []
    assert simulate(program_to_schedule(prog)).valid
    for unfused in (False, True):  # and they export again
        again = from_msccl_xml(to_msccl_xml(prog, unfused=unfused))
        assert check_program(again) == []


def test_wrong_algorithms_are_reported():
    twice = from_msccl_xml(allreduce2(last="rrc"), "ar2.xml")
    with pytest.raises(InputError, match=r"contribution of rank\(s\) 1 .* twice") as e:
        program_to_schedule(twice)
    assert "ar2.xml:gpu[1]/tb[0]/step[2]" in str(e.value)
    with pytest.raises(InputError, match="receives only 1 time") as e:
        from_msccl_xml(allreduce2(last="drop"))
    assert e.value.field == "xml:gpu[0]/tb[0]/step[1]"
    # a ring AllGather that forgets to forward one chunk
    short = ring_allgather(4).replace(step(2, "rcs", "o", 1, "o", 1), step(2, "r", "o", 1, "o", 1), 1)
    with pytest.raises(InputError, match="GPU 3 sends only 2 time"):
        from_msccl_xml(short)


# ---------------------------------------------------------------------------------------------
# Malformed XML: each names the element and attribute at fault


def _mutate(old: str, new: str, text: str | None = None) -> str:
    text = text or alltoall2_counts()
    assert old in text, old
    return text.replace(old, new, 1)


S0 = step(0, "s", "i", 2, "o", 0, cnt=2, hasdep=1)
NOP = step(0, "nop", depid=1, deps=0)
R1 = step(1, "r", "i", 0, "o", 2, cnt=2, depid=0, deps=0)

MALFORMED = [
    ("not-xml", "<algo name='x'", "xml", "not well-formed"),
    ("root", "<gpu/>", "xml", "not <algo>"),
    ("missing-attr", _mutate(' ngpus="2"', ""), "algo.ngpus", "missing"),
    ("coll", _mutate('coll="alltoall"', 'coll="alltoallx"'), "algo.coll", "not an MSCCL collective"),
    ("coll-unsupported", _mutate('coll="alltoall"', 'coll="broadcast"'), "algo.coll", "not supported"),
    ("chunks-per-rank", _mutate('nchunksperloop="4"', 'nchunksperloop="5"'), "algo.nchunksperloop", "multiple of ngpus"),
    ("step-type", _mutate(S0, S0.replace('type="s"', 'type="send"')), "gpu[0]/tb[0]/step[0].type", "not an MSCCL step type"),
    ("re", _mutate('type="cpy"', 'type="re"'), "gpu[0]/tb[1]/step[0]", "no local add"),
    ("bad-number", _mutate(S0, S0.replace('srcoff="2"', 'srcoff="two"')), "gpu[0]/tb[0]/step[0].srcoff", "not an integer"),
    ("offset", _mutate(S0, S0.replace('srcoff="2"', 'srcoff="3"')), "gpu[0]/tb[0]/step[0].srcoff", "outside"),
    ("buffer", _mutate(S0, S0.replace('srcbuf="i"', 'srcbuf="x"')), "gpu[0]/tb[0]/step[0].srcbuf", "not a buffer"),
    ("tb-ids", _mutate('<tb id="2" send="-1" recv="1"', '<tb id="3" send="-1" recv="1"'), "gpu[0]", "thread block 2 is missing"),
    ("step-numbers", _mutate(R1, R1.replace('s="1"', 's="2"')), "gpu[0]/tb[2]/step[1].s", "expected 1"),
    ("self-peer", _mutate('<tb id="0" send="1"', '<tb id="0" send="0"'), "gpu[0]/tb[0].send", "itself"),
    ("unmatched", _mutate('<tb id="0" send="0" recv="-1" chan="0">', '<tb id="0" send="0" recv="-1" chan="1">', _mutate('nchannels="1"', 'nchannels="2"')), "gpu[0]/tb[2]/step[1]", "sends only 0"),
    ("missing-dep-step", _mutate(NOP, NOP.replace('deps="0"', 'deps="4"')), "gpu[0]/tb[2]/step[0].deps", "no step 4"),
    ("missing-dep-tb", _mutate(NOP, NOP.replace('depid="1"', 'depid="7"')), "gpu[0]/tb[2]/step[0].depid", "no thread block 7"),
    ("hasdep", _mutate(S0, S0.replace('hasdep="1"', 'hasdep="0"')), "gpu[0]/tb[0]/step[0].hasdep", "never signals"),
    ("nop-chain", _mutate(R1, R1.replace('depid="0" deps="0"', 'depid="-1" deps="-1"')), "gpu[0]/tb[2]/step[1].depid", "must carry one too"),
    ("race", _mutate(NOP + R1, step(0, "r", "i", 0, "o", 0, cnt=2)), "gpu[0]/tb[2]/step[0]", "race"),
    # GPU 0's send waits for its receive, which waits for the send
    ("deadlock", _mutate(S0, S0.replace('depid="-1" deps="-1"', 'depid="2" deps="1"'), _mutate(R1, R1.replace('hasdep="0"', 'hasdep="1"'))), "gpu[0]/tb", "deadlock"),
    ("cnt-mismatch", _mutate(R1, R1.replace('cnt="2"', 'cnt="1"')), "gpu[0]/tb[2]/step[1].cnt", "matching send"),
]


@pytest.mark.parametrize(("text", "field", "problem"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_xml_names_the_field(text, field, problem):
    with pytest.raises(InputError) as e:
        from_msccl_xml(text)
    assert e.value.field.startswith("xml")
    assert field in e.value.field, e.value
    assert problem in e.value.problem, e.value
    assert e.value.fix
