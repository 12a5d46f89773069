"""Unknown or malformed input files (issue #16, class 3): every input file is checked against
its schema; unknown keys are refused with the known ones listed; nothing crashes.

Each kind of refusal runs once as a user runs it (clirun: a subprocess, its exit code, one line,
no traceback); the other inputs of the same kind call ``main()`` in this process (clihere), which
returns the same code and prints the same line, without paying an interpreter and its imports per
input."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.schedule.ir import Schedule
from flowride.topology import ring
from flowride.topology.io import topology_from_dict, topology_to_dict
from flowride.topology.model import Topology


def _write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _ring() -> dict:
    return topology_to_dict(ring(4))


@pytest.mark.parametrize(("edit", "field", "known"), [
    (lambda d: d["links"][2].update(alpha_ns=700), "links[2].alpha_ns", "alpha_us"),
    (lambda d: d["links"][0].update(bandwidth=50), "links[0].bandwidth", "bandwidth_GBps"),
    (lambda d: d["nodes"][1].update(cpy=True), "nodes[1].cpy", "copy"),
    (lambda d: d.update(link=[]), "topology.link", "links"),
])
def test_misspelled_topology_key_is_refused_with_the_known_keys(tmp_path, capfd, edit, field, known):
    d = _ring()
    edit(d)
    r = cli_here(capfd, "synth", "-t", _write(tmp_path / "t.json", d), "-s", "1MB")
    assert_clean_error(r, 2, field, "not a known key", "known keys:", known)


def test_a_misspelled_key_as_a_process_sees_it(tmp_path):
    d = _ring()
    d["links"][2]["alpha_ns"] = 700
    r = cli("synth", "-t", _write(tmp_path / "t.json", d), "-s", "1MB")
    assert_clean_error(r, 2, "links[2].alpha_ns", "not a known key", "known keys:", "alpha_us")


MALFORMED_JSON = [
    ("[" * 100_000 + "]" * 100_000, "nests too deeply"),
    ('{"nodes": ' * 5000 + "1" + "}" * 5000, "nests too deeply"),
    ("{", "not valid JSON"),
    ("", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
]
READERS = (["synth", "-t", "FILE", "-s", "1MB"], ["verify", "FILE"], ["train", "--bubble-profile", "FILE", "--iters", "1"])


@pytest.mark.parametrize(("text", "problem"), MALFORMED_JSON, ids=["deep list", "deep object", "cut short", "empty", "not UTF-8"])
def test_malformed_json_files_are_clean_errors(tmp_path, capfd, text, problem):
    p = tmp_path / "t.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    for args in READERS:
        assert_clean_error(cli_here(capfd, *[str(p) if a == "FILE" else a for a in args], cwd=tmp_path), 2, problem)


@pytest.mark.parametrize("args", READERS, ids=[a[0] for a in READERS])
def test_a_malformed_json_file_as_a_process_sees_it(tmp_path, args):
    """Each reader once end to end, on the file nested deepest (a recursion that must not crash
    the interpreter)."""
    p = tmp_path / "t.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    assert_clean_error(cli(*[str(p) if a == "FILE" else a for a in args], cwd=tmp_path), 2, "nests too deeply")


def test_a_directory_given_as_an_input_file(tmp_path):
    assert_clean_error(cli("verify", tmp_path), 2, "is a directory")


def test_unknown_schedule_key_is_refused(tmp_path, capfd):
    from flowride.api import synthesize

    d = synthesize(ring(3), "allgather", 1 << 16, "fast").schedule.to_dict()
    d["epoch_duration"] = 1e-6
    assert_clean_error(cli_here(capfd, "verify", _write(tmp_path / "s.json", d)), 2, "schedule.epoch_duration", "known keys")
    d = synthesize(ring(3), "allgather", 1 << 16, "fast").schedule.to_dict()
    d["sends"][0][0] = -5
    assert_clean_error(cli_here(capfd, "verify", _write(tmp_path / "s.json", d)), 2, "sends[0][0]", "outside")


# ------------------------------------------------------------------------- the task store


def _store_cases(tmp: Path) -> dict[str, Path]:
    out = {}
    d = tmp / "corrupt"
    d.mkdir()
    (d / "tasks.sqlite").write_bytes(b"this is not an sqlite database, just bytes" * 100)
    out["corrupt"] = d
    d = tmp / "schema"
    d.mkdir()
    db = sqlite3.connect(d / "tasks.sqlite")
    db.execute("CREATE TABLE tasks (id INTEGER PRIMARY KEY, what TEXT)")
    db.commit()
    db.close()
    out["wrong schema"] = d
    d = tmp / "dir"
    (d / "tasks.sqlite").mkdir(parents=True)
    out["directory in place of the file"] = d
    return out


@pytest.mark.parametrize("case", ["corrupt", "wrong schema", "directory in place of the file"])
@pytest.mark.parametrize("action", [["list"], ["show", "1"], ["cancel", "1"], ["submit", "pagerank"]], ids=lambda a: a[0])
def test_broken_task_store_is_a_clean_error(tmp_path, capfd, case, action):
    """Every action on every broken store; ``list`` as a process, the others in this process."""
    d = _store_cases(tmp_path)[case]
    args = ("tasks", *action, "--run-dir", d)
    r = cli(*args) if action == ["list"] else cli_here(capfd, *args)
    assert_clean_error(r, 2, "--run-dir", "task store" if case != "directory in place of the file" else "is a directory")


@pytest.mark.parametrize("cmd", [["tasks", "submit", "pagerank", "--run-dir", "RUN"], ["profile-task", "pagerank", "--steps", "1"]])
def test_unknown_params_are_refused_at_submission(tmp_path, cmd):
    """As a process, both commands that take --params; nothing of the params reaches the store."""
    args = [str(tmp_path) if a == "RUN" else a for a in cmd]
    r = cli(*args, "--params", '{"nodes": 100, "dampingg": 0.9}')
    assert_clean_error(r, 2, "--params", "dampingg")
    assert not (tmp_path / "tasks.sqlite").exists() or "dampingg" not in (tmp_path / "tasks.sqlite").read_bytes().decode(errors="replace")


# ------------------------------------------------------------------------- properties

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)


@st.composite
def mutated_topology(draw):
    d = _ring()
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.sampled_from(["top", "nodes", "links"]))
        inner = d.get(where) if where != "top" else None
        if where != "top" and not (isinstance(inner, list) and inner and all(isinstance(x, dict) for x in inner)):
            where = "top"  # that list was already mutated away
        target = d if where == "top" else draw(st.sampled_from(d[where]))
        key = draw(st.sampled_from([*target.keys(), "alpha_ns", "x", "bandwidth"]))
        if draw(st.booleans()):
            target[key] = draw(JSON)
        else:
            target.pop(key, None)
    return d


@given(mutated_topology() | JSON)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_topology_json_parses_or_raises_input_error(data):
    """Property: a JSON value is either a valid topology or an InputError, never another error."""
    try:
        t = topology_from_dict(data)
    except InputError as e:
        assert e.field and e.problem
        return
    assert isinstance(t, Topology) and len(t.gpus) >= 2


@given(st.dictionaries(st.sampled_from(["schema", "collective", "size_bytes", "chunks", "epoch_duration_s", "topology",
                                        "sends", "meta", "extra"]), JSON, max_size=9))
@settings(max_examples=200, deadline=None)
def test_random_schedule_json_parses_or_raises_input_error(data):
    try:
        Schedule.from_dict(data)
    except InputError:
        return


@pytest.mark.parametrize(("task", "params", "needle"), [
    ("pagerank", {"n": 1e12}, "not an integer"),
    ("pagerank", {"n": "20000"}, "not an integer"),
    ("pagerank", {"n": True}, "not an integer"),
    ("pagerank", {"damping": float("nan")}, "not a finite number"),
    ("pagerank", {"n": 10**13}, "n <= 10,000,000"),
    ("pagerank", {"n": 10**6, "avg_degree": 500}, "over the limit"),
    ("sssp", {"source": "a"}, "not an integer or null"),
    ("cnn", {"image_size": 100_000}, "8..512"),
    ("cnn", {"device": 3}, "not a string"),
    ("image", {"antialias": 1}, "not true or false"),
    ("image", {"out_size": 10**6}, "8..4096"),
])
def test_task_params_of_the_wrong_type_or_size_are_refused(task, params, needle):
    from flowride.harvest.task import check_params

    with pytest.raises(InputError) as e:
        check_params(task, params)
    assert e.value.field == "params" and needle in e.value.problem, e.value


def test_odd_input_paths_are_clean_errors(tmp_path, capfd):
    # /dev/zero has no size to stat: read up to the limit, refused (about a second of CPU for
    # 256 MiB; a reader without a limit would never end)
    assert_clean_error(cli("verify", "/dev/zero"), 2, "over the 256 MiB limit", within=30)
    assert_clean_error(cli_here(capfd, "verify", "x" * 300 + ".json"), 2, "File name too long")
    assert_clean_error(cli_here(capfd, "topology", "-t", "ring", "--out", tmp_path / ("y" * 300 + ".json")), 2, "--out", "255")


def test_huge_numbers_in_files_and_params_do_not_overflow(tmp_path, capfd):
    from flowride.api import synthesize

    d = synthesize(ring(3), "allgather", 1 << 16, "fast").schedule.to_dict()
    d["epoch_duration_s"] = 10**400
    assert_clean_error(cli_here(capfd, "verify", _write(tmp_path / "s.json", d)), 2, "epoch_duration_s")
    d = synthesize(ring(3), "allgather", 1 << 16, "fast").schedule.to_dict()
    d["size_bytes"] = 0
    line = assert_clean_error(cli_here(capfd, "verify", _write(tmp_path / "s.json", d)), 2, "size_bytes")
    assert "--size" not in line  # the file's field, not an option verify does not have
    (tmp_path / "run").mkdir()
    r = cli_here(capfd, "tasks", "submit", "cnn", "--run-dir", tmp_path / "run", "--params", '{"lr": 1' + "0" * 400 + "}")
    assert_clean_error(r, 2, "--params", "not a finite number")


def test_a_send_on_a_link_the_topology_lacks_is_refused_by_run_and_export(tmp_path, capfd):
    """verify and show said so; run and export stopped with an IndexError traceback. ``run`` as a
    process (it imports torch); export in this process."""
    good = tmp_path / "s.json"
    assert cli_here(capfd, "synth", "-t", "ring", "--n", "4", "-s", "1MB", "--chunks", "1", "--time-limit", "5", "-o", good).code == 0
    d = json.loads(good.read_text())
    d["sends"][0][1] = 99
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps(d))
    for r in (cli_here(capfd, "export", bad, "--msccl", tmp_path / "x.xml"), cli("run", bad)):
        assert r.code != 0 and "Traceback" not in r.err and "no link 99" in r.err, r.err


@pytest.mark.parametrize(("text", "option"), [
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV4\t0-15\nGPU1\tNV4\t X \t0-15\n\nLegend:\n  X    = Self\n", "--from-nvidia-smi"),
    ('<?xml version="1.0"?>\n<system version="1">\n  <cpu numaid="0">\n', "--from-nccl-xml"),
])
def test_a_machine_dump_given_as_topology_json_names_its_importer(tmp_path, capfd, text, option):
    dump = tmp_path / "dump.txt"
    dump.write_text(text)
    assert_clean_error(cli_here(capfd, "synth", "-t", dump, "-s", "1MB"), 2, option)


def test_train_help_lists_every_model_preset(capfd):
    r = cli_here(capfd, "train", "--help")
    assert r.code == 0 and all(name in r.out for name in ("tiny", "small", "medium", "large"))
