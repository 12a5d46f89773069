"""Launch mistakes found before any rank starts (issue #26, class "launch"): ``--device cuda``
without CUDA, and torchrun variables left over in a shell, each one line at once.

"At once" is judged on logical evidence, not on time: no stage's log; in this process, no
rendezvous (``torch.distributed.init_process_group`` fails the test if called). CPU time could not
tell: a rank waiting for peers that never come uses almost none. A command that waited anyway
would meet clirun's bound for "it ends" and fail the test."""

from __future__ import annotations

import pytest
import torch

from clihere import cli_here
from clirun import assert_clean_error, cli
from flowride.cli import main
from flowride.errors import InputError
from flowride.ranks import check_world, launched_as_rank, pick_device, rank_and_world

LEFTOVER = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    p = tmp_path_factory.mktemp("s") / "s.json"
    assert main(["synth", "-t", "ring", "--n", "4", "-s", "1KB", "--chunks", "1", "--out", str(p), "--time-limit", "5"]) == 0
    return p


@NO_CUDA
def test_train_on_cuda_without_cuda_is_refused_before_the_stages_start(tmp_path):
    r = cli("train", "--device", "cuda", "--iters", "1", "--run-dir", tmp_path / "rd")
    assert_clean_error(r, 2, "--device", "cuda")
    assert not (tmp_path / "rd").exists() or not any((tmp_path / "rd").rglob("*.log"))  # no stage ever started


@pytest.mark.parametrize("cmd", [["run", "{s}"], ["train", "--iters", "1"]])
def test_leftover_torchrun_variables_are_one_line_at_once(tmp_path, sched, cmd):
    args = [c.replace("{s}", str(sched)) for c in cmd] + (["--run-dir", str(tmp_path / "rd")] if cmd[0] == "train" else [])
    r = cli(*args, env=LEFTOVER)
    line = assert_clean_error(r, 2, "RANK", "no launcher", "unset RANK")
    assert "FLOWRIDE_AS_RANK" in line


@pytest.mark.parametrize(("env", "needle"), [
    ({"RANK": "5", "WORLD_SIZE": "4"}, "not below WORLD_SIZE"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, "not a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "below 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "not a port"),
])
def test_bad_rank_variables_under_torchrun_are_named(sched, capfd, monkeypatch, env, needle):
    """In this process (the environment set for the call alone): refused before any rendezvous."""
    import torch.distributed as dist

    def no_rendezvous(*a, **k):
        raise AssertionError("a rendezvous was attempted with rank variables that should have been refused")

    monkeypatch.setattr(dist, "init_process_group", no_rendezvous)
    full = {**LEFTOVER, **env, "TORCHELASTIC_RUN_ID": "t"}
    assert_clean_error(cli_here(capfd, "run", sched, env=full), 2, needle)


def test_a_bad_rank_variable_under_torchrun_as_a_process_sees_it(sched):
    full = {**LEFTOVER, "RANK": "5", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "t"}
    assert_clean_error(cli("run", sched, env=full), 2, "not below WORLD_SIZE")


def test_rank_helpers():
    assert rank_and_world({"RANK": "2", "WORLD_SIZE": "4"}) == (2, 4)
    assert launched_as_rank({**LEFTOVER, "FLOWRIDE_AS_RANK": "1"})
    assert launched_as_rank({**LEFTOVER, "OMPI_COMM_WORLD_RANK": "1"})
    with pytest.raises(InputError, match="no launcher"):
        launched_as_rank(LEFTOVER)
    with pytest.raises(InputError, match="--stages"):
        check_world(2, 4, "--stages", "start 4")
    assert pick_device("cpu") == "cpu"
    with pytest.raises(InputError, match="unknown"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        assert pick_device("auto") == "cpu"
        with pytest.raises(InputError, match="cuda needs"):
            pick_device("cuda")
