"""Output directories tried before the work, options never dropped silently, tables whole off a
terminal (issue #26, classes "files inside --out-dir", "options silently ignored", "output off a
terminal").

"Before the work" is shown on logical evidence: the cases run ``main()`` in this process
(clihere) with the work itself (the sweep's or the range export's synthesis) replaced by a
function that fails the test if it is called. One case of each kind also runs as a user runs it
(a subprocess: exit code, one line, no traceback); the tables off a terminal only can (rich
decides the width when the process starts)."""

from __future__ import annotations

import json
import shutil

import pytest

import flowride.sweep
import flowride.sweep.ranges
from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.files import atomic_write, check_output_tree


def _no_work(monkeypatch, module, name: str) -> None:
    """``module.name``, the work itself, fails the test if it is called."""

    def refuse(*a, **k):
        raise AssertionError(f"{name} ran for a command that should have been refused before it")

    monkeypatch.setattr(module, name, refuse)


def test_a_sweep_file_name_taken_by_a_folder_is_refused_before_the_sweep(tmp_path, capfd, monkeypatch):
    (tmp_path / "allgather_1000000B.json").mkdir()
    _no_work(monkeypatch, flowride.sweep, "synthesize_sweep")
    r = cli_here(capfd, "synth", "-t", "dgx1", "--sizes", "1MB,2MB", "--out-dir", tmp_path, "--time-limit", "30")
    line = assert_clean_error(r, 2, "--out-dir", "allgather_1000000B.json", "is a directory")
    assert ".fr-" not in line and ".tmp" not in line
    assert not (tmp_path / "allgather_2000000B.json").exists()  # nothing half-written


def test_a_sweep_into_a_free_directory_writes_every_size(tmp_path, capfd):
    r = cli_here(capfd, "synth", "-t", "ring", "--n", "4", "--sizes", "1K,4K", "--out-dir", tmp_path / "out", "--time-limit", "5")
    assert r.code == 0, r.err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["allgather_1024B.json", "allgather_4096B.json"]


TAKEN = [
    (lambda d: (d / "xml").write_text("not a folder"), "xml is a file"),
    (lambda d: (d / "ranges.json").mkdir(), "ranges.json is a directory"),
    (lambda d: (d / "ranges.md").mkdir(), "ranges.md is a directory"),
]
EXPORT = ["export", "-t", "dgx1", "--sizes", "1MB:64MB:x2", "--out-dir"]


@pytest.mark.parametrize(("make", "needle"), TAKEN, ids=[n for _, n in TAKEN])
def test_export_tries_xml_and_ranges_files_before_synthesizing(tmp_path, capfd, monkeypatch, make, needle):
    make(tmp_path)
    _no_work(monkeypatch, flowride.sweep.ranges, "plan_ranges")
    assert_clean_error(cli_here(capfd, *EXPORT, tmp_path), 2, "--out-dir", needle)
    assert not (tmp_path / "xml").is_dir() or not any((tmp_path / "xml").iterdir())


def test_an_export_into_a_taken_name_as_a_process_sees_it(tmp_path):
    (tmp_path / "xml").write_text("not a folder")
    assert_clean_error(cli(*EXPORT, tmp_path), 2, "--out-dir", "xml is a file")


def test_check_output_tree_refuses_a_file_where_a_folder_is_needed(tmp_path):
    (tmp_path / "a").write_text("")
    with pytest.raises(InputError, match="a is a file"):
        check_output_tree(tmp_path, ["a/b.json"], "out")
    assert check_output_tree(tmp_path / "new", ["x/y.json"], "out") == tmp_path / "new"


def test_a_failed_atomic_write_names_the_target_not_the_temp_file(tmp_path):
    (tmp_path / "t.json").mkdir()
    with pytest.raises(OSError) as e, atomic_write(tmp_path / "t.json") as f:
        f.write("{}")
    assert "t.json" in str(e.value) and ".fr-" not in str(e.value)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".fr-")]


@pytest.fixture(scope="module")
def sched_file(tmp_path_factory):
    """One real schedule, synthesized once for every case below."""
    from flowride.cli import main

    p = tmp_path_factory.mktemp("sched") / "s.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-s", "1KB", "--chunks", "1", "--out", str(p), "--time-limit", "5"]) == 0
    return p


UNUSED = [
    (["synth", "-t", "dgx1", "-s", "1MB", "--out-dir", "{tmp}/d"], "--out-dir"),
    (["synth", "-t", "dgx1", "-s", "1MB", "--json"], "--json"),
    (["synth", "-t", "dgx1", "-s", "1MB", "--no-warm-start"], "--no-warm-start"),
    (["export", "{tmp}/s.json", "--msccl", "{tmp}/a.xml", "--clean"], "--clean"),
    (["export", "{tmp}/s.json", "--msccl", "{tmp}/a.xml", "--max-loss", "1.5"], "--max-loss"),
    (["export", "{tmp}/s.json", "--msccl", "{tmp}/a.xml", "--epochs", "slow"], "--epochs"),
    (["export", "-t", "dgx1", "--sizes", "1MB", "--out-dir", "{tmp}/d", "--json"], "--json"),
    (["run", "{tmp}/s.json", "--json"], "--json"),
    (["run", "{tmp}/s.json", "-s", "1MB", "--sizes", "1MB,2MB"], "--size"),
    (["train", "--side-tasks", ""], "--side-tasks"),
    (["train", "--side-tasks", " , "], "--side-tasks"),
]


@pytest.mark.parametrize(("args", "flag"), UNUSED, ids=[f"{a[0]} {f}" for a, f in UNUSED])
def test_an_option_the_command_would_not_use_is_refused(tmp_path, capfd, sched_file, args, flag):
    shutil.copy(sched_file, tmp_path / "s.json")
    r = cli_here(capfd, *[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert_clean_error(r, 2, flag)
    assert not (tmp_path / "d").exists() and not (tmp_path / "a.xml").exists()


@pytest.mark.parametrize("args", [UNUSED[0][0], UNUSED[7][0]], ids=["synth", "run"])
def test_an_unused_option_as_a_process_sees_it(tmp_path, sched_file, args):
    """synth and run (which imports torch) end to end."""
    shutil.copy(sched_file, tmp_path / "s.json")
    r = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert_clean_error(r, 2, args[-1] if args[-1].startswith("--") else "--out-dir")
    assert not (tmp_path / "d").exists()


def test_tables_stay_whole_off_a_terminal(tmp_path):
    """Piped (no terminal, no $COLUMNS), a wide table keeps every name and verdict whole."""
    r = cli("topologies", env={"COLUMNS": ""})
    assert r.code == 0, r.err
    assert "…" not in r.out
    assert max(len(line) for line in r.out.splitlines()) > 80  # rich's 80-column fallback would have squeezed it
    rep = tmp_path / "r.json"
    r = cli("synth", "-t", "ndv2", "--chassis", "2", "--teccl-compat", "-s", "1MB", "--chunks", "1", "--time-limit", "10",
            "--report", rep, env={"COLUMNS": ""})
    assert r.code == 0, r.err
    assert "…" not in r.out and json.loads(rep.read_text())["topology"] in r.out
