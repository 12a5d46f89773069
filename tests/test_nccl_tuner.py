"""``flowride export --nccl-tuner``: the CSV NCCL's example tuner plugin reads, its ranges, and the
checker that reads a CSV by the plugin's rules (NVIDIA/nccl plugins/tuner/example/plugin.c)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.sweep import (
    Choice,
    SizeChoice,
    TunerPlan,
    TunerRange,
    check_tuner_csv,
    parse_tuner_csv,
    plan_tuner,
    side_table_path,
    tile,
    tuner_collectives,
    write_tuner,
)
from flowride.sweep.nccl_tuner_rules import ALGORITHMS, COLLECTIVES, COLUMNS, PROTOCOLS, SIZE_MAX
from flowride.topology import dgx1
from flowride.topology.fabrics import build_fabric

SIZES = [1024 * 4**k for k in range(8)]  # 1 KiB .. 16 MiB


@pytest.fixture(scope="module")
def dgx1_plan() -> TunerPlan:
    return plan_tuner(dgx1(), "allgather,allreduce", SIZES)


@pytest.fixture(scope="module")
def fabric_plan() -> TunerPlan:
    return plan_tuner(build_fabric("dgx-h100", 2), ["allreduce"], SIZES)


# ---- ranges ----

def test_tile_covers_zero_to_max_and_merges_equal_neighbours():
    assert tile([10, 20, 30, 40], "aabb") == [(0, 29, 0, 1), (30, SIZE_MAX, 2, 3)]
    assert tile([5], "x") == [(0, SIZE_MAX, 0, 0)]
    assert tile([1, 2, 3], "aba", top=100) == [(0, 1, 0, 0), (2, 2, 1, 1), (3, 100, 2, 2)]
    with pytest.raises(InputError):
        tile([2, 1], "ab")
    with pytest.raises(InputError):
        tile([1, 2], "a")


@given(st.lists(st.tuples(st.integers(1, 2**40), st.sampled_from("abc")), min_size=1, max_size=40, unique_by=lambda t: t[0]))
def test_tile_property_exact_cover_no_overlap(pairs):
    pairs.sort()
    sizes, keys = [s for s, _ in pairs], [k for _, k in pairs]
    ranges = tile(sizes, keys)
    assert ranges[0][0] == 0 and ranges[-1][1] == SIZE_MAX
    for (lo, hi, a, b), nxt in zip(ranges, ranges[1:] + [None], strict=True):
        assert lo <= hi
        if nxt:
            assert nxt[0] == hi + 1  # no gap, no overlap
            assert keys[b] != keys[nxt[2]]  # merged as far as the key allows
        assert len(set(keys[a:b + 1])) == 1
        assert all(lo <= s <= hi for s in sizes[a:b + 1])
    assert [i for _, _, a, b in ranges for i in range(a, b + 1)] == list(range(len(sizes)))


@given(st.lists(st.sampled_from([(("ring", "ll", 4), ("ring", "ll")), (("tree", "simple", 12), ("ring", "ll128")),
                                  (("ring", "simple", 4), ("ring", "simple")), (("ring", "ll128", 4), ("nvls_tree", "simple"))]),
                min_size=1, max_size=30))
def test_written_csv_passes_the_checker_for_any_choices(choices):
    sizes = [2**k for k in range(len(choices))]
    plan = TunerPlan("t", 16, 2, ["allreduce"], sizes)
    picks = [SizeChoice(s, Choice(*o), 1.0, "simulated", Choice(*d), 1.5, 2.0, 3.0) for s, (o, d) in zip(sizes, choices, strict=True)]
    for lo, hi, a, b in tile(sizes, [p.key for p in picks]):
        plan.ranges.append(TunerRange("allreduce", lo, hi, picks[a:b + 1]))
    text = plan.csv("t.md")
    assert check_tuner_csv(text, tiled=True) == []
    rows, kept, _ = parse_tuner_csv(text)
    assert len(rows) == sum(p.differs for p in picks[:1]) + sum(
        q.differs and q.key != p.key for p, q in zip(picks, picks[1:], strict=False))
    assert len(rows) + len(kept) == len(plan.ranges)


# ---- the plan ----

def _check_plan(plan: TunerPlan) -> None:
    for coll in plan.collectives:
        rs = [r for r in plan.ranges if r.collective == coll]
        assert rs[0].min_bytes == 0 and rs[-1].max_bytes == SIZE_MAX
        assert all(b.min_bytes == a.max_bytes + 1 for a, b in zip(rs, rs[1:], strict=False))
        assert sorted(s.size for r in rs for s in r.sizes) == plan.sizes
    rows = plan.rows
    assert len(rows) == sum(r.differs for r in plan.ranges)
    for row in rows:
        assert row.collective in COLLECTIVES and row.algorithm in ALGORITHMS and row.protocol in PROTOCOLS
        assert (row.nnodes, row.nranks, row.num_pipe_ops, row.reg_buff) == (plan.nodes, plan.gpus, -1, -1)
        assert row.channels > 0  # never -1: the example plugin would make that one channel
    for r in plan.ranges:
        for s in r.sizes:
            assert s.differs == r.differs
            if s.differs:  # a row only where flowride's model beats NCCL's default in flowride's model
                assert s.speedup is not None and s.speedup > 1


def test_dgx1_plan_ranges_and_rows(dgx1_plan):
    _check_plan(dgx1_plan)
    assert (dgx1_plan.gpus, dgx1_plan.nodes) == (8, 1)
    assert check_tuner_csv(dgx1_plan.csv(), tiled=True) == []


def test_two_node_fabric_disagrees_on_allreduce(fabric_plan):
    _check_plan(fabric_plan)
    assert (fabric_plan.gpus, fabric_plan.nodes) == (16, 2)
    assert fabric_plan.disagreements("allreduce") >= 1  # NCCL's model: tree / NVLS-tree; flowride's simulated ring
    assert {r.nccl.algorithm for r in fabric_plan.ranges if r.differs} <= {"tree", "nvls_tree", "ring"}
    text = fabric_plan.csv()
    assert check_tuner_csv(text, tiled=True) == []
    rows, _, findings = parse_tuner_csv(text)
    assert findings == [] and [r for _, r in rows] == fabric_plan.rows
    assert rows[0][1].line().startswith("allreduce,0,") and rows[0][1].line().endswith(",8,2,16,-1,-1")


def test_rows_only_where_choices_differ():
    def sc(size, ours, nccl):
        return SizeChoice(size, Choice(*ours), 1.0, "simulated", Choice(*nccl), 2.0, 3.0, 4.0)
    same, other = ("ring", "ll", 4), ("tree", "ll", 12)
    plan = TunerPlan("t", 8, 1, ["allreduce"], [1, 2, 3])
    for lo, hi, a, b in tile([1, 2, 3], ["k", "d", "k"]):
        picks = [sc(1, same, ("ring", "ll")), sc(2, other, ("ring", "ll")), sc(3, same, ("ring", "ll"))]
        plan.ranges.append(TunerRange("allreduce", lo, hi, picks[a:b + 1]))
    assert [r.line() for r in plan.rows] == ["allreduce,2,2,tree,ll,12,1,8,-1,-1"]
    text = plan.csv()
    assert "# nccl-default,allreduce,0,1,1,8,ring,ll" in text and "# nccl-default,allreduce,3,18446744073709551615,1,8" in text
    assert check_tuner_csv(text, tiled=True) == []
    md = plan.markdown("t.csv")
    assert "| allreduce | 2..2 |" in md and "2.00x faster" in md


def test_collectives_refused_with_the_fix():
    assert tuner_collectives(None) == ["allgather", "reducescatter", "allreduce"]
    assert tuner_collectives("AllReduce, allgather,allreduce") == ["allreduce", "allgather"]
    for bad, needle in (("alltoall", "grouped sends"), ("broadcast", "does not model"), ("gather", "unknown"), (",", "no collective")):
        with pytest.raises(InputError, match=needle):
            tuner_collectives(bad)


def test_write_is_checked_and_sits_beside(tmp_path, dgx1_plan):
    csv_path, md = write_tuner(dgx1_plan, tmp_path / "tuner.conf")
    assert md == side_table_path(csv_path) == tmp_path / "tuner.conf.md"
    text = csv_path.read_text()
    assert check_tuner_csv(text, tiled=True) == [] and "tuner.conf.md" in text
    assert all(len(line) <= 254 for line in text.splitlines())
    assert "# NCCL tuner overrides for dgx1" in md.read_text()


# ---- the checker: each kind of bad file ----

GOOD = "allreduce,0,1023,ring,ll,4,2,16,-1,-1\nallreduce,1024,18446744073709551615,tree,simple,8,2,16\n"


def kinds(text: str, tiled: bool | None = None) -> list[str]:
    return [f.kind for f in check_tuner_csv(text, tiled)]


def test_checker_accepts_good_and_plugin_examples():
    assert kinds(GOOD, tiled=True) == []
    plugin_example = ("# comment\n\nallreduce,0,65536,tree,simple,2,1,-1,-1,1\nallreduce,65537,1048576,ring,simple,4,4,32,1,0\n"
                      "broadcast,0,32768,tree,simple,-1,1,-1\n")
    assert kinds(plugin_example) == ["channels"]  # its broadcast row: -1 is one channel in the plugin as written


@pytest.mark.parametrize("text, kind", [
    ("allreduce,0,100,ring,ll,4,2,16\nallreduce,50,200,tree,ll,4,2,-1\n", "overlap"),
    ("allreduce,0,100,ring,ll,4,2,16\nallreduce,200,18446744073709551615,tree,ll,4,2,16\n", "gap"),
    ("allreduce,0,100,ring,ll,4,2\n", "fields"),
    ("allreduce,0,100,ring,ll,4,2,16,-1,-1,7\n", "fields"),
    ("allreduce,0,100,,ring,ll,4,2,16\n", "empty-field"),
    ("alltoall,0,100,ring,ll,4,2,16\n", "collective"),
    ("allreduce,0,100,RING,ll,4,2,16\n", "algorithm"),
    ("allreduce,0,100,ring,LL128,4,2,16\n", "protocol"),
    ("allreduce,0,1e3,ring,ll,4,2,16\n", "number"),
    ("allreduce,0,100,ring,ll,4,2,16,-1,2\n", "number"),
    ("allreduce,0,100,ring,ll,0,2,16\n", "number"),
    ("allreduce,0,100,ring,ll,-1,2,16\n", "channels"),
    ("allreduce,100,0,ring,ll,4,2,16\n", "range"),
    (",".join(COLUMNS) + "\n", "header"),
    ("  # indented\n", "indent"),
    ("allreduce,0,100,ring,ll,4,2,16\r\n", "carriage-return"),
    ("# " + "x" * 300 + "\n", "line-length"),
])
def test_checker_catches(text, kind):
    assert kind in kinds(text, tiled=True if kind == "gap" else None)


def test_checker_tiling_is_declared_or_asked_for():
    partial = "allreduce,0,100,ring,ll,4,2,16\n"
    assert kinds(partial) == [] and kinds(partial, tiled=False) == []  # a hand-written override
    assert kinds(partial, tiled=True) == ["gap"]
    declared = partial + "# nccl-default,allreduce,101,18446744073709551615,2,16,tree,ll\n"
    assert kinds(declared) == []
    assert kinds(partial + "# nccl-default,allreduce,200,18446744073709551615,2,16\n") == ["gap"]
    assert kinds(partial + "# nccl-default,allreduce,50,18446744073709551615,2,16\n") == ["overlap"]


# ---- the command ----

def test_cli_export_on_two_node_fabric(tmp_path):
    out = tmp_path / "tuner.csv"
    r = cli("export", "--nccl-tuner", out, "-t", "fabric", "--node", "dgx-h100", "--nodes", "2", "-c", "allreduce",
            "--sizes", "1K:4M:x4", timeout=120)
    assert r.code == 0, r.err[-2000:]
    assert "row(s) written to" in r.out and "allreduce" in r.out and "NCCL_TUNER_CONFIG_FILE" in r.out
    text = out.read_text()
    assert check_tuner_csv(text, tiled=True) == []
    rows, _, _ = parse_tuner_csv(text)
    assert rows and all(row.nnodes == 2 and row.nranks == 16 for _, row in rows)
    assert "| allreduce |" in (tmp_path / "tuner.csv.md").read_text()


def test_cli_export_dgx1_default_collectives(tmp_path):
    out = tmp_path / "t.conf"
    r = cli("export", "--nccl-tuner", out, "-t", "dgx1", "-b", "1K", "-e", "64K", "-f", "8", timeout=120)
    assert r.code == 0, r.err[-2000:]
    text = out.read_text()
    assert check_tuner_csv(text, tiled=True) == []
    for coll in ("allgather", "reducescatter", "allreduce"):
        assert coll in r.out and f",{coll}," in "," + text.replace("# nccl-default,", ",")


@pytest.mark.parametrize("args, needles", [
    (("--nccl-tuner", "{d}/x.csv"), ("--topology", "-t dgx1")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "-c", "alltoall"), ("--collective", "alltoall")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "-c", "allgather,bcast"), ("--collective", "bcast")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "--msccl", "{d}/a.xml"), ("--msccl", "--nccl-tuner")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "--out-dir", "{d}"), ("--out-dir",)),
    (("--nccl-tuner", "{d}/none/x.csv", "-t", "dgx1"), ("--nccl-tuner",)),
])
def test_cli_errors(tmp_path, args, needles):
    r = cli("export", *(a.format(d=tmp_path) for a in args), timeout=60)
    assert_clean_error(r, 2, *needles, within=30)
