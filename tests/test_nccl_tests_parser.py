"""The nccl-tests / rccl-tests log parser on output in the harness's real shapes.

Logs are built by ``nccl_tests_logs`` from numbers (published times, or Hypothesis' draws) with
the harness's own printf formats, so each test knows every figure the parser should return.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowride.errors import InputError
from flowride.runtime import nccl_tests as nt
from nccl_tests_logs import (
    H100_8,
    MI300X_8,
    A100_2x8,
    Row,
    float_str,
    format_row,
    make_log,
    old_time_str,
    rows_for,
    table_header,
)


def parse(text: str, collective: str | None = None) -> list[nt.TestRun]:
    return nt.parse_nccl_tests(text, "run.log", collective)


def printed(value: float, kind: str, style: str) -> float:
    """What the harness prints for ``value`` in a ``kind`` column, read back."""
    if style == "nccl":
        return float(float_str(value, 7 if kind == "time" else 6))
    return float(old_time_str(value) if kind == "time" else "%6.2f" % value)  # noqa: UP031


def assert_rows(rows: tuple[nt.Measurement, ...], want: list[Row], style: str = "nccl", in_place: bool = True) -> None:
    """Every parsed figure is the printed one, exactly."""
    assert len(rows) == len(want)
    for got, w in zip(rows, want, strict=True):
        assert (got.size_bytes, got.count, got.dtype, got.redop, got.root) == (w.size, w.count, w.dtype, w.redop, w.root)
        assert got.time_us == printed(w.time, "time", style)
        assert got.algbw_GBps == printed(w.algbw, "bw", style)
        assert got.busbw_GBps == printed(w.busbw, "bw", style)
        assert got.wrong == w.wrong
        if in_place:
            assert got.in_place_time_us == printed(w.ip_time, "time", style)
            assert got.in_place_busbw_GBps == printed(w.ip_busbw, "bw", style)
            assert got.in_place_wrong == w.ip_wrong


def line_of(text: str, needle: str, nth: int = 0) -> int:
    return [i for i, s in enumerate(text.split("\n"), 1) if needle in s][nth]


def test_an_nccl_tests_219_run_reads_whole():
    text = make_log("allreduce", 8, H100_8)
    (run,) = parse(text)
    assert (run.source, run.runtime, run.collective, run.ranks, run.hosts) == ("run.log", "nccl", "allreduce", 8, 1)
    assert run.devices[3] == nt.Device(3, "node00", 3, "NVIDIA H100 80GB HBM3")
    assert run.settings["version"].startswith("nccl-tests version 2.19.6")
    assert run.settings["program"] == "all_reduce_perf" and run.settings["command"].startswith("$ mpirun")
    assert {k: run.settings[k] for k in ("nThread", "nGpus", "minBytes", "maxBytes", "stepFactor", "warmup_iters",
                                         "iters", "agg_iters", "validation", "graph")} == \
        {"nThread": 1, "nGpus": 1, "minBytes": 8, "maxBytes": 8589934592, "stepFactor": 2, "warmup_iters": 5,
         "iters": 20, "agg_iters": 1, "validation": 1, "graph": 0}
    assert not run.truncated and run.out_of_place and run.avg_busbw_GBps == pytest.approx(151.445)
    assert_rows(run.rows, rows_for("allreduce", 8, H100_8))
    assert run.rows[0].line == line_of(text, "           8             2")
    assert run.rows[-1].time_us == 31289.0 and run.rows[-1].busbw_GBps == 480.44
    assert all(r.collective == "allreduce" for r in run.rows)


@pytest.mark.parametrize("style, points, n, hosts, gpu, runtime", [
    ("nccl213", A100_2x8, 16, 2, "NVIDIA A100-SXM4-80GB", "nccl"),
    ("rccl", MI300X_8, 8, 1, "AMD Instinct MI300X", "rccl"),
    ("rccl", MI300X_8, 8, 1, "", "rccl"),  # no name: the bus id format (dom:bus:dev.fn) tells rccl-tests
])
def test_older_nccl_tests_and_rccl_tests(style, points, n, hosts, gpu, runtime):
    (run,) = parse(make_log("allreduce", n, points, style=style, hosts=hosts, gpu=gpu))
    assert (run.runtime, run.collective, run.ranks, run.hosts) == (runtime, "allreduce", n, hosts)
    assert {d.host for d in run.devices} == {f"node{h:02d}" for h in range(hosts)}
    assert_rows(run.rows, rows_for("allreduce", n, points), style)
    if style == "rccl":
        assert run.settings["version"] == "rccl-tests: Version develop:a7809b3"


def test_several_collectives_in_one_file_each_named_by_its_command():
    parts = [make_log(c, 16, A100_2x8, style="nccl213", hosts=2) for c in ("allreduce", "allgather", "reducescatter", "alltoall")]
    text = "Starting the sweep\n" + "\n[warn] node03: link flapped\n".join(parts)
    runs = parse(text)
    assert [r.collective for r in runs] == ["allreduce", "allgather", "reducescatter", "alltoall"]
    assert [r.line for r in runs] == [line_of(text, "# nThread", k) for k in range(4)]
    assert_rows(runs[1].rows, rows_for("allgather", 16, A100_2x8), "nccl213")
    assert runs[3].rows[-1].in_place_wrong is None and runs[3].rows[-1].wrong == 0  # alltoall: no in-place check


def test_the_same_collective_twice_makes_two_runs():
    text = make_log("allreduce", 8, H100_8) + make_log("allreduce", 16, A100_2x8, hosts=2, command=None)
    one, two = parse(text)
    assert (one.collective, one.ranks, two.collective, two.ranks, two.hosts) == ("allreduce", 8, "allreduce", 16, 2)
    assert_rows(two.rows, rows_for("allreduce", 16, A100_2x8))


def test_rccl_tests_in_place_only_table():
    (run,) = parse(make_log("allreduce", 8, MI300X_8, style="rccl", in_place_only=True))
    assert not run.out_of_place
    want = rows_for("allreduce", 8, MI300X_8)
    assert [r.time_us for r in run.rows] == [printed(w.ip_time, "time", "rccl") for w in want]
    assert all(r.in_place_time_us == r.time_us and r.in_place_busbw_GBps == r.busbw_GBps for r in run.rows)


@pytest.mark.parametrize("style", ["nccl", "nccl213", "rccl"])
def test_check_off_prints_na_in_both_wrong_columns(style):
    (run,) = parse(make_log("allgather", 8, H100_8, style=style, check=False))
    assert run.settings["validation"] == 0 and run.collective == "allgather"
    assert all(r.wrong is None and r.in_place_wrong is None for r in run.rows)
    assert_rows(run.rows, rows_for("allgather", 8, H100_8, check=False), style)


def test_wrong_counts_are_read_as_counts():
    (run,) = parse(make_log("allreduce", 8, H100_8, wrong=1234567))
    assert run.rows[0].wrong == 1234570  # %6g keeps six digits


def test_a_log_cut_between_rows_keeps_its_rows():
    text = make_log("allreduce", 8, H100_8)
    cut = text[:text.index("# Out of bounds")]
    cut = "\n".join(cut.split("\n")[:-4]) + "\n"
    (run,) = parse(cut)
    assert run.truncated and len(run.rows) == len(H100_8) - 3
    assert_rows(run.rows, rows_for("allreduce", 8, H100_8)[:-3])


@pytest.mark.parametrize("tail", [
    "",  # cut mid-line: no newline, half the fields
    "node00:41000:41000 [3] NCCL WARN Cuda failure 'an illegal memory access was encountered'\n"
    "--------------------------------------------------------------------------\n"
    "mpirun noticed that process rank 3 with PID 41000 on node node00 exited on signal 6 (Aborted).\n",
])
def test_a_log_cut_inside_a_row_keeps_the_rows_before(tail):
    text = make_log("allreduce", 8, H100_8, footer=False)
    last = text.rstrip("\n").rsplit("\n", 1)[1]
    text = text[:text.rindex(last)] + last[:70] + ("node00:41000:41000 [3] NCCL WARN abort\n" if tail else "") + tail
    (run,) = parse(text)
    assert run.truncated and len(run.rows) == len(H100_8) - 1
    assert run.settings["truncated_at_line"] == line_of(text, last[:70])


def test_noise_between_and_around_the_lines_is_skipped():
    clean = make_log("allreduce", 8, H100_8)
    noisy = []
    for k, s in enumerate(clean.split("\n")):
        noisy.append(s)
        if k % 3 == 0:
            noisy.append(f"node00:4100{k % 8}:4100{k % 8} [{k % 8}] NCCL INFO Channel 0{k % 4}/32 : 0[0] -> 1[1] via P2P/IPC")
        if k % 5 == 0:
            noisy += ["", "Warning: Permanently added 'node01' (ED25519) to the list of known hosts.", "   "]
        if k % 7 == 0:
            noisy.append("3 more processes have sent help message help-mpi-btl-openib.txt")
    (run,) = parse("\n".join(noisy))
    (want,) = parse(clean)
    assert [(r.size_bytes, r.time_us, r.busbw_GBps, r.in_place_wrong) for r in run.rows] == \
        [(r.size_bytes, r.time_us, r.busbw_GBps, r.in_place_wrong) for r in want.rows]
    assert (run.collective, run.ranks, run.avg_busbw_GBps) == ("allreduce", 8, want.avg_busbw_GBps)


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", "0: ", "2026-07-10T12:00:01.123456Z "])
def test_launcher_prefixes_are_stripped(prefix):
    text = "".join(prefix + s + "\n" for s in make_log("allgather", 16, A100_2x8, hosts=2).split("\n"))
    (run,) = parse(text)
    assert (run.collective, run.ranks, run.hosts) == ("allgather", 16, 2)
    assert_rows(run.rows, rows_for("allgather", 16, A100_2x8))


def test_windows_line_ends_read_the_same():
    text = make_log("reducescatter", 8, H100_8) + make_log("broadcast", 8, H100_8)
    assert parse(text.replace("\n", "\r\n")) == parse(text)


@pytest.mark.parametrize("c", ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv",
                               "hypercube"])
def test_the_collective_is_inferred_from_the_table(c):
    (run,) = parse(make_log(c, 8, H100_8, command=None, program_line=False))
    assert run.collective == c and run.ranks == 8
    if c == "hypercube":
        assert {r.redop for r in run.rows} == {""}  # a blank redop: one field fewer on the line


def test_rccl_alltoallv_is_inferred_where_nothing_else_fits():
    (run,) = parse(make_log("alltoallv", 8, MI300X_8, style="rccl", command=None))
    assert run.collective == "alltoallv"


@pytest.mark.parametrize("c, check, fits", [
    ("allgather", False, "allgather or alltoall"),  # same count, op, root and factor; no in-place check to tell
    ("alltoall", False, "allgather or alltoall"),
    ("gather", True, "gather or scatter"),
    ("allreduce", False, "allreduce or sendrecv"),  # on 2 ranks AllReduce's factor is 1 too
])
def test_an_ambiguous_table_asks_for_the_collective(c, check, fits):
    n = 2 if c == "allreduce" else 8
    text = make_log(c, n, H100_8, command=None, program_line=False, check=check)
    with pytest.raises(InputError) as e:
        parse(text)
    assert e.value.field == f"run.log line {line_of(text, '# nThread')}"
    assert "cannot tell which collective" in e.value.problem and fits in e.value.fix
    assert parse(text, c)[0].collective == c


def test_the_in_place_check_tells_allreduce_from_sendrecv_on_two_ranks():
    for c in ("allreduce", "sendrecv"):
        assert parse(make_log(c, 2, H100_8, command=None, program_line=False))[0].collective == c


def test_the_collective_argument_takes_any_spelling_and_yields_to_the_log():
    text = make_log("allgather", 8, H100_8, command=None, program_line=False, check=False)
    for name in ("all_gather", "AllGather", "all-gather", "all_gather_perf_mpi"):
        assert parse(text, name)[0].collective == "allgather"
    assert parse(make_log("allgather", 8, H100_8), "alltoall")[0].collective == "allgather"  # the log names it
    with pytest.raises(InputError, match="not an nccl-tests collective"):
        parse(text, "allgatherv")


def test_a_collective_the_table_contradicts_names_the_row():
    text = make_log("allreduce", 8, H100_8, command=None, program_line=False)
    with pytest.raises(InputError) as e:
        parse(text, "reducescatter")  # same op and root; count and factor differ
    assert e.value.field == f"run.log line {line_of(text, '           8             2')}"
    assert "reducescatter on 8 ranks" in e.value.problem


def test_a_table_no_collective_prints_says_so():
    text = make_log("allreduce", 8, H100_8, command=None, program_line=False).replace("     sum      -1", "     sum       3")
    with pytest.raises(InputError, match=f"run.log line {line_of(text, '# nThread')}: this table fits no nccl-tests collective"):
        parse(text)  # a root with AllReduce's factor: Reduce's busbw is its algbw


def test_a_pasted_table_alone_takes_ranks_from_the_table():
    body = lambda c, n: "\n".join(table_header("nccl") + [format_row(r) for r in rows_for(c, n, A100_2x8)]) + "\n"  # noqa: E731
    run = parse(body("allgather", 16), "allgather")[0]
    assert (run.ranks, run.hosts, run.devices, run.truncated) == (16, 0, (), True)  # from count vs size
    assert parse(body("allreduce", 16))[0].ranks == 16  # from busbw/algbw
    with pytest.raises(InputError, match="cannot tell how many ranks"):
        parse(body("broadcast", 16))  # a factor of 1 says nothing of the rank count


def test_per_iteration_columns_timestamps_and_cpu_time():
    (run,) = parse(make_log("allreduce", 8, H100_8, per_iter=True, timestamps=True, cputime=True))
    assert_rows(run.rows, rows_for("allreduce", 8, H100_8))
    assert run.settings["cputime"] is True


def test_nccl_tests_before_2_13_error_column():
    head = ["# nThread 1 nGpus 8 minBytes 8 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20 validation: 1 ",
            "#", "#   Rank  0 Pid  12345 on     node00 device  0 [0x18] Tesla V100-SXM2-32GB",
            *[f"#   Rank  {k} Pid  12345 on     node00 device  {k} [0x{24 + k:02x}] Tesla V100-SXM2-32GB" for k in range(1, 8)],
            "#", "#                                 out-of-place                       in-place          ",
            "#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
            "#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "]
    rows = ["%12li  %12li  %8s  %6s  %7.2f  %6.2f  %6.2f  %5.0le  %7.2f  %6.2f  %6.2f  %5.0le"  # noqa: UP031
            % (s, s // 4, "float", "sum", 30.0, s / 30e3, s / 30e3 * 1.75, 0.0, 31.0, s / 31e3, s / 31e3 * 1.75, 1e-7)
            for s in (1024, 1048576)]
    (run,) = parse("\n".join(head + rows + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 30.1 "]))
    assert (run.collective, run.ranks, run.rows[1].busbw_GBps, run.rows[1].wrong, run.rows[1].root) == ("allreduce", 8, 61.17, None, -1)


def test_split_groups_count_rank_zeros_communicator():
    """NCCL_TESTS_SPLIT_MASK: 8 devices listed, two communicators of 4 measured."""
    text = make_log("allreduce", 8, H100_8, rows=rows_for("allreduce", 4, H100_8))
    text = "".join(s.replace("Group  0", "Group  1") if any(f"Rank  {k}" in s for k in range(4, 8)) else s
                   for s in text.splitlines(keepends=True))
    (run,) = parse(text)
    assert (run.ranks, len(run.devices)) == (4, 8)
    with pytest.raises(InputError, match="on 8 ranks"):  # all in one group: busbw says the table is not 8 ranks'
        parse(text.replace("Group  1", "Group  0"))


def test_device_lines_cut_by_the_harness_count_processes():
    text = make_log("allreduce", 8, H100_8).replace("[0000:1f:00] NVIDIA H100 80GB HBM3", "[0000:1f:00] NVIDIA H...")
    (run,) = parse(text)
    assert run.ranks == 8  # nThread x nGpus x 8 processes


@pytest.mark.parametrize("edit, problem", [
    (lambda s: s.rsplit(None, 1)[0], "has 12 fields, expected 13"),
    (lambda s: s.replace("124.00", "124.0x"), "time '124.0x' is not a number"),
    (lambda s: s.replace("    16777216", "   -16777216"), "size -16777216 is negative"),
    (lambda s: s.replace("   -1   ", "  one   "), "root 'one' is not a rank or -1"),
])
def test_a_malformed_row_is_one_error_naming_its_line(edit, problem):
    text = make_log("allreduce", 8, H100_8)
    k = line_of(text, "    16777216")
    lines = text.split("\n")
    lines[k - 1] = edit(lines[k - 1])
    with pytest.raises(InputError) as e:
        parse("\n".join(lines))
    assert e.value.field == f"run.log line {k}" and problem in e.value.problem
    assert str(e.value).count("\n") == 0


def test_a_malformed_last_row_before_the_footer_is_an_error():
    text = make_log("allreduce", 8, H100_8)
    k = line_of(text, "  8589934592")
    lines = text.split("\n")
    lines[k - 1] = lines[k - 1][:60]
    with pytest.raises(InputError, match=f"run.log line {k}: table row has"):
        parse("\n".join(lines))


@pytest.mark.parametrize("text, problem", [
    ("", "is empty"), ("  \r\n\n\t\n", "is empty"),
    ("hello\n42 is the answer\n", "has no nccl-tests result table"),
    ("# nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20\n#\n# Using devices\n",
     "has no nccl-tests result table"),
])
def test_a_log_without_a_table_says_what_was_expected(text, problem):
    with pytest.raises(InputError) as e:
        parse(text)
    assert e.value.field == "run.log" and problem in e.value.problem and "nccl-tests" in e.value.fix


def test_reading_files(tmp_path):
    p = tmp_path / "ar.log"
    p.write_bytes(make_log("allreduce", 8, H100_8).replace("# Using devices", "caf\xe9 NCCL INFO x\n# Using devices")
                  .encode("latin-1"))
    (run,) = nt.read_nccl_tests(p)
    assert run.source == str(p) and len(run.rows) == len(H100_8)
    with pytest.raises(InputError, match="is a directory"):
        nt.read_nccl_tests(tmp_path)
    with pytest.raises(InputError, match="cannot read it"):
        nt.read_nccl_tests(tmp_path / "missing.log")


def test_busbw_factor_is_nccl_tests():
    assert nt.busbw_factor("allreduce", 8) == 1.75
    assert [nt.busbw_factor(c, 16) for c in ("all_gather", "reducescatter", "alltoall", "gather", "scatter")] == [15 / 16] * 5
    assert [nt.busbw_factor(c, 16) for c in ("broadcast", "reduce", "sendrecv", "hypercube")] == [1.0] * 4
    with pytest.raises(InputError):
        nt.busbw_factor("allreduce", 0)
    with pytest.raises(InputError):
        nt.busbw_factor("allgatherv", 8)


_COLL = ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv", "gather", "hypercube"]


@given(c=st.sampled_from(_COLL), n=st.integers(2, 64), style=st.sampled_from(["nccl", "nccl213", "rccl"]),
       dtype=st.sampled_from(["int8", "half", "bfloat16", "float", "double", "int64"]), check=st.booleans(),
       points=st.lists(st.tuples(st.integers(0, 2**40), st.floats(0.5, 500), st.floats(0.1, 3000), st.floats(0.9, 1.1)),
                       min_size=1, max_size=12))
def test_any_table_round_trips(c, n, style, dtype, check, points):
    """parse(format(rows)) == rows, within what the harness prints."""
    pts = [(size, lat + size / bw / 1e3, (lat + size / bw / 1e3) * jitter) for size, lat, bw, jitter in points]
    want = rows_for(c, n, pts, dtype, check=check)
    (run,) = parse(make_log(c, n, pts, style=style, check=check, dtype=dtype))
    assert (run.collective, run.ranks) == (c, n)
    assert_rows(run.rows, want, style)
    for got, w in zip(run.rows, want, strict=True):
        for value, true in ((got.time_us, w.time), (got.in_place_time_us, w.ip_time), (got.busbw_GBps, w.busbw)):
            assert math.isclose(value, true, rel_tol=0.05 if true >= 1e7 else 0.0005, abs_tol=0.005)
