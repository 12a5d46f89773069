"""The manager's files read with checks, and ``manager stop`` signalling only the manager (issue
#26, class "manager files"): every case through ``flowride manager`` as a user runs it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

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


@pytest.mark.parametrize(("text", "needle"), [
    ('{"stages": 2, "mode": "freer', "manager.json"),  # cut short by a full disk
    ('{"stages": 2, "modes": "naive"}', "modes"),  # a key another version wrote
    ('{"mode": "naive"}', "stages"),
    ('{"stages": "two"}', "stages must be a positive integer"),
    ('[2]', "not a JSON object"),
])
@pytest.mark.parametrize("action", ["status", "restart"])  # stop needs only manager.pid
def test_a_damaged_manager_json_is_one_line(tmp_path, text, needle, action):
    d = _run_dir(tmp_path)
    (d / "manager.json").write_text(text)
    r = cli("manager", action, "--run-dir", d, timeout=30)
    assert_clean_error(r, 2, needle, within=15)


@pytest.mark.parametrize("text", ["abc", '"12"', "-5", '{"pid": true}', ""])
def test_a_damaged_manager_pid_is_one_line(tmp_path, text):
    d = _run_dir(tmp_path)
    (d / "manager.pid").write_text(text)
    r = cli("manager", "status", "--run-dir", d)
    assert_clean_error(r, 2, "manager.pid", within=15)


@pytest.fixture
def stranger():
    """An unrelated process, as one that took a dead manager's pid would be."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(0.2)
    yield p
    p.kill()
    p.wait()


@pytest.mark.parametrize("old_format", [False, True])
def test_stop_never_signals_a_process_that_reused_the_pid(tmp_path, stranger, old_format):
    d = _run_dir(tmp_path)
    rec = stranger.pid if old_format else {"pid": stranger.pid, "start_ticks": start_ticks(stranger.pid), "run_dir": str(d)}
    (d / "manager.pid").write_text(json.dumps(rec))
    r = cli("manager", "stop", "--run-dir", d)
    assert r.code == 0, r.err
    assert "not a flowride manager" in r.out and "nothing was signalled" in r.out
    time.sleep(0.3)
    assert stranger.poll() is None  # still running: it was not ours to stop
    st = cli("manager", "status", "--run-dir", d)
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
        r = cli("manager", "restart", "--run-dir", d, timeout=90)
        line = assert_clean_error(r, 1, "manager restart failed", within=60)
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
