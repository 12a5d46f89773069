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
from flowride.sweep.nccl_tuner import apply_tuner_csv, choose
from flowride.sweep.nccl_tuner_rules import (
    ALGORITHMS,
    COLLECTIVES,
    COLUMNS,
    PROTOCOLS,
    SIZE_MAX,
    TunerRow,
    match_row,
    plugin_channels,
)
from flowride.topology import dgx1
from flowride.topology.fabrics import build_fabric
from synth_helpers import refused_here

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
def test_cli_errors(tmp_path, capsys, args, needles):
    """The first end to end in a subprocess, the others through ``main`` in this process."""
    argv = [a.format(d=tmp_path) for a in args]
    if len(argv) == 2:
        assert_clean_error(cli("export", *argv, timeout=60), 2, *needles, within=30)
    else:
        refused_here(capsys, ["export", *argv], *needles, within=30)


# ---- the CSV applied the way the plugin applies it ----

def test_match_row_is_the_plugins_first_usable_match():
    rows = [TunerRow("allreduce", 0, 99, "tree", "ll", 4, 2, 16), TunerRow("allreduce", 0, 1000, "ring", "ll128", 8, -1, -1),
            TunerRow("allgather", 100, 100, "ring", "simple", -1, 2, 16, 3, 1)]
    assert match_row(rows, "allreduce", 99, 2, 16) is rows[0]  # both ends inclusive, first match wins
    assert match_row(rows, "allreduce", 100, 2, 16) is rows[1]
    assert match_row(rows, "allreduce", 5, 4, 32) is rows[1]  # -1: any nNodes, nRanks
    assert match_row(rows, "allreduce", 1001, 2, 16) is None
    assert match_row(rows, "reducescatter", 5, 2, 16) is None
    assert match_row(rows, "allgather", 100, 2, 16) is None  # numPipeOps 3 and regBuff 1 asked for
    assert match_row(rows, "allgather", 100, 2, 16, num_pipe_ops=3, reg_buff=1) is rows[2]
    # a row NCCL's cost table ignores is passed over, and the search goes on
    assert match_row(rows, "allreduce", 5, 2, 16, usable={("ring", "ll128")}) is rows[1]
    assert match_row(rows, "allreduce", 5, 2, 16, usable=lambda a, p: a == "nvls") is None
    parsed, _, _ = parse_tuner_csv("\n".join(r.line() for r in rows) + "\n")
    assert match_row(parsed, "allreduce", 100, 2, 16) == rows[1]  # (line, row) pairs as parse_tuner_csv gives them
    assert [plugin_channels(r) for r in (rows[0], rows[2], None)] == [4, 1, 1]  # -1 and no row: one channel


def _assert_never_slower(plan: TunerPlan) -> list:
    applied = apply_tuner_csv(plan, plan.csv())
    assert len(applied) == len(plan.sizes) * len(plan.collectives)
    for a in applied:
        assert a.ratio is not None, a  # flowride's model times both the applied choice and NCCL's default
        assert a.ratio <= 1 + 1e-12, a
        [s] = [s for r in plan.ranges if r.collective == a.collective for s in r.sizes if s.size == a.size]
        assert (a.row is None) == (not s.differs)  # a row exactly where the picks differ, and it is the pick
        assert (a.choice.algorithm, a.choice.protocol) == (s.ours.algorithm, s.ours.protocol)
        assert a.est_ratio is not None and a.est_ratio >= 1 - 1e-12  # NCCL's model: its default is its least
    return applied


def test_applied_csv_never_slower_on_real_plans(dgx1_plan, fabric_plan):
    for plan in (dgx1_plan, fabric_plan):
        applied = _assert_never_slower(plan)
        assert sum(a.row is not None for a in applied) == sum(plan.disagreements(c) for c in plan.collectives)
    assert any(a.ratio < 1 for a in apply_tuner_csv(fabric_plan, fabric_plan.csv()))


PAIRS = [(a, p) for a in ("ring", "tree", "nvls_tree", "pat") for p in ("LL", "LL128", "Simple")]


@given(st.lists(st.tuples(st.dictionaries(st.sampled_from(PAIRS), st.floats(1.0, 1e4), min_size=1),
                          st.dictionaries(st.sampled_from(PAIRS), st.floats(1.0, 1e4)),
                          st.dictionaries(st.sampled_from(PAIRS), st.sampled_from([1, 4, 8, 12]))), min_size=1, max_size=12))
def test_applied_csv_never_slower_for_any_plan_the_export_writes(points):
    """For any times the two models give (flowride's model times every pair NCCL's offers, and may
    time more), the CSV the export writes, applied like the plugin, is never slower than NCCL's
    default at any swept size in flowride's model."""
    plan = TunerPlan("t", 16, 2, ["allreduce", "allgather"], [1024 * 2**k for k in range(len(points))])
    for coll in plan.collectives:
        picks = []
        for size, (est, extra, chans) in zip(plan.sizes, points, strict=True):
            ours = {k: (extra.get(k, t * 1.3), "simulated", chans.get(k, 8)) for k, t in est.items()}
            ours.update({k: (t, "simulated", 8) for k, t in extra.items() if k not in ours})  # pairs NCCL's table ignores
            picks.append(choose(size, ours, est))
        plan.add(coll, picks)
    assert check_tuner_csv(plan.csv(), tiled=True) == []
    _assert_never_slower(plan)


def test_pick_is_one_nccl_can_run():
    # regression: a pair flowride's model times but NCCL's cost table ignores (here NVLS across
    # nodes) made a row the plugin passes over, while the side table claimed its speedup
    est = {("ring", "LL"): 20.0, ("ring", "Simple"): 30.0}
    ours = {("ring", "LL"): (18.0, "simulated", 8), ("ring", "Simple"): (15.0, "simulated", 8), ("nvls", "Simple"): (5.0, "simulated", 1)}
    s = choose(4096, ours, est)
    assert (s.ours.algorithm, s.ours.protocol, s.nccl.algorithm, s.nccl.protocol) == ("ring", "simple", "ring", "ll")
    assert s.usable == {("ring", "ll"), ("ring", "simple")} and s.times[("nvls", "simple")] == (5.0, None, 1)


def test_applied_row_with_another_channel_count_is_untimed():
    est = {("ring", "LL"): 20.0, ("tree", "LL"): 10.0}
    s = choose(1024, {("ring", "LL"): (5.0, "simulated", 8), ("tree", "LL"): (9.0, "tuning model", 12)}, est)
    plan = TunerPlan("t", 16, 2, ["allreduce"], [1024])
    plan.add("allreduce", [s])
    [a] = apply_tuner_csv(plan, "allreduce,0,18446744073709551615,ring,ll,8,2,16\n")
    assert a.ratio == pytest.approx(5 / 9) and a.est_ratio == pytest.approx(2.0)
    [b] = apply_tuner_csv(plan, "allreduce,0,18446744073709551615,ring,ll,-1,2,16\n")  # one channel: not what was timed
    assert b.us is None and b.ratio is None and b.choice.channels == 1
    [c] = apply_tuner_csv(plan, "allreduce,0,18446744073709551615,nvls,simple,4,2,16\n")  # ignored by NCCL: its default
    assert c.row is None and c.ratio == 1.0
    # regression: a -1 row was dropped by the parser though the plugin loads it (on one channel),
    # so it was missing from overlaps too
    assert kinds("allreduce,0,100,ring,ll,-1,2,16\nallreduce,50,200,tree,ll,4,2,16\n") == ["channels", "overlap"]


def test_every_range_leaves_no_call_to_the_plugins_one_channel_default(dgx1_plan, fabric_plan):
    """``--every-range``: NCCL's default is written out where the models agree, so every swept size
    matches a row (none falls to the example plugin's one channel), the file still passes the
    plugin's rules, and the applied choice is never slower than NCCL's default in flowride's model."""
    from dataclasses import replace

    for plan in (dgx1_plan, fabric_plan):
        every = replace(plan, every_range=True)
        text = every.csv()
        assert check_tuner_csv(text, tiled=True) == []
        assert len(every.rows) == len(plan.ranges) >= len(plan.rows)
        assert plan is fabric_plan or len(every.rows) > len(plan.rows)  # dgx1: the models agree on most ranges
        for a in apply_tuner_csv(every, text):
            assert a.row is not None and a.row.channels >= 1, a
            assert a.ratio is not None and a.ratio <= 1 + 1e-12, a
