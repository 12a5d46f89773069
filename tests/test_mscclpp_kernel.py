"""MSCCL++ plans held to what the executor's kernel does with each op's entries (issue #50):
``execution_kernel.hpp`` at microsoft/mscclpp 1f5f065d, docs/mscclpp.md. A fan (``put``,
``pws``, ``pwsf``, ``ppkt`` to several peers) reads destination k's source from ``src_buff[k]``;
``copy``, ``upkt`` and ``cpkt`` move entry 0 only; ``get`` reads the peer at the destination
entry's index and writes at the source entry's. Plans that worked only under flowride's former
reading (one source for a whole fan, every entry of a copy, ``get`` read like ``put``) fail."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowride.program import lower, parse_plan, to_mscclpp
from flowride.program.mscclpp_exec import run_plan
from flowride.program.mscclpp_rules import FANS, check_rules
from flowride.topology.builtins import build_topology
from flowride.topology.fabrics import build_fabric
from test_mscclpp import _any_schedule
from test_properties import topologies

COLLS = ["allgather", "alltoall", "reducescatter", "allreduce"]


def _ops(obj: dict):
    for g in obj["gpus"]:
        for tb in g["threadblocks"]:
            yield from tb["ops"]


def _fans(obj: dict) -> list[dict]:
    return [op for op in _ops(obj) if op["name"] in FANS and len(op.get("dst_buff", [])) > 1]


def _judge(obj: dict) -> tuple[list[str], list[str]]:
    plan = parse_plan(json.loads(json.dumps(obj)))
    return check_rules(plan), run_plan(plan).problems


def _one_source_fewer(obj: dict) -> tuple[dict, str]:
    """The plan with the last source entry of its first fan removed (flowride's former writing)."""
    bad = copy.deepcopy(obj)
    op = _fans(bad)[0]
    op["src_buff"].pop()
    return bad, op["name"]


@pytest.mark.parametrize(("name", "coll"), [("dgx1", "allgather"), ("dgx1", "allreduce"), ("dgx-h100 x2", "allgather")])
@pytest.mark.parametrize("proto", ["Simple", "LL"])
def test_written_fans_carry_a_source_per_destination_and_one_fewer_fails(name, coll, proto):
    """The plans the issue found wrong (dgx1 AllGather and AllReduce, two DGX H100 AllGather, 1 MiB,
    both protocols; packed trees, untimed): every fan now names one source per destination, the
    plan keeps the rules and the run proves the collective; the same plan with one source entry
    fewer is refused by the rules, naming the op, and the symbolic run, following the kernel, does
    not compute it."""
    from flowride.api import synthesize

    topo = build_fabric("dgx-h100", 2) if name == "dgx-h100 x2" else build_topology(name)
    sched = synthesize(topo, coll, 1 << 20, "fast", 2, None, method="trees", nccl=False).schedule
    obj = to_mscclpp(lower(sched), topo, proto=proto, within_limits=False)
    fans = _fans(obj)
    assert fans, "these schedules send one chunk to several peers at once"
    assert all(len(op["src_buff"]) == len(op["dst_buff"]) for op in _ops(obj) if op["name"] in FANS)
    assert _judge(obj) == ([], [])
    bad, op_name = _one_source_fewer(obj)
    found, problems = _judge(bad)
    assert any(f"{op_name} has" in f and "src_buff entr" in f and "src_buff[k]" in f for f in found), found
    assert problems and any("src_buff[k]" in p for p in problems), problems


@settings(max_examples=20, deadline=None)
@given(topo=topologies(max_gpus=4), coll=st.sampled_from(COLLS), proto=st.sampled_from(["Simple", "LL"]),
       chunks=st.sampled_from([1, 2]))
def test_every_written_op_names_a_source_per_destination(topo, coll, proto, chunks):
    """On any topology, collective and protocol: each fan's source entries match its destinations,
    each copy-like op has one entry a side; where a fan exists, one source fewer is refused."""
    obj = to_mscclpp(lower(_any_schedule(topo, coll, chunks)), topo, proto=proto, within_limits=False)
    for op in _ops(obj):
        if op["name"] in FANS:
            assert len(op["src_buff"]) == len(op["dst_buff"])
        if op["name"] in ("copy", "upkt", "cpkt"):
            assert len(op["src_buff"]) == len(op["dst_buff"]) == 1
    if _fans(obj):
        found, _ = _judge(_one_source_fewer(obj)[0])
        assert any("src_buff[k]" in f for f in found)


# ---- one plan per handler, written here ---------------------------------------------------


def _two_gpu_allgather(ops_of) -> dict:
    """An out-of-place AllGather on 2 GPUs, one chunk each, one thread block per GPU whose ops are
    ``ops_of(r, peer)``; a memory channel each way and the peer's input as remote buffer 0."""
    gpus = []
    for r in range(2):
        p = 1 - r
        gpus.append({"id": r, "input_chunks": 1, "output_chunks": 2, "scratch_chunks": 0,
                     "threadblocks": [{"id": 0, "ops": ops_of(r, p),
                                       "channels": [{"channel_type": "memory", "channel_ids": [0]}],
                                       "remote_buffer_refs": [{"access_channel_type": "memory", "remote_buffer_ids": [0]}]}],
                     "channels": [{"channel_type": "memory", "connected_to": [p]}],
                     "remote_buffers": [{"rank": p, "type": "i", "access_channel_types": ["memory"]}], "semaphores": []})
    return {"name": "get_allgather", "collective": "allgather", "protocol": "Simple", "inplace": False, "reuse_resources": False,
            "num_threads_per_block": 1024, "use_double_scratch_buffer": False, "buffer_alignment": 16,
            "min_message_size": 0, "max_message_size": 1 << 30, "gpus": gpus}


def _own(r: int) -> dict:
    return {"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}], "dst_buff": [{"type": "o", "index": r, "size": 1}]}


def test_get_reads_the_peer_at_the_destination_index_and_writes_at_the_source_index():
    """handleGet: local(dst.type) + src.index <- remote(src.buffer) + dst.index. GPU r gets the
    peer's input chunk 0 into its output slot ``peer``: as the kernel reads it, src_buff names the
    peer's buffer with the *local* slot, dst_buff the local buffer with the *peer's* index."""
    def kernel_reading(r, p):
        return [_own(r), {"name": "get", "src_buff": [{"buffer_id": 0, "index": p, "size": 1}],
                          "dst_buff": [{"type": "o", "index": 0, "size": 1}], "channel_type": "memory", "channel_ids": [0]}]

    def put_like_reading(r, p):  # what flowride read before: the source's index on the peer, the destination's here
        return [_own(r), {"name": "get", "src_buff": [{"buffer_id": 0, "index": 0, "size": 1}],
                          "dst_buff": [{"type": "o", "index": p, "size": 1}], "channel_type": "memory", "channel_ids": [0]}]

    assert _judge(_two_gpu_allgather(kernel_reading)) == ([], [])
    found, problems = _judge(_two_gpu_allgather(put_like_reading))
    assert found or problems  # GPU 0 would read the peer's input at index 1, beyond its one chunk
    assert any("src_buff[0]" in f and "lie outside" in f for f in found), found


def test_a_copy_of_two_entries_moves_entry_zero_only():
    """handleCopy moves entry 0: a copy naming both the own chunk and a second entry leaves the
    second unmoved; the rules say so, and the run finds the output incomplete."""
    def two_entries(r, p):
        return [{"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}, {"type": "i", "index": 0, "size": 1}],
                 "dst_buff": [{"type": "o", "index": r, "size": 1}, {"type": "o", "index": p, "size": 1}]}]

    obj = _two_gpu_allgather(two_entries)
    found = check_rules(parse_plan(obj))
    assert any("copy names 2 src_buff and 2 dst_buff entries" in f and "entry 0 only" in f for f in found), found
    problems = run_plan(parse_plan(obj)).problems
    assert problems  # slot `peer` of each output never written: not the AllGather


def test_verify_labels_the_times_it_prints(tmp_path, capsys):
    """A plan carries no topology: `verify` times it on a generic full mesh and says so; a schedule
    JSON is timed on its own topology and says that."""
    from flowride.api import synthesize
    from flowride.cli import main

    topo = build_topology("dgx1")
    out = synthesize(topo, "allgather", 1 << 20, "fast", 2, None, method="trees", nccl=False)
    (tmp_path / "p.json").write_text(json.dumps(to_mscclpp(lower(out.schedule), topo, within_limits=False)))
    out.schedule.save(tmp_path / "s.json")
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "p.json")]) == 0
    assert "times modelled on a generic full mesh of its GPUs" in " ".join(capsys.readouterr().out.split())
    assert main(["verify", str(tmp_path / "s.json")]) == 0
    assert "times modelled on its own topology" in " ".join(capsys.readouterr().out.split())


def test_more_channels_one_way_are_accepted_as_mscclpp_pairs_them():
    """MSCCL++ makes the missing channels on the side that declares fewer (getUnpairedChannelInfos)
    and pairs them in order per peer, so an extra channel one way loads and the plan runs; a signal
    sent into it has no wait on the other side (none of that side's ops can name it): refused."""
    from test_mscclpp import _unpaired_channel, mutated

    extra = mutated(_unpaired_channel)
    assert _judge(extra) == ([], [])
    used = copy.deepcopy(extra)
    g0 = used["gpus"][0]
    tb = g0["threadblocks"][0]
    k = len(g0["channels"][0]["connected_to"]) - 1  # GPU 0's extra memory channel
    tb["channels"][0]["channel_ids"].append(k)
    tb["ops"].append({"name": "signal", "channel_ids": [len(tb["channels"][0]["channel_ids"]) - 1], "channel_type": "memory"})
    found, _ = _judge(used)
    assert any("every signal needs its wait" in f for f in found), found
