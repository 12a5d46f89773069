"""Launch mistakes found before any rank starts (issue #26, class "launch"): ``--device cuda``
without CUDA, and torchrun variables left over in a shell, each one line at once."""

from __future__ import annotations

import pytest
import torch

from clirun import assert_clean_error, cli
from flowride.errors import InputError
from flowride.ranks import check_world, launched_as_rank, pick_device, rank_and_world

LEFTOVER = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@pytest.fixture(scope="module")
def sched(tmp_path_factory):
    p = tmp_path_factory.mktemp("s") / "s.json"
    r = cli("synth", "-t", "ring", "--n", "4", "-s", "1KB", "--chunks", "1", "--out", p, "--time-limit", "5")
    assert r.code == 0, r.err
    return p


@NO_CUDA
def test_train_on_cuda_without_cuda_is_refused_before_the_stages_start(tmp_path):
    r = cli("train", "--device", "cuda", "--iters", "1", "--run-dir", tmp_path / "rd")
    assert_clean_error(r, 2, "--device", "cuda", within=15)
    assert not (tmp_path / "rd").exists() or not any((tmp_path / "rd").rglob("*.log"))


@pytest.mark.parametrize("cmd", [["run", "{s}"], ["train", "--iters", "1"]])
def test_leftover_torchrun_variables_are_one_line_at_once(tmp_path, sched, cmd):
    args = [c.replace("{s}", str(sched)) for c in cmd] + (["--run-dir", str(tmp_path / "rd")] if cmd[0] == "train" else [])
    r = cli(*args, env=LEFTOVER)
    line = assert_clean_error(r, 2, "RANK", "no launcher", "unset RANK", within=15)
    assert "FLOWRIDE_AS_RANK" in line


@pytest.mark.parametrize(("env", "needle"), [
    ({"RANK": "5", "WORLD_SIZE": "4"}, "not below WORLD_SIZE"),
    ({"RANK": "x", "WORLD_SIZE": "4"}, "not a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "below 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "not a port"),
])
def test_bad_rank_variables_under_torchrun_are_named(sched, env, needle):
    full = {**LEFTOVER, **env, "TORCHELASTIC_RUN_ID": "t"}
    r = cli("run", sched, env=full)
    assert_clean_error(r, 2, needle, within=15)


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
