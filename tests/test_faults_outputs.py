"""Output paths (issue #16, classes 1 and 8): every output option is checked before any work
starts, and files are written atomically with the permissions the umask gives.

Each case pairs a job with an output that cannot be written: the command must fail naming the
option, with no traceback and no file left behind. Where the job is long (a 1e6-iteration
training, a 10-minute solve), "before the work" is also judged on CPU time: argparse refuses in
about 0.1 s (0.2 s with the interpreter's start), far below ``LONG_S``, itself far below the job.
For each output option one bad path runs as a user runs it (a subprocess); the other bad paths
call ``main()`` in this process (clihere), the same code and line without an interpreter each."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.files import atomic_write, check_output_dir, check_output_file, write_json_atomic

SCHED = "SCHED"  # replaced by a real schedule file
LONG_S = 5.0  # CPU seconds: a refusal costs a fraction of one; a long job, minutes or more
LONG = {"synth", "run", "train", "profile-task", "profile-bubbles"}  # the jobs below that would run for minutes

# (command with a placeholder OUT for the output path, the option named in the error)
OUTPUTS = [
    (["synth", "-t", "dgx2", "-s", "1MB", "--time-limit", "600", "--out", "OUT"], "--out"),
    (["synth", "-t", "dgx2", "-s", "1MB", "--time-limit", "600", "--report", "OUT"], "--report"),
    (["export", SCHED, "--msccl", "OUT"], "--msccl"),
    (["show", SCHED, "--png", "OUT"], "--png"),
    (["show", SCHED, "--trace", "OUT"], "--trace"),
    (["run", SCHED, "--repeats", "100000", "--report", "OUT"], "--report"),
    (["topology", "-t", "dgx2", "--out", "OUT"], "--out"),
    (["train", "--iters", "1000000", "--report", "OUT"], "--report"),
    (["train", "--iters", "1000000", "--timeline", "OUT"], "--timeline"),
    (["train", "--iters", "1000000", "--trace", "OUT"], "--trace"),
    (["profile-task", "pagerank", "--steps", "100000", "--out", "OUT"], "--out"),
    (["profile-bubbles", "--iters", "1000000", "--out", "OUT"], "--out"),
]
DIRS = [
    (["train", "--iters", "1000000", "--run-dir", "OUT"], "--run-dir"),
    (["profile-bubbles", "--iters", "1000000", "--run-dir", "OUT"], "--run-dir"),
    (["demo", "--out-dir", "OUT"], "--out-dir"),
]


@pytest.fixture(scope="module")
def sched(tmp_path_factory) -> Path:
    from flowride.cli import main

    d = tmp_path_factory.mktemp("s")
    assert main(["synth", "-t", "ring", "--n", "3", "-s", "64KB", "-o", str(d / "s.json")]) == 0
    return d / "s.json"


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    (tmp / "a_file").write_text("x")
    return {
        "missing parent": (tmp / "no" / "such" / "out.json", "does not exist"),
        "a directory": (tmp, "is a directory"),
        "parent is a file": (tmp / "a_file" / "out.json", "not a directory"),
        "cannot create files": (Path("/proc/flowride-out.json"), "cannot write in /proc"),
    }


@pytest.mark.parametrize("case", ["missing parent", "a directory", "parent is a file", "cannot create files"])
@pytest.mark.parametrize(("args", "option"), OUTPUTS, ids=[f"{a[0]}{o}" for a, o in OUTPUTS])
def test_unwritable_output_fails_before_the_work(tmp_path, capfd, sched, args, option, case):
    path, problem = _bad_files(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    argv = [str(path) if a == "OUT" else str(sched) if a == SCHED else a for a in args]
    r = cli(*argv, cwd=tmp_path) if case == "missing parent" else cli_here(capfd, *argv, cwd=tmp_path)
    line = assert_clean_error(r, 2, option, problem, within=LONG_S if args[0] in LONG else None)
    assert line.startswith("error: flowride")
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, not even a temp file


@pytest.mark.parametrize(("args", "option"), DIRS, ids=[f"{a[0]}{o}" for a, o in DIRS])
def test_unusable_output_directory_fails_before_the_work(tmp_path, capfd, args, option):
    (tmp_path / "a_file").write_text("x")
    for k, (path, problem) in enumerate([(tmp_path / "a_file", "is a file"), (tmp_path / "a_file" / "sub", "is a file"),
                                         (Path("/proc/flowride/run"), "cannot create")]):
        argv = [str(path) if a == "OUT" else a for a in args]
        r = cli(*argv, cwd=tmp_path) if k == 0 else cli_here(capfd, *argv, cwd=tmp_path)
        assert_clean_error(r, 2, option, problem, within=LONG_S if args[0] in LONG else None)


def test_atomic_write_honours_the_umask_and_leaves_nothing_on_failure(tmp_path):
    old = os.umask(0o027)
    try:
        write_json_atomic(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
        os.umask(0o022)
        write_json_atomic(tmp_path / "b.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o644
    finally:
        os.umask(old)
    (tmp_path / "c.json").write_text("old")
    with pytest.raises(RuntimeError), atomic_write(tmp_path / "c.json") as f:
        f.write("half")
        raise RuntimeError("crash mid-write")
    assert (tmp_path / "c.json").read_text() == "old"  # the old file, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "c.json"]  # no temp file left


def test_every_writer_goes_through_the_one_helper():
    """No module writes a user-visible file by hand (mkstemp + rename, or write_text)."""
    src = Path(__file__).resolve().parents[1] / "src" / "flowride"
    offenders = []
    for py in src.rglob("*.py"):
        if py.name == "files.py":
            continue
        text = py.read_text()
        for needle in ("mkstemp(", "os.replace(", ".write_text(", ".savefig(path"):
            if needle in text:
                offenders.append(f"{py.relative_to(src)}: {needle}")
    assert offenders == []


def test_output_checks_name_the_field():
    with pytest.raises(InputError) as e:
        check_output_file("/proc/x/y.json", "--out")
    assert e.value.field == "--out" and "does not exist" in e.value.problem
    with pytest.raises(InputError) as e:
        check_output_dir("/proc/new", "--run-dir")
    assert e.value.field == "--run-dir" and "cannot create" in e.value.problem
