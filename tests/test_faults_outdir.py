"""Output directories tried before the work, options never dropped silently, tables whole off a
terminal (issue #26, classes "files inside --out-dir", "options silently ignored", "output off a
terminal"). Each case runs the CLI as a user does."""

from __future__ import annotations

import json

import pytest

from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.files import atomic_write, check_output_tree


def test_a_sweep_file_name_taken_by_a_folder_is_refused_before_the_sweep(tmp_path):
    (tmp_path / "allgather_1000000B.json").mkdir()
    r = cli("synth", "-t", "dgx1", "--sizes", "1MB,2MB", "--out-dir", tmp_path, "--time-limit", "30")
    line = assert_clean_error(r, 2, "--out-dir", "allgather_1000000B.json", "is a directory", within=20)
    assert ".fr-" not in line and ".tmp" not in line
    assert not (tmp_path / "allgather_2000000B.json").exists()  # nothing half-written


def test_a_sweep_into_a_free_directory_writes_every_size(tmp_path):
    r = cli("synth", "-t", "ring", "--n", "4", "--sizes", "1K,4K", "--out-dir", tmp_path / "out", "--time-limit", "5")
    assert r.code == 0, r.err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["allgather_1024B.json", "allgather_4096B.json"]


@pytest.mark.parametrize(("make", "needle"), [
    (lambda d: (d / "xml").write_text("not a folder"), "xml is a file"),
    (lambda d: (d / "ranges.json").mkdir(), "ranges.json is a directory"),
    (lambda d: (d / "ranges.md").mkdir(), "ranges.md is a directory"),
])
def test_export_tries_xml_and_ranges_files_before_synthesizing(tmp_path, make, needle):
    make(tmp_path)
    r = cli("export", "-t", "dgx1", "--sizes", "1MB:64MB:x2", "--out-dir", tmp_path)
    assert_clean_error(r, 2, "--out-dir", needle, within=20)
    assert not (tmp_path / "xml").is_dir() or not any((tmp_path / "xml").iterdir())


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
    p = tmp_path_factory.mktemp("sched") / "s.json"
    r = cli("synth", "-t", "ring", "--n", "4", "-s", "1KB", "--chunks", "1", "--out", p, "--time-limit", "5")
    assert r.code == 0, r.err
    return p


@pytest.mark.parametrize(("args", "flag"), [
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
])
def test_an_option_the_command_would_not_use_is_refused(tmp_path, sched_file, args, flag):
    import shutil

    shutil.copy(sched_file, tmp_path / "s.json")
    r = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args], timeout=60)
    assert_clean_error(r, 2, flag, within=30)
    assert not (tmp_path / "d").exists() and not (tmp_path / "a.xml").exists()


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
