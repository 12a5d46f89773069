"""The exit-code contract (issue #16, class 9; README "Exit codes"), subcommand by subcommand:
0 success; 1 the input was understood and found wrong, or the work failed; 2 bad input (an
option or a file the command cannot use). Every failure is one line on stderr, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clirun import assert_clean_error, cli
from test_msccl import MALFORMED

XML = {name: text for name, text, *_ in MALFORMED}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("codes")
    out = {"good": d / "good.json", "race": d / "race.xml", "deadlock": d / "deadlock.xml", "bad": d / "bad.json",
           "run": d / "run"}
    assert cli("synth", "-t", "ring", "--n", "2", "-s", "64KB", "-o", out["good"]).code == 0
    out["race"].write_text(XML["race"])
    out["deadlock"].write_text(XML["deadlock"])
    sched = json.loads(out["good"].read_text())
    sched["sends"] = sched["sends"][1:]  # drop a send: a GPU never receives a block (understood, found wrong)
    out["bad"].write_text(json.dumps(sched))
    out["run"].mkdir()
    return out


def test_ok_is_zero(files, tmp_path):
    for args in (["verify", files["good"]], ["export", files["good"], "--msccl", tmp_path / "a.xml"],
                 ["show", files["good"], "--trace", tmp_path / "t.json"], ["topologies"],
                 ["topology", "-t", "ring", "--n", "3"], ["schedule-show", "1f1b"], ["tasks", "list", "--run-dir", files["run"]],
                 ["synth", "-t", "ring", "--n", "3", "-s", "64KB"]):
        r = cli(*args)
        assert r.code == 0, (args, r.err)


# export reads flowride schedules only (an XML there is a usage error, tested below)
WRONG = [(c, w) for c in ("verify", "show", "run", "export") for w in ("race", "deadlock", "bad") if c != "export" or w == "bad"]


@pytest.mark.parametrize(("cmd", "which"), WRONG)
def test_understood_and_wrong_is_one(files, tmp_path, cmd, which):
    extra = {"show": ["--trace", tmp_path / "t.json"], "export": ["--msccl", tmp_path / "a.xml"], "run": ["--timeout", "60"]}.get(cmd, [])
    r = cli(cmd, files[which], *extra)
    assert_clean_error(r, 1, "invalid: ", "race" if which == "race" else "deadlock" if which == "deadlock" else "", within=60)
    assert not (tmp_path / "a.xml").exists()
    # show draws an invalid schedule anyway (the picture shows where it goes wrong); an XML with a
    # race or deadlock cannot be replayed, so nothing is drawn
    assert (tmp_path / "t.json").exists() == (cmd == "show" and which == "bad")


@pytest.mark.parametrize("args", [
    ["synth", "-t", "nosuch", "-s", "1MB"], ["synth", "-t", "ring", "--n", "3", "-s", "lots"],
    ["verify", "missing.json"], ["export", "missing.json", "--msccl", "a.xml"], ["export", "XML", "--msccl", "a.xml"],
    ["show", "missing.json", "--png", "a.png"], ["show", "GOOD"], ["run", "missing.json"],
    ["topology", "-t", "nosuch"], ["train", "--data", "missing.txt", "--iters", "1"], ["train", "--engine", "nosuch"],
    ["manager", "status", "--run-dir", "RUN"], ["profile-task", "nosuch"], ["tasks", "submit", "nosuch", "--run-dir", "RUN"],
    ["profile-bubbles", "--schedule", "nosuch"], ["schedule-show", "nosuch"], ["demo", "--out-dir", "/proc/x"],
    ["nosuch-command"], [],
])
def test_bad_input_is_two(files, tmp_path, args):
    subst = {"XML": files["race"], "GOOD": files["good"], "RUN": files["run"]}
    r = cli(*[subst.get(a, a) for a in args], cwd=tmp_path)
    assert_clean_error(r, 2, "error: ", within=60)


def test_failed_run_is_one(files):
    """A rank that crashes: the run failed (1), naming the rank."""
    r = cli("run", files["good"], "--timeout", "60", env={"FLOWRIDE_COMM_INJECT_FAULT": "crash:1"})
    assert r.code == 1 and "rank 1" in r.err and "Traceback" not in r.err, r.err
