"""The exit-code contract (issue #16, class 9; README "Exit codes"), subcommand by subcommand:
0 success; 1 the input was understood and found wrong, or the work failed; 2 bad input (an
option or a file the command cannot use). Every failure is one line on stderr, no traceback.

``python -m flowride.cli`` exits with what ``flowride.cli.main`` returns, so most cases call
``main`` in this process (clihere: the code, the captured stderr); each exit code keeps cases
run as a user runs them (clirun: a subprocess), among them every command that starts ranks or
imports torch, where the process's own exit could differ (threads left running at exit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import flowride.comm.launch as comm_launch
from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.cli import main
from test_msccl import MALFORMED

XML = {name: text for name, text, *_ in MALFORMED}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("codes")
    out = {"good": d / "good.json", "race": d / "race.xml", "deadlock": d / "deadlock.xml", "bad": d / "bad.json",
           "run": d / "run"}
    assert main(["synth", "-t", "ring", "--n", "2", "-s", "64KB", "-o", str(out["good"])]) == 0
    out["race"].write_text(XML["race"])
    out["deadlock"].write_text(XML["deadlock"])
    sched = json.loads(out["good"].read_text())
    sched["sends"] = sched["sends"][1:]  # drop a send: a GPU never receives a block (understood, found wrong)
    out["bad"].write_text(json.dumps(sched))
    out["run"].mkdir()
    return out


@pytest.fixture
def no_ranks(monkeypatch):
    """Any rank group started fails the test: a refusal is made before the ranks exist."""

    def refuse(*a, **k):
        raise AssertionError("ranks were started for input that should have been refused")

    monkeypatch.setattr(comm_launch, "RankGroup", refuse)


OK = [["synth", "-t", "ring", "--n", "3", "-s", "64KB"], ["schedule-show", "1f1b"], ["tasks", "list", "--run-dir", "RUN"]]
OK_HERE = [["verify", "GOOD"], ["export", "GOOD", "--msccl", "TMP/a.xml"], ["show", "GOOD", "--trace", "TMP/t.json"], ["topologies"],
           ["topology", "-t", "ring", "--n", "3"]]


def _args(args: list[str], files: dict[str, Path], tmp: Path) -> list[str]:
    subst = {"GOOD": str(files["good"]), "RUN": str(files["run"]), "XML": str(files["race"])}
    return [subst.get(a, a.replace("TMP", str(tmp))) for a in args]


def test_ok_is_zero(files, tmp_path, capfd):
    for args in OK:
        r = cli(*_args(args, files, tmp_path))
        assert r.code == 0, (args, r.err)
    for args in OK_HERE:
        r = cli_here(capfd, *_args(args, files, tmp_path))
        assert r.code == 0, (args, r.err)


# export reads flowride schedules only (an XML there is a usage error, tested below)
WRONG = [(c, w) for c in ("verify", "show", "run", "export") for w in ("race", "deadlock", "bad") if c != "export" or w == "bad"]
WRONG_AS_A_PROCESS = {("verify", "deadlock"), ("run", "bad")}


@pytest.mark.parametrize(("cmd", "which"), WRONG)
def test_understood_and_wrong_is_one(files, tmp_path, capfd, no_ranks, cmd, which):
    extra = {"show": ["--trace", tmp_path / "t.json"], "export": ["--msccl", tmp_path / "a.xml"], "run": ["--timeout", "60"]}.get(cmd, [])
    r = cli(cmd, files[which], *extra) if (cmd, which) in WRONG_AS_A_PROCESS else cli_here(capfd, cmd, files[which], *extra)
    assert_clean_error(r, 1, "invalid: ", "race" if which == "race" else "deadlock" if which == "deadlock" else "")
    assert not (tmp_path / "a.xml").exists()
    # show draws an invalid schedule anyway (the picture shows where it goes wrong); an XML with a
    # race or deadlock cannot be replayed, so nothing is drawn
    assert (tmp_path / "t.json").exists() == (cmd == "show" and which == "bad")


# as a process: every command that imports only the CLI (cheap) and the parser's own refusals;
# the ones that import the library or torch, in this process (their subcommands' refusals run as
# a process in test_faults_outputs, test_faults_launch, test_faults_numbers, test_faults_files)
BAD = [
    (["synth", "-t", "nosuch", "-s", "1MB"], False), (["synth", "-t", "ring", "--n", "3", "-s", "lots"], False),
    (["verify", "missing.json"], False), (["export", "missing.json", "--msccl", "a.xml"], False),
    (["export", "XML", "--msccl", "a.xml"], False), (["show", "missing.json", "--png", "a.png"], False), (["show", "GOOD"], False),
    (["run", "missing.json"], False), (["topology", "-t", "nosuch"], False), (["train", "--data", "missing.txt", "--iters", "1"], False),
    (["train", "--engine", "nosuch"], False), (["manager", "status", "--run-dir", "RUN"], True), (["profile-task", "nosuch"], True),
    (["tasks", "submit", "nosuch", "--run-dir", "RUN"], True), (["profile-bubbles", "--schedule", "nosuch"], False),
    (["schedule-show", "nosuch"], True), (["demo", "--out-dir", "/proc/x"], True), (["nosuch-command"], True), ([], True),
]


@pytest.mark.parametrize(("args", "as_process"), BAD, ids=[" ".join(a[:2]) or "no args" for a, _ in BAD])
def test_bad_input_is_two(files, tmp_path, capfd, no_ranks, args, as_process):
    args = _args(args, files, tmp_path)
    r = cli(*args, cwd=tmp_path) if as_process else cli_here(capfd, *args, cwd=tmp_path)
    assert_clean_error(r, 2, "error: ")


def test_failed_run_is_one(files):
    """A rank that crashes: the run failed (1), naming the rank."""
    r = cli("run", files["good"], "--timeout", "300", env={"FLOWRIDE_COMM_INJECT_FAULT": "crash:1"})
    assert r.code == 1 and "rank 1" in r.err and "Traceback" not in r.err, r.err
