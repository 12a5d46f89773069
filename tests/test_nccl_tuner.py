"""``flowride export --nccl-tuner``: the CSV NCCL's example tuner plugin reads, picked by NCCL's
cost model calibrated to measured curves and gated by that model's error at each size; its
ranges, and the checker that reads a CSV by the plugin's rules (NVIDIA/nccl plugins/tuner/example/plugin.c)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.runtime.defaults import Chosen, for_topology
from flowride.runtime.nccl_tuning import IDENTITY, estimates
from flowride.runtime.profile import Profile, write_profile
from flowride.sweep import (
    Choice,
    SizeChoice,
    TunerPlan,
    check_tuner_csv,
    parse_tuner_csv,
    plan_tuner,
    side_table_path,
    tile,
    tuner_collectives,
    write_tuner,
)
from flowride.sweep.nccl_tuner import RULE, apply_tuner_csv, choose
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
from flowride.synth.nccl import machine
from flowride.topology import dgx1
from flowride.topology.fabrics import build_fabric
from synth_helpers import refused_here

SIZES = [1024 * 2**k for k in range(21)]  # 1 KiB .. 1 GiB, the export's default sweep
FABRIC2 = ("-t", "fabric", "--node", "dgx-h100", "--nodes", "2")
PAIRS = [(a, p) for a in ("ring", "tree", "nvls_tree", "pat") for p in ("LL", "LL128", "Simple")]


@pytest.fixture(scope="module")
def fabric():
    return build_fabric("dgx-h100", 2)


@pytest.fixture(scope="module")
def fabric_plan(fabric) -> TunerPlan:
    return plan_tuner(fabric, None, SIZES)


@pytest.fixture(scope="module")
def dgx1_plan() -> TunerPlan:
    return plan_tuner(dgx1(), "allgather,allreduce", SIZES)


def _sizes(plan: TunerPlan):
    return [(r, s) for r in plan.ranges for s in r.sizes]


def _with_error(chosen: Chosen, error: float) -> Chosen:
    """The same calibration, its fit's error ``error`` at every swept size."""
    return replace(chosen, name=f"{chosen.name}, error {error}", errors=tuple((b, error) for b in SIZES))


def _profile(path, chosen: Chosen, ratio: float) -> None:
    """A profile as `flowride calibrate` writes it: ``chosen``'s calibration, fitted with
    predicted/measured ``ratio`` at every swept size."""
    fit = [{"collective": "allreduce", "bytes": b, "measured_us": 100.0, "predicted_us": 100.0 * ratio, "ratio": ratio}
           for b in SIZES]
    write_profile(Profile(chosen.calibration, {"node": "dgx-h100", "nodes": 2}, ("mine.log",), ("floor_us",), fit, {}), path)


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


def _sc(size: int, ours: tuple[str, str], nccl: tuple[str, str], gain: float, error: float | None, ch: int = 8) -> SizeChoice:
    return SizeChoice(size, Choice(ours[0], ours[1].lower(), ch), 10.0, Choice(nccl[0], nccl[1].lower()), 10.0 * (1 + gain),
                      12.0, 13.0, error)


@given(st.lists(st.tuples(st.sampled_from(PAIRS[:4]), st.sampled_from(PAIRS[:4]), st.floats(0, 1),
                          st.one_of(st.none(), st.floats(0, 0.5))), min_size=1, max_size=30))
def test_written_csv_passes_the_checker_and_a_row_is_exactly_where_gain_beats_error(points):
    sizes = [2**k for k in range(len(points))]
    plan = TunerPlan("t", 16, 2, ["allreduce"], sizes, every_range=False)
    picks = [_sc(s, *p) for s, p in zip(sizes, points, strict=True)]
    plan.add("allreduce", picks)
    text = plan.csv("t.md")
    assert check_tuner_csv(text, tiled=True) == []
    rows, kept, _ = parse_tuner_csv(text)
    assert len(rows) + len(kept) == len(plan.ranges) and [r for _, r in rows] == plan.rows
    for p in picks:  # applied the way the plugin applies it
        row = match_row([r for _, r in rows], "allreduce", p.size, 2, 16)
        want = p.ours.pair != p.nccl.pair and p.error is not None and p.gain > p.error
        assert (row is not None) == want == p.written
        if row:
            assert (row.algorithm, row.protocol, row.channels) == (*p.ours.pair, 8)
    for a, b in zip(plan.ranges, plan.ranges[1:], strict=False):  # merged by the final decision only
        assert a.sizes[-1].key != b.sizes[0].key


def test_ranges_merge_by_the_final_decision_and_say_why():
    ring_ll, ring_ll128, tree_ll = ("ring", "LL"), ("ring", "LL128"), ("tree", "LL")
    picks = [_sc(1, ring_ll, ring_ll, 0.0, 0.1), _sc(2, tree_ll, ring_ll, 0.05, 0.1),  # differs, within the error: kept
             _sc(3, tree_ll, ring_ll, 0.5, 0.1), _sc(4, tree_ll, ring_ll128, 0.3, 0.2),  # a row, though NCCL's default changes
             _sc(5, tree_ll, ring_ll128, 0.3, None), _sc(6, ring_ll128, ring_ll128, 0.0, 0.1)]  # unknown error: kept
    plan = TunerPlan("t", 8, 1, ["allreduce"], [1, 2, 3, 4, 5, 6], calibration="fitted: test", every_range=False)
    plan.add("allreduce", picks)
    assert [(r.min_bytes, r.max_bytes, r.written) for r in plan.ranges] == [(0, 2, False), (3, 4, True), (5, SIZE_MAX, False)]
    assert [r.line() for r in plan.rows] == ["allreduce,3,4,tree,ll,8,1,8,-1,-1"]
    text = plan.csv()
    assert "# nccl-default,allreduce,0,2,1,8,ring,ll" in text and "# nccl-default,allreduce,5,18446744073709551615,1,8,ring,ll128" in text
    assert "# calibration: fitted: test" in text and check_tuner_csv(text, tiled=True) == []
    why = [r.why() for r in plan.ranges]
    assert why[0] == "NCCL's default kept: gain 5.0% within the model's error 10.0% at this size"
    assert why[1].startswith("row: gain 30.0%-50.0% > the model's error 10.0%-20.0%")
    assert "error is unknown" in why[2]
    md = plan.markdown("t.csv")
    assert "| allreduce | 2 | tree/ll x8 | ring/ll |" in md and "gain 5.0% within the model's error 10.0% at this size" in md
    assert "| ring/ll, ring/ll128 |" in md  # the row's range: NCCL's defaults under it


# ---- the plan: NCCL's default, flowride's pick, the gate ----

def _check_plan(plan: TunerPlan) -> None:
    for coll in plan.collectives:
        rs = [r for r in plan.ranges if r.collective == coll]
        assert rs[0].min_bytes == 0 and rs[-1].max_bytes == SIZE_MAX
        assert all(b.min_bytes == a.max_bytes + 1 for a, b in zip(rs, rs[1:], strict=False))
        assert sorted(s.size for r in rs for s in r.sizes) == plan.sizes
    assert len(plan.overrides) == sum(r.written for r in plan.ranges)
    assert len(plan.rows) == (len(plan.ranges) if plan.every_range else len(plan.overrides))
    for row in plan.rows:
        assert row.collective in COLLECTIVES and row.algorithm in ALGORITHMS and row.protocol in PROTOCOLS
        assert (row.nnodes, row.nranks, row.num_pipe_ops, row.reg_buff) == (plan.nodes, plan.gpus, -1, -1)
        assert row.channels == plan.default_channels > 0  # NCCL's assumed count, never -1
    assert check_tuner_csv(plan.csv(), tiled=True) == []


def test_fabric_default_is_nccls_rule_pick_is_calibrated_and_a_row_needs_gain_above_error(fabric, fabric_plan):
    """Two DGX H100: NCCL's default is the least of NCCL's own model, flowride's pick the least of
    the calibrated one, both timed calibrated; a size is written exactly where the gain beats
    ``error_at`` there, and the sweep has both kinds of disagreement (written, and kept)."""
    _check_plan(fabric_plan)
    chosen = for_topology(fabric)
    assert chosen.errors and fabric_plan.calibration == chosen.name and chosen.name.startswith("fitted: dgx-h100")
    m = machine(fabric)
    for r, s in _sizes(fabric_plan):
        own = {(e.algorithm, e.protocol.lower()): e.time_us for e in estimates(r.collective, m, s.size, IDENTITY)}
        cal = {(e.algorithm, e.protocol.lower()): e.time_us for e in estimates(r.collective, m, s.size, chosen.calibration)}
        assert s.nccl.pair == min(own, key=own.get) and s.nccl_est_us == own[s.nccl.pair]
        assert s.ours_us == cal[s.ours.pair] == min(cal.values()) and s.nccl_us == cal[s.nccl.pair]
        assert s.error == chosen.error_at(s.size) is not None and s.how == "calibrated model"
        assert s.written == (s.ours.pair != s.nccl.pair and cal[s.nccl.pair] / cal[s.ours.pair] - 1 > s.error)
        assert s.ours.channels == 8  # one per NIC across nodes, as NCCL's model assumes
    written = [(r, s) for r, s in _sizes(fabric_plan) if s.written]
    held = [(r, s) for r, s in _sizes(fabric_plan) if s.differs and not s.written]
    assert written and held
    lines = fabric_plan.csv().splitlines()
    gaps = replace(fabric_plan, every_range=False).csv().splitlines()
    md = fabric_plan.markdown()
    for r, s in written:  # its range is a row naming the pick
        assert r.written and f"{r.collective},{r.min_bytes},{r.max_bytes},{s.ours.algorithm},{s.ours.protocol},8,2,16,-1,-1" in lines
    for r, s in held:  # NCCL's default (a row of it, or with --gaps a comment), and the side table says why
        assert not r.written and f"{r.collective},{r.min_bytes},{r.max_bytes},{s.nccl.algorithm},{s.nccl.protocol},8,2,16,-1,-1" in lines
        assert any(ln.startswith(f"# nccl-default,{r.collective},{r.min_bytes},") for ln in gaps)
        assert f"gain {100 * s.gain:.1f}% within the model's error {100 * s.error:.1f}% at this size" in md


def test_the_side_table_names_the_calibration_and_the_rule(fabric_plan):
    md = fabric_plan.markdown("t.csv")
    assert f"Calibration: **{fabric_plan.calibration}**" in md and "hgx_h100_2node_allreduce" in md
    assert RULE in md and "median |predicted/measured - 1|" in RULE and "exceeds the model's error at that size" in RULE
    head = md.split("## Per swept size")[1].splitlines()[2]
    for col in ("pick (us)", "default (us)", "gain", "model error", "row", "why", "NCCL's own model: pick (us)"):
        assert col in head


def test_no_rows_without_a_measured_error(fabric, dgx1_plan):
    """``--calibration nccl`` is NCCL's own model: the choices agree and there is no error to beat;
    a topology with no node type (dgx1) gets NCCL's own model too."""
    nccl = plan_tuner(fabric, None, SIZES, calibration="nccl")
    assert nccl.overrides == [] and nccl.calibration == "NCCL's own model (uncorrected)"
    assert all(not s.differs and s.error is None for _, s in _sizes(nccl))
    _check_plan(dgx1_plan)
    assert dgx1_plan.overrides == [] and dgx1_plan.calibration.startswith("NCCL's own model")
    assert all(s.error is None and not s.written for _, s in _sizes(dgx1_plan))
    # a calibration that differs from NCCL's but whose error is unknown writes nothing either
    blind = replace(for_topology(fabric), errors=())
    plan = plan_tuner(fabric, None, SIZES, calibration=blind)
    assert plan.overrides == [] and any(s.differs for _, s in _sizes(plan))
    assert "error is unknown" in plan.markdown()


def test_a_smaller_error_lets_more_rows_through(fabric, fabric_plan):
    chosen = for_topology(fabric)
    tight = plan_tuner(fabric, None, SIZES, calibration=_with_error(chosen, 0.01))
    loose = plan_tuner(fabric, None, SIZES, calibration=_with_error(chosen, 10.0))
    assert loose.overrides == [] and len(tight.overrides) > len(fabric_plan.overrides)
    for plan in (tight, loose):
        _check_plan(plan)
        for _, s in _sizes(plan):
            assert s.written == (s.differs and s.gain > s.error)


def test_collectives_refused_with_the_fix():
    assert tuner_collectives(None) == ["allgather", "reducescatter", "allreduce"]
    assert tuner_collectives("AllReduce, allgather,allreduce") == ["allreduce", "allgather"]
    for bad, needle in (("alltoall", "grouped sends"), ("broadcast", "does not model"), ("gather", "unknown"), (",", "no collective")):
        with pytest.raises(InputError, match=needle):
            tuner_collectives(bad)




def test_write_is_checked_and_sits_beside(tmp_path, fabric_plan):
    csv_path, md = write_tuner(fabric_plan, tmp_path / "tuner.conf")
    assert md == side_table_path(csv_path) == tmp_path / "tuner.conf.md"
    text = csv_path.read_text()
    assert check_tuner_csv(text, tiled=True) == [] and "tuner.conf.md" in text
    assert all(len(line) <= 254 for line in text.splitlines())
    assert f"# calibration: {fabric_plan.calibration}" in text
    assert "# NCCL tuner overrides for dgx-h100-2n-rail" in md.read_text()


def test_a_long_calibration_name_stays_one_comment_line():
    plan = TunerPlan("t", 8, 1, ["allreduce"], [1], calibration="profile /" + "x" * 400 + "\n.json")
    plan.add("allreduce", [_sc(1, ("ring", "LL"), ("ring", "LL"), 0.0, None)])
    text = plan.csv("t.md")
    assert check_tuner_csv(text, tiled=True) == [] and all(len(ln) <= 254 for ln in text.splitlines())


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

def test_cli_export_with_a_calibration_profile(tmp_path):
    """End to end, as a user runs it: a profile from `flowride calibrate` (here written directly:
    the built-in fit's calibration, 1% off at every size), so rows wherever the gain beats 1%."""
    prof = tmp_path / "p.json"
    _profile(prof, for_topology(build_fabric("dgx-h100", 2)), 1.01)
    out = tmp_path / "tuner.csv"
    r = cli("export", "--nccl-tuner", out, *FABRIC2, "-c", "allreduce,allgather", "--calibration", prof, timeout=120)
    assert r.code == 0, r.err[-2000:]
    assert f"Calibration: profile {prof}" in r.out and "NCCL_TUNER_CONFIG_FILE" in r.out
    text = out.read_text()
    assert check_tuner_csv(text, tiled=True) == [] and "# calibration: profile" in text
    rows, _, _ = parse_tuner_csv(text)
    assert rows and all(row.nnodes == 2 and row.nranks == 16 and row.channels == 8 for _, row in rows)
    md = (tmp_path / "tuner.csv.md").read_text()
    assert f"Calibration: **profile {prof}**; fitted on: mine.log" in md and RULE in md
    plan = plan_tuner(build_fabric("dgx-h100", 2), "allreduce,allgather", SIZES, calibration=str(prof))
    assert [r for _, r in rows] == plan.rows and len(plan.rows) == len(plan.ranges)  # by default a row for every range
    assert all(s.error == pytest.approx(0.01) and s.written == (s.differs and s.gain > s.error) for _, s in _sizes(plan))
    assert r.out.count("row(s) written") == 1 and f"{len(plan.rows)} row(s) written" in r.out


def test_cli_export_dgx1_writes_no_override_and_says_why(tmp_path, capfd):
    """dgx1 has no node type: no measured error, so no override. By default every range still gets
    a row, NCCL's own pick at NCCL's channel count (no call falls to the plugin's one channel);
    ``--gaps`` leaves them as comments and warns."""
    out = tmp_path / "t.conf"
    r = cli_here(capfd, "export", "--nccl-tuner", out, "-t", "dgx1", "-b", "1K", "-e", "64K", "-f", "8")
    assert r.code == 0, r.err[-2000:]
    text = out.read_text()
    rows = parse_tuner_csv(text)[0]
    assert check_tuner_csv(text, tiled=True) == [] and rows and all(row.channels > 1 for _, row in rows)
    assert {row.collective for _, row in rows} == {"allgather", "reducescatter", "allreduce"}
    assert "the model's error is unknown and no override is written" in r.out and "no call falls" in r.out
    assert "no row for broadcast, reduce" in r.err
    g = cli_here(capfd, "export", "--nccl-tuner", tmp_path / "g.csv", "-t", "dgx1", "--gaps", "--sizes", "1K,64M")
    gaps = (tmp_path / "g.csv").read_text()
    assert g.code == 0 and parse_tuner_csv(gaps)[0] == [] and "# nccl-default,allreduce,0," in gaps
    assert "--gaps" in gaps and "ONE channel" in g.err


def test_cli_a_bad_calibration_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "x.csv"
    r = cli("export", "--nccl-tuner", out, *FABRIC2, "--calibration", tmp_path / "none.json", timeout=60)
    assert_clean_error(r, 2, "--calibration", "none.json", "flowride calibrate", within=30)
    assert not out.exists() and not side_table_path(out).exists()


@pytest.mark.parametrize("args, needles", [
    (("--nccl-tuner", "{d}/x.csv"), ("--topology", "-t dgx1")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "-c", "alltoall"), ("--collective", "alltoall")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "-c", "allgather,bcast"), ("--collective", "bcast")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "--msccl", "{d}/a.xml"), ("--msccl", "--nccl-tuner")),
    (("--nccl-tuner", "{d}/x.csv", "-t", "dgx1", "--out-dir", "{d}"), ("--out-dir",)),
    (("--nccl-tuner", "{d}/none/x.csv", "-t", "dgx1"), ("--nccl-tuner",)),
    (("--nccl-tuner", "{d}/x.csv", *FABRIC2, "--calibration", "{d}"), ("--calibration",)),
    (("-t", "dgx1", "--sizes", "1K", "--out-dir", "{d}/o", "--calibration", "nccl"), ("--calibration", "--nccl-tuner")),
    (("{d}/s.json", "--msccl", "{d}/a.xml", "--network-kind", "efa"), ("--network-kind", "--nccl-tuner")),
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




def _assert_never_slower(plan: TunerPlan, text: str | None = None) -> list:
    applied = apply_tuner_csv(plan, plan.csv() if text is None else text)
    assert len(applied) == len(plan.sizes) * len(plan.collectives)
    for a in applied:
        assert a.ratio is not None, a  # the calibrated model times both the applied choice and NCCL's default
        assert a.ratio <= 1 + 1e-12, a
        [s] = [s for r in plan.ranges if r.collective == a.collective for s in r.sizes if s.size == a.size]
        if text is None:  # the pick exactly where a size is written, NCCL's own pick (a row of it by default) elsewhere
            assert (a.row is None) == (not s.written and not plan.every_range)
            assert (a.choice.algorithm, a.choice.protocol) == (s.ours if s.written else s.nccl).pair
            assert not s.written or a.ratio < 1 / (1 + s.error) + 1e-12  # faster by more than the model's error
            assert a.row is None or a.row.channels > 1  # never the plugin's one channel
        assert a.est_ratio is not None and a.est_ratio >= 1 - 1e-12  # NCCL's own model: its default is its least
    return applied


def test_applied_csv_never_slower_on_real_plans(fabric, dgx1_plan, fabric_plan):
    tight = plan_tuner(fabric, None, SIZES, calibration=_with_error(for_topology(fabric), 0.01))
    for plan in (dgx1_plan, fabric_plan, tight):
        _assert_never_slower(plan)
        applied = _assert_never_slower(replace(plan, every_range=False))
        assert sum(a.row is not None for a in applied) == sum(plan.written_sizes(c) for c in plan.collectives)
    assert any(a.ratio < 1 for a in apply_tuner_csv(fabric_plan, fabric_plan.csv()))


@given(st.lists(st.tuples(st.dictionaries(st.sampled_from(PAIRS), st.floats(1.0, 1e4), min_size=1),
                          st.dictionaries(st.sampled_from(PAIRS), st.floats(1.0, 1e4)),
                          st.one_of(st.none(), st.floats(0.0, 1.0))), min_size=1, max_size=12))
def test_applied_csv_never_slower_for_any_plan_the_export_writes(points):
    """For any times the two models give (the calibrated one times every pair NCCL's offers, and
    may time more) and any error, the CSV the export writes, applied like the plugin, is never
    slower than NCCL's default at any swept size in the calibrated model."""
    plan = TunerPlan("t", 16, 2, ["allreduce", "allgather"], [1024 * 2**k for k in range(len(points))], default_channels=8)
    for coll in plan.collectives:
        picks = []
        for size, (est, extra, error) in zip(plan.sizes, points, strict=True):
            cal = {k: extra.get(k, t * 1.3) for k, t in est.items()}
            cal.update({k: t for k, t in extra.items() if k not in cal})  # pairs NCCL's table ignores
            picks.append(choose(size, cal, est, 8, error))
        plan.add(coll, picks)
    assert check_tuner_csv(plan.csv(), tiled=True) == []
    _assert_never_slower(plan)


def test_pick_is_one_nccl_can_run():
    # regression: a pair the calibrated model times but NCCL's cost table ignores (here NVLS across
    # nodes) made a row the plugin passes over, while the side table claimed its speedup
    est = {("ring", "LL"): 20.0, ("ring", "Simple"): 30.0}
    cal = {("ring", "LL"): 18.0, ("ring", "Simple"): 15.0, ("nvls", "Simple"): 5.0}
    s = choose(4096, cal, est, 8, 0.1)
    assert (s.ours.algorithm, s.ours.protocol, s.nccl.algorithm, s.nccl.protocol) == ("ring", "simple", "ring", "ll")
    assert s.usable == {("ring", "ll"), ("ring", "simple")} and s.times[("nvls", "simple")] == (5.0, None, 8)
    assert s.gain == pytest.approx(0.2) and s.written
    assert not choose(4096, cal, est, 8, 0.2).written and not choose(4096, cal, est, 8, None).written
    tie = choose(4096, {("ring", "LL"): 15.0, ("ring", "Simple"): 15.0}, est, 8, 0.0)  # a tie goes to NCCL's default
    assert not tie.differs and not tie.written


def test_applied_row_with_another_channel_count_is_untimed():
    est = {("ring", "LL"): 20.0, ("tree", "LL"): 10.0}
    s = choose(1024, {("ring", "LL"): 5.0, ("tree", "LL"): 9.0}, est, 12, 0.1)
    plan = TunerPlan("t", 16, 2, ["allreduce"], [1024])
    plan.add("allreduce", [s])
    [a] = apply_tuner_csv(plan, "allreduce,0,18446744073709551615,ring,ll,12,2,16\n")
    assert a.ratio == pytest.approx(5 / 9) and a.est_ratio == pytest.approx(2.0)
    [b] = apply_tuner_csv(plan, "allreduce,0,18446744073709551615,ring,ll,-1,2,16\n")  # one channel: not what was timed
    assert b.us is None and b.ratio is None and b.choice.channels == 1
    [c] = apply_tuner_csv(plan, "allreduce,0,18446744073709551615,nvls,simple,4,2,16\n")  # ignored by NCCL: its default
    assert c.row is None and c.ratio == 1.0
    # regression: a -1 row was dropped by the parser though the plugin loads it (on one channel),
    # so it was missing from overlaps too
    assert kinds("allreduce,0,100,ring,ll,-1,2,16\nallreduce,50,200,tree,ll,4,2,16\n") == ["channels", "overlap"]


def test_the_default_file_leaves_no_call_to_the_plugins_one_channel_default(dgx1_plan, fabric_plan):
    """By default NCCL's own pick is written out where flowride has no override, so every swept
    size matches a row (none falls to the example plugin's one channel), the file still passes the
    plugin's rules, and the applied choice is never slower than NCCL's default in the calibrated
    model; ``--gaps`` (``every_range=False``) has rows only for the overrides."""
    for plan in (dgx1_plan, fabric_plan):
        every = replace(plan, every_range=True)
        text = every.csv()
        assert plan.every_range and check_tuner_csv(text, tiled=True) == []
        assert len(every.rows) == len(plan.ranges) > len(plan.overrides) == len(replace(plan, every_range=False).rows)
        _assert_never_slower(plan, text)
        for a in apply_tuner_csv(every, text):
            assert a.row is not None and a.row.channels == plan.default_channels, a


# ---- the parser reads what the plugin reads (issue #50) ----------------------------------------


def _rows(text: str) -> list[TunerRow]:
    return [r for _, r in parse_tuner_csv(text)[0]]


def test_a_crlf_row_is_read_as_the_plugin_reads_it_and_still_warned_about():
    """The plugin's number parsers stop at the carriage return: a CRLF file's rows apply."""
    text = "allreduce,0,1048576,tree,ll,8,2,16,-1,-1\r\nallgather,0,65536,ring,ll128,4,2,16\r\n"
    rows = _rows(text)
    assert [(r.collective, r.max_bytes, r.nranks) for r in rows] == [("allreduce", 1048576, 16), ("allgather", 65536, 16)]
    assert match_row(rows, "allgather", 4096, 2, 16).protocol == "ll128"
    assert kinds(text).count("carriage-return") == 2


@pytest.mark.parametrize(("length", "whole"), [(254, True), (255, True), (256, False)])
def test_line_lengths_around_the_plugins_buffer(length, whole):
    """``fgets`` into 256 bytes: up to 255 characters are one line; 256 are cut after 255 and the
    last character read as a line of its own. 255 is read whole but warned about."""
    row = "allreduce,0,1048576,tree,ll,8,2,16,-1,"
    line = row + "-1" + " " * (length - len(row) - 2)
    assert len(line) == length
    rows = _rows(line + "\n")
    found = [f for f in check_tuner_csv(line + "\n", tiled=False) if f.kind == "line-length"]
    if whole:
        assert len(rows) == 1 and rows[0].reg_buff == -1
        assert (found != []) == (length == 255)
    else:  # the piece of 255 reads as the row; the 1-character tail is a line of its own (one field: dropped)
        assert len(rows) == 1 and found and "cuts the line" in found[0].message


def test_an_indented_comment_is_a_row_only_with_eight_fields_or_more():
    """The plugin skips only a '#' in the first column. Indented, a line of 8 or more fields is
    read as an allreduce row (its first field names no collective); fewer are dropped."""
    long = "  # allgather,0,1024,tree,ll,8,2,16\n"
    short = "  # a note, nothing more\n"
    assert [(r.collective, r.algorithm, r.max_bytes) for r in _rows(long)] == [("allreduce", "tree", 1024)]
    assert match_row(_rows(long), "allreduce", 512, 2, 16) is not None
    assert _rows(short) == []
    assert "indent" in kinds(long) and "indent" in kinds(short)
    assert any("as an allreduce row" in f.message for f in check_tuner_csv(long))


def test_ranges_left_to_nccl_end_where_nccls_own_pick_changes():
    """Written out, NCCL's own pick holds over a whole range: its ends move from the swept sizes to
    NCCL's own switch points (bisection on its cost model), so between two swept sizes the file
    never forces the smaller size's pick past NCCL's switch (2 x dgx-a100: LL to 786 KB was 3x
    slower by the calibrated model)."""
    from flowride.sweep.nccl_tuner_edges import nccl_pick
    from flowride.synth.nccl import machine

    topo = build_fabric("dgx-a100", 2)
    plan = plan_tuner(topo, None, SIZES)
    m = machine(topo)
    moved = 0
    for coll in plan.collectives:
        rs = [r for r in plan.ranges if r.collective == coll]
        assert rs[0].min_bytes == 0 and rs[-1].max_bytes == SIZE_MAX
        assert all(b.min_bytes == a.max_bytes + 1 for a, b in zip(rs, rs[1:], strict=False))  # still a tiling
        for a, b in zip(rs, rs[1:], strict=False):
            assert all(a.min_bytes <= s.size <= a.max_bytes for s in a.sizes)  # swept sizes stay in their range
            if not (a.written or b.written):
                assert nccl_pick(coll, m, b.min_bytes) == b.nccl.pair and nccl_pick(coll, m, b.min_bytes - 1) == a.nccl.pair
                moved += b.min_bytes not in {s.size for s in b.sizes}
    assert moved > 0
    applied = apply_tuner_csv(plan, plan.csv())
    assert all(a.row is not None and a.row.channels > 1 for a in applied)


def test_an_empty_field_shifts_the_rest_left_as_strtok_does():
    """``allreduce,0,,1000,...``: strtok skips the empty field, so the plugin reads 8 fields with
    1000 as max_bytes; the parser loads the row so and says why."""
    text = "allreduce,0,,1000,ring,ll,4,2,16\n"
    assert [(r.max_bytes, r.algorithm, r.channels, r.nranks) for r in _rows(text)] == [(1000, "ring", 4, 16)]
    assert "empty-field" in kinds(text)
