"""Size sweeps the nccl-tests way and MSCCL export per size range (issue #18, parts 2 and 3).

The size-range parser (nccl-tests' -b/-e/-f/-i and --sizes), nccl-tests' bus-bandwidth factors
and size/count conventions, #wrong counted element by element, warm-started synthesis sweeps that
never end with more epochs than cold ones, and range exports whose XMLs tile the sizes without gap
or overlap, pass the executor-rule check and say in their attributes what ranges.json says. The
CLI is driven end to end: ``synth`` then ``run -b/-e/-f --json``, ``synth --sizes``, ``export``.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from clirun import assert_clean_error, cli
from flowride.collectives.demand import Collective
from flowride.comm.data import count_wrong, elements_per_chunk, expected_chunks
from flowride.errors import InputError
from flowride.program import check_program, from_msccl_xml
from flowride.schedule.metrics import (
    algbw_GBps,
    busbw_factor,
    busbw_GBps,
    nccl_count,
    redop,
    run_bytes,
)
from flowride.sweep import nccl_protocol, plan_ranges, synthesize_sweep, write_ranges
from flowride.topology.builtins import dgx1, ring
from flowride.units import MAX_SWEEP_SIZES, parse_size_list, parse_sweep_size, sweep_sizes

pytestmark = pytest.mark.timeout(120)
KIB, MIB, GIB = 2**10, 2**20, 2**30


# ---- the size-range parser ----

def test_nccl_tests_options_give_nccl_tests_sizes():
    # all_gather_perf -b 8 -e 1G -f 2: 8, 16, ..., 2^30 (K/M/G are powers of 1024 in nccl-tests)
    got = sweep_sizes("8", "1G", "2")
    assert got == [8 * 2**k for k in range(28)] and got[-1] == GIB
    assert sweep_sizes("1K", "4K", stepbytes="1K") == [1024, 2048, 3072, 4096]  # -i: additive
    assert sweep_sizes("1K", "4K", "1", "1K") == [1024, 2048, 3072, 4096]  # nccl-tests: -f 1 means "use -i"
    assert sweep_sizes("64KB") == [64000]  # -e defaults to -b
    assert sweep_sizes("1KB", "1MB") == [1000 * 2**k for k in range(10)]  # no step: x2; KB, MB decimal
    assert sweep_sizes() is None  # no sweep option: a single-size command


def test_sizes_forms():
    assert parse_size_list("8B:1GB:x2")[:3] == [8, 16, 32] and parse_size_list("8B:1GB:x2")[-1] <= 10**9
    assert parse_size_list("1KB:64KB:x4") == [1000, 4000, 16000, 64000]
    assert parse_size_list("1KB:4KB:+1KB") == [1000, 2000, 3000, 4000]
    assert parse_size_list("1KiB:4KiB") == [1024, 2048, 4096]  # MIN:MAX means x2
    assert parse_size_list("16KB, 1KB,1KB,4K") == [1000, 4096, 16000]  # a list: sorted, no repeats
    assert parse_sweep_size("1M", "x") == MIB and parse_sweep_size("1MB", "x") == 10**6


@pytest.mark.parametrize("kw, field", [
    ({"minbytes": "1K", "maxbytes": "8"}, "-e/--maxbytes"),
    ({"minbytes": "8", "maxbytes": "1G", "stepfactor": "1"}, "-f/--stepfactor"),
    ({"minbytes": "8", "maxbytes": "1G", "stepfactor": "0.5"}, "-f/--stepfactor"),
    ({"minbytes": "8", "maxbytes": "1G", "stepfactor": "two"}, "-f/--stepfactor"),
    ({"minbytes": "8", "maxbytes": "1G", "stepfactor": "2", "stepbytes": "1K"}, "-i/--stepbytes"),
    ({"minbytes": "8", "maxbytes": "1G", "stepbytes": "1M"}, "-b/--minbytes .. -e/--maxbytes"),  # 1024 sizes > 64
    ({"maxbytes": "1G"}, "-b/--minbytes"),
    ({"minbytes": "0"}, "-b/--minbytes"),
    ({"minbytes": "8", "sizes": "1KB:2KB"}, "--sizes"),
    ({"sizes": "1KB:2KB:x1"}, "--sizes"),
    ({"sizes": "2KB:1KB"}, "--sizes"),
    ({"sizes": "1KB:2KB:y2"}, "--sizes"),
    ({"sizes": "1:2:3:4"}, "--sizes"),
    ({"sizes": "1B:1GB:+1B"}, "--sizes"),
    ({"sizes": ""}, "--sizes"),
])
def test_range_errors_name_the_option(kw, field):
    with pytest.raises(InputError) as e:
        sweep_sizes(**kw)
    assert e.value.field == field and e.value.fix


@given(lo=st.integers(1, 10**9), span=st.integers(0, 10**9), factor=st.floats(1.01, 100), step=st.integers(1, 10**8),
       additive=st.booleans())
def test_sweeps_are_sorted_bounded_and_capped(lo, span, factor, step, additive):
    hi = lo + span
    try:
        got = sweep_sizes(str(lo), str(hi), None if additive else repr(factor), str(step) if additive else None)
    except InputError as e:
        assert "more than" in e.problem  # the only refusal of a well-formed range: too many sizes
        return
    assert got[0] == lo and all(lo <= s <= hi for s in got) and got == sorted(set(got)) and len(got) <= MAX_SWEEP_SIZES


# ---- nccl-tests' columns ----

@pytest.mark.parametrize("n", [2, 3, 4, 8, 16, 64])
def test_busbw_factors_are_nccl_tests(n):
    # NVIDIA/nccl-tests doc/PERFORMANCE.md, "Summary"
    assert busbw_factor(Collective.ALLREDUCE, n) == pytest.approx(2 * (n - 1) / n)
    for coll in (Collective.REDUCESCATTER, Collective.ALLGATHER, Collective.ALLTOALL):
        assert busbw_factor(coll, n) == pytest.approx((n - 1) / n)
    # busbw = algbw * factor, algbw = S / t (decimal GB/s)
    assert busbw_GBps("allreduce", n, 8 * 10**9, 2.0) == pytest.approx(4.0 * 2 * (n - 1) / n)
    assert algbw_GBps(10**9, 0.5) == pytest.approx(2.0)


def test_count_and_redop_columns():
    assert nccl_count("allreduce", 8, 4096) == 1024  # the buffer
    assert nccl_count("allgather", 8, 4096) == 128  # per rank (sendcount)
    assert nccl_count("reducescatter", 8, 4096) == 128  # per rank (recvcount)
    assert nccl_count("alltoall", 8, 4096) == 128  # per peer
    assert [redop(c) for c in Collective] == ["none", "none", "sum", "sum"]


@given(size=st.integers(1, 10**8), n=st.integers(2, 64), c=st.sampled_from([1, 2, 3, 4, 8]))
def test_sweep_rounding_is_what_a_run_runs(size, n, c):
    """The sweep's rounding and the worker's element count agree: whole float32 elements, a
    multiple of n*C, at least one per chunk; never more than asked unless below that minimum."""
    got = run_bytes(size, n, c)
    assert got == elements_per_chunk(Collective.ALLGATHER, n, c, size) * 4 * n * c
    assert got % (4 * n * c) == 0 and (got <= size or got == 4 * n * c)


def test_wrong_elements_are_counted_one_by_one():
    n, c, rank, elems = 4, 2, 1, 50
    for coll in Collective:
        want = [v for _, _, v in expected_chunks(coll, n, c, rank, elems)]
        out = torch.cat(want).clone()
        assert count_wrong(out, coll, n, c, rank, elems) == 0
        out[3] += 1
        out[-1] = -1.0
        out[elems:elems + 7] = 12345.0
        assert count_wrong(out, coll, n, c, rank, elems) == 9


# ---- warm-started synthesis sweeps ----

@pytest.mark.parametrize("topo, coll, spec, chunks", [
    (ring(4), "allgather", "1KB:1MB:x4", 1),
    (dgx1(), "allgather", "1KB:64MB:x8", 1),
    (dgx1(), "allgather", "16KB:16MB:x8", 2),
    (dgx1(), "alltoall", "1KB:4MB:x8", 1),
])
def test_warm_start_never_ends_later_than_cold(topo, coll, spec, chunks):
    sizes = parse_size_list(spec)
    cold = synthesize_sweep(topo, coll, sizes, chunks, warm_start=False)
    warm = synthesize_sweep(topo, coll, sizes, chunks)
    assert [p.size_bytes for p in cold] == [p.size_bytes for p in warm]
    for c, w in zip(cold, warm, strict=True):
        assert w.outcome.sim.valid and w.outcome.sim.epochs <= c.outcome.sim.epochs, (w.size_bytes, w.outcome.sim.epochs, c.outcome.sim.epochs)
    assert not warm[0].warm and all(p.warm for p in warm[1:])
    row = warm[-1].row()
    n = len(topo.gpus)
    assert row["size"] == warm[-1].size_bytes and row["count"] == row["size"] // 4 // n
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * (n - 1) / n)


# ---- MSCCL per size range ----

def _check_ranges(d: Path, plan=None) -> list[dict]:
    rj = json.loads((d / "ranges.json").read_text())
    ranges = rj["ranges"]
    assert ranges[0]["min_bytes"] == 0 and ranges[-1]["max_bytes"] == 0  # from 0, open at the top
    for a, b in zip(ranges, ranges[1:], strict=False):
        assert a["max_bytes"] + 1 == b["min_bytes"] and a["min_bytes"] <= a["max_bytes"]  # no gap, no overlap (both ends inclusive)
    for r in ranges:
        text = (d / r["file"]).read_text()
        root = ET.fromstring(text)
        assert (int(root.get("minBytes")), int(root.get("maxBytes"))) == (r["min_bytes"], r["max_bytes"])
        assert root.get("proto") == r["proto"] and int(root.get("nchunksperloop")) == r["chunks"] * rj["gpus"]
        prog = from_msccl_xml(text, r["file"])
        assert check_program(prog) == []
        assert all(r["min_bytes"] <= s and (r["max_bytes"] == 0 or s <= r["max_bytes"]) for s in r["sizes"])
    assert sorted(p.name for p in (d / "xml").iterdir()) == sorted(Path(r["file"]).name for r in ranges)  # nothing else for MSCCL to load
    if plan is not None:
        assert [r.min_bytes for r in plan.ranges] == [r["min_bytes"] for r in ranges]
    return ranges


def test_range_export_tiles_the_sizes(tmp_path):
    plan = plan_ranges(ring(4), "allgather", parse_size_list("1KB:16MB:x4"))
    swept = [p.size for p in plan.picks]
    assert swept == sorted(swept)
    for p in plan.picks:  # the pick is the fastest candidate the model found at that size
        assert p.times_us[p.pick.label] == pytest.approx(min(p.times_us.values()))
    write_ranges(plan, tmp_path)
    ranges = _check_ranges(tmp_path, plan)
    assert sum(len(r["sizes"]) for r in ranges) == len(swept)
    assert (tmp_path / "ranges.md").read_text().count("\n| ") == len(ranges) + 1


def test_protocol_rule_goes_ll_ll128_simple():
    order = {"LL": 0, "LL128": 1, "Simple": 2}
    for coll in Collective:
        got = [order[nccl_protocol(coll, 8, 2**k, 150.0)] for k in range(4, 34)]
        assert got == sorted(got) and got[0] == 0 and got[-1] == 2


# ---- the CLI, end to end ----

RUN_FIELDS = {"size", "count", "type", "redop", "time_us", "algbw_GBps", "busbw_GBps", "wrong", "torch_time_us",
              "torch_algbw_GBps", "torch_busbw_GBps", "torch_wrong"}


def test_cli_run_sweep_prints_nccl_tests_rows(tmp_path):
    sched = tmp_path / "ring4.json"
    r = cli("synth", "-t", "ring", "--n", "4", "-c", "allgather", "-s", "64KB", "-o", sched)
    assert r.code == 0, r.err
    r = cli("run", sched, "-b", "1KB", "-e", "64KB", "-f", "4", "--json", "--repeats", "2", timeout=150)
    assert r.code == 0, r.err[-3000:]
    rows = json.loads(r.out)
    assert [x["size"] for x in rows] == [992, 4000, 16000, 64000]  # 1000 B: 248 floats, rounded down to 4 ranks
    for x in rows:
        assert RUN_FIELDS <= set(x) and x["type"] == "float" and x["redop"] == "none"
        assert x["count"] == x["size"] // 4 // 4 and x["wrong"] == 0 and x["torch_wrong"] == 0
        for who in ("", "torch_"):
            assert x[f"{who}algbw_GBps"] == pytest.approx(x["size"] / (x[f"{who}time_us"] * 1e-6) / 1e9)
            assert x[f"{who}busbw_GBps"] == pytest.approx(x[f"{who}algbw_GBps"] * 3 / 4)
    r = cli("run", sched, "--sizes", "4KB,16KB", "--repeats", "1", timeout=150)  # the table
    assert r.code == 0 and "#wrong" in r.out and "torch.distributed" in r.out and "busbw" in r.out, r.out


def test_cli_synth_sweep(tmp_path):
    r = cli("synth", "-t", "ring", "--n", "4", "-c", "allgather", "--sizes", "1KB:64KB:x4", "--json", "--out-dir", tmp_path / "s")
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    assert [x["size"] for x in rows] == [992, 4000, 16000, 64000]
    for x in rows:
        assert {"size", "count", "type", "redop", "time_us", "algbw_GBps", "busbw_GBps", "lower_bound_us", "ratio_to_lower_bound",
                "epochs", "chunks", "method", "status"} <= set(x)
        assert x["time_us"] >= x["lower_bound_us"] * (1 - 1e-9) and math.isclose(x["ratio_to_lower_bound"], x["time_us"] / x["lower_bound_us"])
    assert len(list((tmp_path / "s").glob("*.json"))) == 4
    r = cli("synth", "-t", "ring", "--n", "4", "-b", "1K", "-e", "16K", "-f", "4")
    assert r.code == 0 and "busbw" in r.out and "warm start" in r.out, r.out
    assert_clean_error(cli("synth", "-t", "ring", "--n", "4", "-b", "1K", "-e", "8"), 2, "-e/--maxbytes")
    assert_clean_error(cli("synth", "-t", "ring", "--n", "4", "--sizes", "1K:1G:+1"), 2, "--sizes")
    assert_clean_error(cli("synth", "-t", "ring", "--n", "4"), 2, "--size")


def test_cli_export_ranges(tmp_path):
    r = cli("export", "-t", "ring", "--n", "4", "-c", "allgather", "--sizes", "1KB:4MB:x4", "--out-dir", tmp_path)
    assert r.code == 0, r.err
    assert "minBytes" in r.out and "protocol" in r.out.lower()
    _check_ranges(tmp_path)
    assert_clean_error(cli("export", "-t", "ring", "--n", "4", "--sizes", "1KB:4KB"), 2, "--out-dir")
    assert_clean_error(cli("export", "-t", "ring", "--n", "4", "--sizes", "1KB:4KB", "--out-dir", tmp_path, "--chunk-options", "0"),
                       2, "--chunk-options")
