"""The schedule pictures: a Chrome trace and a link-utilisation PNG, checked against the epoch model.

Hand-built schedules use 1 MB chunks on ring(4)'s 50 GB/s links: one chunk takes 20 us to
transmit. With tau = 15 us a link carries c = 0.75 chunks per epoch, so b = 1: a chunk keeps the
link busy for two epochs at 1 / (0.75 * 2) = 2/3 each and arrives 1 + a + b = 2 epochs after it
is sent (alpha 0.7 us is under a tenth of an epoch, so a = 0). With tau = 40 us, c = 2 and b = 0:
two chunks fit in an epoch, each using half of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest

from flowride.api import synthesize
from flowride.collectives import make_demand
from flowride.errors import InputError
from flowride.schedule import Schedule, Send, simulate
from flowride.schedule.timeline import (
    GPUS_PID,
    LINKS_PID,
    MAX_COLUMNS,
    _received,
    chrome_trace,
    horizon,
    link_name,
    link_utilisation,
    node_name,
    write_png,
    write_trace,
)
from flowride.synth.greedy import baseline_sends
from flowride.topology import ring, switch
from flowride.topology.builtins import build_topology
from flowride.topology.timing import epoch_timing

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MB = 10**6


def make(topo, sends, tau, collective="allgather", chunks=1):
    """Schedule of (epoch, (u, v), source, chunk) sends with 1 MB chunks."""
    demand = make_demand(topo, collective, MB * topo.buffer_ranks * chunks, chunks)
    li = topo.link_index
    return Schedule.from_tuples(topo, demand, tau, [(k, li[uv], s, c) for k, uv, s, c in sends])


@cache
def synthesized(name: str, collective: str, epoch: str = "fast", **kw) -> Schedule:
    return synthesize(build_topology(name, **kw), collective, MB, epoch=epoch).schedule


SYNTHESIZED = [
    ("ring", "allgather", "fast", {"n": 4}),
    ("ring", "alltoall", "fast", {"n": 4}),
    ("dgx1", "allgather", "fast", {}),
    ("dgx1", "allgather", "slow", {}),  # NVLink pairs with two links: c = 2 on those
    ("dgx1", "alltoall", "fast", {}),
    ("switch", "allgather", "fast", {"n": 4}),  # GPU -> switch -> GPU, cut-through hops
]


def schedules():
    return [
        pytest.param(synthesized(n, c, e, **kw), id=f"{n}-{c}-{e}") for n, c, e, kw in SYNTHESIZED
    ]


def x_events(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def named_tracks(trace, pid):
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }


# --------------------------------------------------------------------------- Chrome trace
@pytest.mark.parametrize("sched", schedules())
def test_trace_names_one_track_per_link_and_per_gpu(sched):
    topo = sched.topology
    trace = chrome_trace(sched)
    assert trace["displayTimeUnit"] == "ns"
    assert named_tracks(trace, LINKS_PID) == {
        li: link_name(topo, li) for li in range(len(topo.links))
    }
    assert named_tracks(trace, GPUS_PID) == {g: node_name(topo, g) for g in topo.gpus}
    procs = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert procs == {LINKS_PID: "links", GPUS_PID: "gpus"}
    order = {
        (e["pid"], e["tid"]): e["args"]["sort_index"]
        for e in trace["traceEvents"]
        if e["name"] == "thread_sort_index"
    }
    assert [order[(LINKS_PID, li)] for li in range(len(topo.links))] == list(range(len(topo.links)))
    assert [order[(GPUS_PID, g)] for g in topo.gpus] == list(range(len(topo.gpus)))
    # every timed event sits on a named track
    named = {(LINKS_PID, t) for t in named_tracks(trace, LINKS_PID)} | {
        (GPUS_PID, t) for t in named_tracks(trace, GPUS_PID)
    }
    assert all((e["pid"], e["tid"]) in named for e in trace["traceEvents"] if e["ph"] != "M")


@pytest.mark.parametrize("sched", schedules())
def test_trace_has_one_slice_per_send_and_tracks_nest(sched):
    trace = chrome_trace(sched)
    xs = x_events(trace)
    assert len(xs) == len(sched.sends)
    assert sorted(
        (e["args"]["epoch"], e["tid"], e["args"]["source"], e["args"]["chunk"]) for e in xs
    ) == sorted((s.epoch, s.link, s.source, s.chunk) for s in sched.sends)
    assert all(e["pid"] == LINKS_PID and e["tid"] == e["args"]["link"] and e["dur"] > 0 for e in xs)
    timing = sched.timing
    assert all(
        e["args"]["arrival_epoch"] == timing.arrival(e["tid"], e["args"]["epoch"]) for e in xs
    )
    # trace viewers need the slices of one track to nest; a valid schedule's never overlap
    by_track: dict[int, list] = {}
    for e in xs:
        by_track.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(spans, spans[1:], strict=False))
    # a receive instant on the GPU track for every send into a GPU
    recvs = [e for e in trace["traceEvents"] if e["ph"] == "i" and e["name"].startswith("recv ")]
    into_gpu = [
        s for s in sched.sends if sched.topology.nodes[sched.topology.links[s.link].dst].is_gpu
    ]
    assert len(recvs) == len(into_gpu)
    json.dumps(trace, allow_nan=False)


def test_trace_slice_by_hand():
    """tau 15 us, c 0.75: a chunk sent in epoch 2 is on the link 30..50 us and held at 60 us."""
    topo = ring(4)
    sched = make(topo, [(0, (0, 1), 0, 0), (2, (1, 2), 0, 0)], tau=15e-6)
    assert simulate(sched).valid is False  # only part of an AllGather; drawing does not care
    trace = chrome_trace(sched)
    (x,) = [e for e in x_events(trace) if e["args"]["epoch"] == 2]
    li = topo.link_index[(1, 2)]
    assert (x["pid"], x["tid"], x["name"], x["cat"]) == (LINKS_PID, li, "chunk (0,0)", "copy")
    assert x["ts"] == pytest.approx(30.0) and x["dur"] == pytest.approx(20.0)
    assert x["args"] == {
        "epoch": 2,
        "link": li,
        "source": 0,
        "chunk": 0,
        "reduce": False,
        "arrival_epoch": 4,
        "arrival_us": pytest.approx(60.0),
    }
    recv = [
        e for e in trace["traceEvents"] if e["ph"] == "i" and e["tid"] == 2 and e["pid"] == GPUS_PID
    ]
    assert [(e["name"], e["ts"]) for e in recv] == [("recv chunk (0,0)", pytest.approx(60.0))]
    sent = [
        e
        for e in trace["traceEvents"]
        if e["ph"] == "i" and e["tid"] == 1 and e["name"].startswith("send")
    ]
    assert [(e["name"], e["ts"]) for e in sent] == [("send chunk (0,0)", pytest.approx(30.0))]
    assert named_tracks(trace, LINKS_PID)[li] == "GPU1->GPU2"
    assert trace["otherData"]["epochs"] == 4


def test_trace_lays_chunks_sharing_an_epoch_end_to_end():
    """tau 40 us, c 2: two chunks on one link in one epoch take 0..20 and 20..40 us."""
    sched = make(ring(4), [(1, (0, 1), 0, 0), (1, (0, 1), 3, 0)], tau=40e-6)
    xs = sorted(x_events(chrome_trace(sched)), key=lambda e: e["ts"])
    assert [(e["name"], e["ts"], e["dur"]) for e in xs] == [
        ("chunk (0,0)", pytest.approx(40.0), pytest.approx(20.0)),
        ("chunk (3,0)", pytest.approx(60.0), pytest.approx(20.0)),
    ]


@dataclass(frozen=True)
class ReduceSend(Send):
    """A Send with the optional ``reduce`` flag, whether or not Send itself has it yet."""

    reduce: bool = True


def test_trace_marks_reductions():
    topo = ring(4)
    sched = make(topo, [], tau=20e-6)
    li = topo.link_index[(0, 1)]
    sched.sends = [ReduceSend(0, li, 0, 0)]
    (x,) = x_events(chrome_trace(sched))
    assert (x["name"], x["cat"], x["args"]["reduce"]) == ("reduce chunk (0,0)", "reduce", True)
    assert link_utilisation(sched)[li, 0] == pytest.approx(1.0)


def test_write_trace_round_trips(tmp_path):
    sched = synthesized("dgx1", "allgather", "fast")
    path = tmp_path / "sub" / "trace.json"
    write_trace(sched, path)
    assert json.loads(path.read_text()) == json.loads(json.dumps(chrome_trace(sched)))
    assert [p.name for p in path.parent.iterdir()] == ["trace.json"]  # no temp file left


def test_switch_tracks_are_named_by_node_kind():
    topo = switch(3)
    names = {link_name(topo, li) for li in range(len(topo.links))}
    assert "GPU0->switch3" in names and "switch3->GPU2" in names


# --------------------------------------------------------------------------- utilisation
@pytest.mark.parametrize("sched", schedules())
def test_utilisation_of_valid_schedules_stays_within_capacity(sched):
    assert simulate(sched).valid
    u = link_utilisation(sched)
    timing = sched.timing
    assert u.shape == (len(sched.topology.links), horizon(sched))
    assert u.min() >= 0 and u.max() <= 1 + 1e-9
    # each chunk uses 1/c epochs of its link: the row sums give back the sends per link
    per_link = np.bincount([s.link for s in sched.sends], minlength=len(sched.topology.links))
    np.testing.assert_allclose(u.sum(axis=1) * timing.cap_per_epoch, per_link, atol=1e-9)


def test_utilisation_by_hand_slow_link():
    """c 0.75, b 1: 2/3 in the send epoch and the next; back to back keeps the link at 2/3."""
    topo = ring(4)
    li = topo.link_index[(0, 1)]
    sched = make(topo, [(0, (0, 1), 0, 0), (2, (0, 1), 3, 0), (5, (1, 2), 0, 0)], tau=15e-6)
    u = link_utilisation(sched)
    assert u.shape == (len(topo.links), 7)  # last arrival: 5 + 2
    np.testing.assert_allclose(u[li], [2 / 3, 2 / 3, 2 / 3, 2 / 3, 0, 0, 0])
    np.testing.assert_allclose(u[topo.link_index[(1, 2)]], [0, 0, 0, 0, 0, 2 / 3, 2 / 3])
    assert u.sum() == pytest.approx(3 * 4 / 3)
    np.testing.assert_allclose(link_utilisation(sched, epochs=3)[li], [2 / 3, 2 / 3, 2 / 3])


def test_utilisation_by_hand_fast_link_and_overload():
    """c 2: one chunk is half an epoch, two fill it, three overfill it (an invalid schedule)."""
    topo = ring(4)
    li = topo.link_index[(0, 1)]
    sched = make(
        topo,
        [
            (0, (0, 1), 0, 0),
            (1, (0, 1), 0, 0),
            (1, (0, 1), 3, 0),
            (2, (0, 1), 0, 0),
            (2, (0, 1), 3, 0),
            (2, (0, 1), 2, 0),
        ],
        tau=40e-6,
    )
    np.testing.assert_allclose(link_utilisation(sched)[li], [0.5, 1.0, 1.5])


def test_received_counts_first_arrivals_by_epoch_end():
    topo = ring(4)
    sched = make(topo, [(0, (0, 1), 0, 0), (2, (1, 2), 0, 0), (3, (2, 1), 0, 0)], tau=15e-6)
    gpus, held = _received(sched, horizon(sched))
    assert gpus == [0, 1, 2, 3]
    # GPU 1 holds (0,0) from the start of epoch 2 (= the end of epoch 1); the copy back from
    # GPU 2 does not count twice. GPU 2 holds it from epoch 4.
    np.testing.assert_array_equal(held, [[0] * 5, [0, 1, 1, 1, 1], [0, 0, 0, 1, 1], [0] * 5])


# --------------------------------------------------------------------------- PNG
def test_png_written_atomically(tmp_path):
    sched = synthesized("dgx1", "allgather", "slow")
    path = tmp_path / "out" / "timeline.png"
    write_png(sched, path, title="dgx1 allgather")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000
    assert [p.name for p in path.parent.iterdir()] == ["timeline.png"]


def test_png_of_an_overfull_schedule_and_of_many_epochs(tmp_path):
    """An invalid schedule still draws (over-full cells in red); more epochs than MAX_COLUMNS are
    binned rather than dropped."""
    topo = ring(4)
    bad = make(topo, [(0, (0, 1), 0, 0), (0, (0, 1), 3, 0)], tau=20e-6)
    write_png(bad, tmp_path / "bad.png")
    assert (tmp_path / "bad.png").read_bytes().startswith(PNG_MAGIC)

    topo = ring(8)
    demand = make_demand(topo, "allgather", MB * 8 * 100, 100)
    timing = epoch_timing(topo, demand.chunk_bytes, "fast")
    _, sends = baseline_sends(topo, demand, timing)
    big = Schedule.from_tuples(topo, demand, timing.tau, sends)
    assert horizon(big) > MAX_COLUMNS
    write_png(big, tmp_path / "big.png")
    assert (tmp_path / "big.png").read_bytes().startswith(PNG_MAGIC)


# --------------------------------------------------------------------------- edge cases
def test_empty_schedule_draws_nothing_without_crashing(tmp_path):
    topo = ring(4)
    sched = make(topo, [], tau=20e-6)
    assert horizon(sched) == 0
    assert link_utilisation(sched).shape == (len(topo.links), 0)
    trace = chrome_trace(sched)
    assert x_events(trace) == [] and len(named_tracks(trace, LINKS_PID)) == len(topo.links)
    write_trace(sched, tmp_path / "empty.json")
    write_png(sched, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").read_bytes().startswith(PNG_MAGIC)


def test_sends_that_cannot_be_placed_are_input_errors():
    sched = make(ring(4), [], tau=20e-6)
    sched.sends = [Send(0, 99, 0, 0)]
    with pytest.raises(InputError, match=r"sends\[0\].*link 99"):
        chrome_trace(sched)
    sched.sends = [Send(-1, 0, 0, 0)]
    with pytest.raises(InputError, match="negative epoch"):
        link_utilisation(sched)
