"""Work that silently goes nowhere (issue #16, class 4): refused with a clear error instead of an
empty success or a store no manager will read."""

from __future__ import annotations

import pytest

from clihere import cli_here
from clirun import assert_clean_error, cli


def test_submit_into_a_missing_run_dir_is_refused_and_creates_nothing(tmp_path, capfd):
    missing = tmp_path / "no-such-run"
    r = cli("tasks", "submit", "pagerank", "--run-dir", missing)
    assert_clean_error(r, 2, "--run-dir", "does not exist")
    assert not missing.exists()
    assert_clean_error(cli_here(capfd, "tasks", "list", "--run-dir", missing), 2, "--run-dir", "does not exist")
    assert not missing.exists()


@pytest.mark.parametrize(("option", "value"), [("--steps", "0"), ("--seconds", "0"), ("--steps", "-1"), ("--seconds", "-2")])
def test_profile_task_with_no_work_is_refused(capfd, option, value):
    """The first as a process sees it, the others through main() in this process."""
    args = ("profile-task", "pagerank", f"{option}={value}")
    assert_clean_error(cli(*args) if (option, value) == ("--steps", "0") else cli_here(capfd, *args), 2, option)
