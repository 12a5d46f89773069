"""Size sweeps the nccl-tests way and MSCCL export per size range (issue #18, parts 2 and 3).

The size-range parser (nccl-tests' -b/-e/-f/-i and --sizes), nccl-tests' bus-bandwidth factors
and size/count conventions, #wrong counted element by element, warm-started synthesis sweeps that
never end with more epochs than cold ones, and range exports whose XMLs tile the sizes without gap
or overlap, pass the executor-rule check and say in their attributes what ranges.json says. The
CLI is driven end to end: ``synth`` then ``run -b/-e/-f --json``, ``synth --sizes``, ``export``; and the review fixes:
empty lists refused, plain tables when piped, ranges split on --max-loss, stale XMLs and relays refused up
front, swept sizes that pass both executor chunking rules, ReduceScatter/AlltoAll/AllReduce exports.
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
from flowride.cli import main
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
from flowride.sweep import (
    export_unit,
    nccl_protocol,
    plan_ranges,
    split_by_loss,
    synthesize_sweep,
    write_ranges,
)
from flowride.synth.options import SynthOptions
from flowride.topology.builtins import dgx1, ring
from flowride.units import MAX_SWEEP_SIZES, parse_size_list, parse_sweep_size, sweep_sizes
from synth_helpers import refused_here

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
    """One run end to end (four ranks of torch.distributed: the costly part, so once): its --json
    rows and --report agree and are nccl-tests' columns; the same rows make the plain table a pipe
    gets (the CLI's choice of the plain form is checked on synth and export below)."""
    from types import SimpleNamespace

    from flowride.cli.sweep import run_sweep_table

    sched, rep = tmp_path / "ring4.json", tmp_path / "rows.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-c", "allgather", "-s", "64KB", "-o", str(sched)]) == 0
    r = cli("run", sched, "-b", "1KB", "-e", "64KB", "-f", "4", "--json", "--repeats", "1", "--report", rep, timeout=150)
    assert r.code == 0, r.err[-3000:]
    rows = json.loads(r.out)
    assert json.loads(rep.read_text())["rows"] == rows
    assert [x["size"] for x in rows] == [992, 4000, 16000, 64000]  # 1000 B: 248 floats, rounded down to 4 ranks
    for x in rows:
        assert RUN_FIELDS <= set(x) and x["type"] == "float" and x["redop"] == "none"
        assert x["count"] == x["size"] // 4 // 4 and x["wrong"] == 0 and x["torch_wrong"] == 0
        for who in ("", "torch_"):
            assert x[f"{who}algbw_GBps"] == pytest.approx(x["size"] / (x[f"{who}time_us"] * 1e-6) / 1e9)
            assert x[f"{who}busbw_GBps"] == pytest.approx(x[f"{who}algbw_GBps"] * 3 / 4)
    text = run_sweep_table([SimpleNamespace(**x) for x in rows], "allgather", 4).plain()
    assert "…" not in text
    heads = [ln.split() for ln in text.splitlines() if ln.startswith("#")]
    assert heads[2][1:] == ["size", "count", "type", "redop"] + ["time", "algbw", "busbw", "#wrong"] * 2, heads
    assert "flowride" in heads[1] and "torch.distributed" in heads[1] and "CPU" in heads[0]
    table = [ln.split() for ln in text.splitlines() if ln.startswith("  ")]
    assert [x[:4] for x in table] == [[str(x["size"]), str(x["count"]), "float", "none"] for x in rows]
    assert all(len(x) == 12 and x[7] == "0" and x[11] == "0" for x in table), table


def test_cli_synth_sweep(tmp_path, capsys):
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
    assert_clean_error(cli("synth", "-t", "ring", "--n", "4", "-b", "1K", "-e", "8"), 2, "-e/--maxbytes", within=20)
    refused_here(capsys, ["synth", "-t", "ring", "--n", "4", "--sizes", "1K:1G:+1"], "--sizes")
    refused_here(capsys, ["synth", "-t", "ring", "--n", "4"], "--size")


def test_cli_export_ranges(tmp_path, capsys):
    r = cli("export", "-t", "ring", "--n", "4", "-c", "allgather", "--sizes", "1KB:4MB:x4", "--out-dir", tmp_path)
    assert r.code == 0, r.err
    assert "minBytes" in r.out and "protocol" in r.out.lower()
    _check_ranges(tmp_path)
    refused_here(capsys, ["export", "-t", "ring", "--n", "4", "--sizes", "1KB:4KB"], "--out-dir")
    refused_here(capsys, ["export", "-t", "ring", "--n", "4", "--sizes", "1KB:4KB", "--out-dir", tmp_path, "--chunk-options", "0"],
                 "--chunk-options")


# ---- review fixes: empty lists, plain tables, loss-bounded ranges, stale XMLs, relays, executor rules ----

def test_plan_ranges_refuses_empty_lists():
    for kw, field in (({"epochs": ()}, "epochs"), ({"chunk_options": ()}, "chunks"), ({"max_loss": 0.9}, "max_loss")):
        with pytest.raises(InputError) as e:
            plan_ranges(ring(4), "allgather", [4000], **kw)
        assert e.value.field == field and e.value.fix


@pytest.mark.parametrize("args, option", [
    (("--epochs", ","), "--epochs"),
    (("--epochs", ""), "--epochs"),
    (("--chunk-options", ","), "--chunk-options"),
    (("-c", "broadcast"), "--collective"),
    (("--max-loss", "0.5"), "--max-loss"),
])
def test_cli_export_refuses_bad_lists_cleanly(tmp_path, capsys, args, option):
    """In this process (export's refusals end to end: test_cli_export_refuses_relays_up_front)."""
    refused_here(capsys, ["export", "-t", "ring", "--n", "4", "--sizes", "1KB", "--out-dir", tmp_path / "x", *args], option)
    assert not (tmp_path / "x" / "xml").exists()


@given(count=st.integers(1, 9), seed=st.integers(0, 2**32 - 1), max_loss=st.floats(1.0, 1.5))
def test_split_by_loss_keeps_every_size_within_the_tolerance(count, seed, max_loss):
    """Whatever the losses, the runs tile 0..count-1 in order, each served by one of its own
    members, and that member's loss at every member of its run is at most max_loss; a run ends
    only where no member could serve it grown by one."""
    import random

    rnd = random.Random(seed)
    table = {(j, i): (1.0 if i == j else rnd.choice([1.0, 1.0 + rnd.random() * 0.6, math.inf])) for j in range(count) for i in range(count)}
    runs = split_by_loss(count, lambda j, i: table[(j, i)], max_loss)
    assert [a for a, *_ in runs] == [0] + [b + 1 for _, b, *_ in runs[:-1]] and runs[-1][1] == count - 1
    for a, b, j, worst in runs:
        assert a <= j <= b
        losses = [table[(j, i)] for i in range(a, b + 1)]
        assert max(losses) == pytest.approx(worst) and worst <= max_loss * (1 + 1e-9)
    for (a, b, *_), _next in zip(runs, runs[1:], strict=False):  # greedy: growing the run by one would break it
        assert not any(all(table[(j, i)] <= max_loss for i in range(a, b + 2)) for j in range(a, b + 2))


def test_range_schedules_are_within_max_loss_at_every_size(monkeypatch):
    """One candidate and one protocol on dgx1, so merging on the pick alone puts every size in one
    range, whose schedule is more than 2% slower at some size (the old behaviour); split on loss,
    the written schedule, retimed to each size of its range, is within max_loss of that size's own."""
    import flowride.sweep.ranges as ranges
    from flowride.api import retimed
    from flowride.collectives.demand import make_demand

    swept: dict = {}
    real = ranges.synthesize_sweep

    def once(topo, coll, sizes, chunks, opts, progress, warm_start, nccl=True):  # both plans sweep the same (untimed)
        key = (coll, tuple(sizes), chunks, opts, warm_start, nccl)
        if key not in swept:
            swept[key] = real(topo, coll, sizes, chunks, opts, progress, warm_start, nccl=nccl)
        return swept[key]

    monkeypatch.setattr(ranges, "synthesize_sweep", once)
    topo, sizes = dgx1(), [128000, 256000, 512000, 1024000]
    loose = plan_ranges(topo, "allgather", sizes, chunk_options=(4,), proto="LL", max_loss=100)
    assert len(loose.ranges) == 1 and loose.ranges[0].worst_loss > 1.02
    plan = plan_ranges(topo, "allgather", sizes, chunk_options=(4,), proto="LL", max_loss=1.02)
    own = {p.size: p.point.outcome for p in plan.picks}
    assert len(plan.ranges) > 1 and [s for r in plan.ranges for s in r.sizes] == sizes
    for r in plan.ranges:
        assert r.worst_loss <= 1.02 and r.from_size in r.sizes
        for s in r.sizes:
            o = own[s]
            got = retimed(topo, r.schedule, make_demand(topo, "allgather", s, r.schedule.chunks), o.schedule.tau, "")
            assert got is not None and got.epochs * o.schedule.tau <= 1.02 * o.finish_time_s * (1 + 1e-9), (r.sizes, s)


def _executor_rules_hold(rj: dict) -> None:
    """Both of the executor's chunking tests at every swept size: the older count % nchunksperloop
    (count per rank) and the newer (count * sizeMultiplier) % nchunksperloop."""
    n, coll = rj["gpus"], Collective.parse(rj["collective"])
    mult = 1 if coll is Collective.ALLREDUCE else n
    for r in rj["ranges"]:
        loop = r["chunks"] * n
        for s in r["sizes"]:
            count = s // 4 // mult
            assert s % 4 == 0 and count % loop == 0 and (count * mult) % loop == 0, (s, count, loop)


@pytest.mark.parametrize("coll", ["reducescatter", "alltoall", "allreduce"])
def test_range_export_other_collectives(tmp_path, coll):
    plan = plan_ranges(ring(4), coll, [1000, 64000, 2_000_000], chunk_options=(1, 2), opts=SynthOptions(time_limit=5.0))
    write_ranges(plan, tmp_path)
    ranges = _check_ranges(tmp_path, plan)
    assert sum(len(r["sizes"]) for r in ranges) == 3
    rj = json.loads((tmp_path / "ranges.json").read_text())
    _executor_rules_hold(rj)
    assert all(r["worst_loss"] <= rj["max_loss"] for r in ranges)


def test_export_sizes_pass_both_executor_rules():
    # dgx1, chunks 1,2,4: 1KB rounded to n*C elements gave 896 B, per-rank count 28, which the older rule refuses for 32
    assert run_bytes(1000, 8, export_unit("allgather", 8, 4)) == 1024
    assert export_unit("allreduce", 8, 4) == 4 and export_unit("alltoall", 8, 4) == 32
    plan = plan_ranges(ring(4), "allgather", [1000, 5000], chunk_options=(1, 2, 4))
    _executor_rules_hold(plan.as_dict())


def test_cli_export_refuses_stale_xml_then_cleans(tmp_path, capsys):
    out = tmp_path / "algos"
    base = ("export", "-t", "ring", "--n", "4", "-c", "allgather", "--chunk-options", "1,2", "--out-dir", out)
    r = cli(*base, "--sizes", "1KB,1MB")
    assert r.code == 0, r.err
    first = sorted(p.name for p in (out / "xml").iterdir())
    line = refused_here(capsys, [*base, "--sizes", "4KB,4MB"], "--out-dir", first[0], "--clean")
    assert "xml" in line
    assert sorted(p.name for p in (out / "xml").iterdir()) == first  # nothing touched
    r = cli(*base, "--sizes", "4KB,4MB", "--clean")
    assert r.code == 0, r.err
    ranges = _check_ranges(out)  # only the new XMLs are left in xml/
    assert [s for rg in ranges for s in rg["sizes"]] == [3968, 4000000]
    (out / "xml" / "notes.txt").write_text("mine")
    refused_here(capsys, [*base, "--sizes", "4KB", "--clean"], "--out-dir", "notes.txt")
    assert (out / "xml" / "notes.txt").exists() and len(list((out / "xml").glob("*.xml"))) == len(ranges)


def test_cli_export_refuses_relays_up_front(tmp_path):
    # ranks 0 and 2 of a 4-ring are not linked: with --relay on, GPUs 1 and 3 forward
    r = cli("export", "-t", "ring", "--n", "4", "--ranks", "0,2", "--relay", "on", "--sizes", "1KB,1MB", "--out-dir", tmp_path)
    assert_clean_error(r, 2, "--relay", "export needs --relay off", within=20)
    assert not (tmp_path / "xml").exists()


def test_cli_sweep_tables_are_whole_when_piped(tmp_path):
    """stdout is a pipe (not a terminal), at 80 columns: nccl-tests' plain layout, every header
    and every size intact, one line per size."""
    narrow = {"COLUMNS": "80"}
    r = cli("synth", "-t", "ring", "--n", "4", "-c", "reducescatter", "--sizes", "1KB,64KB,4MB", env=narrow)
    assert r.code == 0, r.err
    assert "…" not in r.out and "warm start: off (reductions run cold)" in r.out
    heads = " ".join(ln for ln in r.out.splitlines() if ln.startswith("#"))
    for h in ("size", "(B)", "count", "(elements)", "type", "redop", "epoch", "time", "(us)", "algbw", "busbw", "runtime", "NCCL",
              "error", "speedup", "synthesis", "bound",
              "ratio", "epochs", "chunks", "method", "status"):
        assert h in heads.split(), h
    rows = [ln.split() for ln in r.out.splitlines() if ln.startswith("  ")]
    assert [row[0] for row in rows] == ["992", "64000", "4000000"]
    for row in rows:
        assert row[1] == str(int(row[0]) // 16) and row[2:4] == ["float", "sum"] and len(row) >= 13
    r = cli("export", "-t", "ring", "--n", "4", "--chunk-options", "1", "--sizes", "1KB,4MB", "--out-dir", tmp_path, env=narrow)
    assert r.code == 0, r.err
    assert "…" not in r.out
    for h in ("minBytes", "maxBytes", "file", "chunks", "epochs", "protocol", "swept sizes", "worst loss"):
        assert h in r.out, h
    assert "allgather_4gpus_0-3999999.xml" in r.out and "3.94MB" not in r.out.replace("4MB", "")


def test_cli_synth_refuses_size_with_a_sweep():
    assert_clean_error(cli("synth", "-t", "ring", "--n", "4", "-s", "64MB", "--sizes", "1KB,2KB"), 2, "--size", "sweep", within=20)


def test_cli_run_memory_error_names_the_option_used(tmp_path, capsys):
    """One refusal end to end, the others through ``main`` in this process."""
    sched = tmp_path / "ring4.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-c", "allgather", "-s", "64KB", "--chunks", "1", "-o", str(sched)]) == 0
    assert_clean_error(cli("run", sched, "-b", "1K", "-e", "1T", "-f", "32"), 2, "-e/--maxbytes", "bytes per rank need", within=30)
    refused_here(capsys, ["run", sched, "-b", "1T"], "-b/--minbytes", within=30)
    refused_here(capsys, ["run", sched, "--sizes", "1KB,1T"], "--sizes", within=30)


def test_run_result_algbw_is_the_metrics_one():
    from flowride.comm.result import RunResult

    res = RunResult("allgather", 4, "p", 1000, 992, 62, 1, 62, 1, 0, ours_s=[2e-6])
    assert res.report()["algbw_GBps"] == algbw_GBps(992, 2e-6) and res.algbw_GBps(None) is None


def test_sweep_table_both_forms():
    import io

    from rich.console import Console

    from flowride.cli import export as cli_export
    from flowride.cli.sweep import SweepTable
    from flowride.sweep import DEFAULT_MAX_LOSS

    assert cli_export.DEFAULT_MAX_LOSS == DEFAULT_MAX_LOSS  # the parser's default is the library's
    t = SweepTable("t [x]", [("", "size", "(B)"), ("", "type", ""), ("ours", "time", "(us)"), ("ours", "#wrong", "")])
    t.add_row(123456789, "float", "1.50", 0)
    t.add_row(8, "float", "N/A", 3)
    lines = t.plain().splitlines()
    assert lines[0] == "# t [x]" and lines[1].split() == ["#", "ours"] and lines[2].split() == ["#", "size", "type", "time", "#wrong"]
    assert lines[4] == "  123456789  float  1.50       0" and lines[5] == "          8  float   N/A       3"
    buf = io.StringIO()
    Console(file=buf, width=200, force_terminal=True, color_system=None).print(t.rich())
    out = buf.getvalue()
    assert "t [x]" in out and "123456789" in out and "#wrong" in out and "ours" in out


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: sweep_sizes("8", "1G", "inf"), "inf is not a finite number"),
    (lambda: parse_size_list("8:1G:xnan"), "nan is not a finite number"),
    (lambda: sweep_sizes("8", "1G", "1.0000000001"), "187,149,723,276 steps"),
    (lambda: parse_size_list("8:1G:x1.0000000001"), "over the limit"),
])
def test_sweep_ranges_that_cannot_end_are_refused_before_the_loop(call, needle):
    with pytest.raises(InputError, match=needle):
        call()
    assert sweep_sizes("8", "9", "1.001") == [8, 9]  # a factor near 1 over a short range still works
