"""The manager's files read with checks, and ``manager stop`` signalling only the manager (issue
#26, class "manager files"): every case through ``flowride manager``, one of each kind as a
user runs it (clirun: a subprocess), the other inputs of that kind through ``main()`` in this
process (clihere), which returns the same exit code and prints the same line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.harvest.manager_files import (
    ManagerOptions,
    PidRecord,
    is_our_manager,
    read_options,
    read_pid,
    start_ticks,
    write_options,
)


def _run_dir(tmp_path, **opts):
    d = tmp_path / "run"
    d.mkdir()
    write_options(d, ManagerOptions(stages=2, **opts))
    return d


def _manager(action: str, d) -> tuple:
    return ("manager", action, "--run-dir", d)


AS_A_PROCESS = {('{"stages": 2, "mode": "freer', "status"), ('{"stages": 2, "modes": "naive"}', "restart")}


@pytest.mark.parametrize(("text", "needle"), [
    ('{"stages": 2, "mode": "freer', "manager.json"),  # cut short by a full disk
    ('{"stages": 2, "modes": "naive"}', "modes"),  # a key another version wrote
    ('{"mode": "naive"}', "stages"),
    ('{"stages": "two"}', "stages must be a positive integer"),
    ('[2]', "not a JSON object"),
])
@pytest.mark.parametrize("action", ["status", "restart"])  # stop needs only manager.pid
def test_a_damaged_manager_json_is_one_line(tmp_path, capfd, text, needle, action):
    d = _run_dir(tmp_path)
    (d / "manager.json").write_text(text)
    r = cli(*_manager(action, d), timeout=60) if (text, action) in AS_A_PROCESS else cli_here(capfd, *_manager(action, d))
    assert_clean_error(r, 2, needle)
    assert not (d / "manager.pid").exists()  # no manager was started on options it could not read


@pytest.mark.parametrize("text", ["abc", '"12"', "-5", '{"pid": true}', ""])
def test_a_damaged_manager_pid_is_one_line(tmp_path, capfd, text):
    d = _run_dir(tmp_path)
    (d / "manager.pid").write_text(text)
    r = cli(*_manager("status", d)) if text == "abc" else cli_here(capfd, *_manager("status", d))
    assert_clean_error(r, 2, "manager.pid")


@pytest.fixture
def stranger():
    """An unrelated process, as one that took a dead manager's pid would be."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    p.kill()
    p.wait()


def _signals_pending(pid: int) -> int:
    """The signals sent to ``pid`` and not yet acted on (a fatal one stays pending until the
    process is gone), from the kernel's record."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)


@pytest.mark.parametrize("old_format", [False, True])
def test_stop_never_signals_a_process_that_reused_the_pid(tmp_path, capfd, stranger, old_format):
    d = _run_dir(tmp_path)
    rec = stranger.pid if old_format else {"pid": stranger.pid, "start_ticks": start_ticks(stranger.pid), "run_dir": str(d)}
    (d / "manager.pid").write_text(json.dumps(rec))
    r = cli_here(capfd, *_manager("stop", d)) if old_format else cli(*_manager("stop", d))
    assert r.code == 0, r.err
    assert "not a flowride manager" in r.out and "nothing was signalled" in r.out
    # kill() queues a signal before it returns, and stop has returned: a signal it sent would
    # show as pending now, or the process would be gone; no waiting needed to see either
    assert stranger.poll() is None and _signals_pending(stranger.pid) == 0  # it was not ours to stop
    st = cli_here(capfd, *_manager("status", d))
    assert st.code == 0 and json.loads(st.out)["alive"] is False


def test_a_pid_whose_start_time_differs_is_not_the_manager(tmp_path, stranger):
    d = _run_dir(tmp_path)
    ok, why = is_our_manager(PidRecord(stranger.pid, start_ticks(stranger.pid) - 1, str(d)), d)
    assert not ok and "reused" in why


def test_restart_with_its_port_taken_is_one_line_exit_1(tmp_path):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    try:
        d = _run_dir(tmp_path, port=s.getsockname()[1])
        r = cli("manager", "restart", "--run-dir", d, timeout=120)
        line = assert_clean_error(r, 1, "manager restart failed")
        assert "Address already in use" in line or "in use" in line
    finally:
        s.close()


def test_read_options_round_trips_and_names_bad_values(tmp_path):
    d = _run_dir(tmp_path, mode="naive", port=1234)
    assert read_options(d) == ManagerOptions(stages=2, mode="naive", port=1234)
    (d / "manager.json").write_text('{"stages": 2, "port": 70000}')
    with pytest.raises(InputError, match="port"):
        read_options(d)
    assert read_pid(d) is None
