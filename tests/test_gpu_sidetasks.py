"""The GPU side tasks (gpu-cnn, gpu-transformer, gpu-pagerank, gpu-sssp, gpu-image).

On the CPU (what CI has): progress, real learning, correctness against scipy/networkx, exact
resumption from a pickled state (a property over where the run is cut), parameter checks that
name the field, identity checks, the host's RNG left alone, and no numpy inside a step. With
CUDA: placement on the device, the one-sync-per-step rule, a memory cap, and CUDA-event step
times from ``profile_task``. One end-to-end ``flowride profile-task`` run checks the CLI.
"""

from __future__ import annotations

import json
import math
import pickle
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import dijkstra

from clirun import cli
from flowride.harvest.task import IterativeTask, check_params, make_task, registered
from flowride.sidetasks.gpu_graph import GpuPageRankTask, GpuSsspTask, segment_spmv
from flowride.sidetasks.gpu_image import GpuImageTask

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
NAMES = ["gpu-cnn", "gpu-transformer", "gpu-pagerank", "gpu-sssp", "gpu-image"]

# Tiny sizes: a step takes a millisecond or two on one core.
SMALL: dict[str, dict[str, Any]] = {
    "gpu-cnn": {"batch_size": 16, "width": 8, "image_size": 16, "total_steps": 200},
    "gpu-transformer": {
        "batch_size": 8,
        "seq_len": 32,
        "vocab": 32,
        "d_model": 32,
        "n_layers": 1,
        "n_heads": 2,
        "total_steps": 200,
    },
    "gpu-pagerank": {"n": 2000, "sweeps_per_step": 2, "tol": 0.0, "max_sweeps": 200},
    "gpu-sssp": {"n": 2000, "sweeps_per_step": 1},
    "gpu-image": {"batch_size": 4, "in_size": 32, "out_size": 16, "total_batches": 50},
}


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """Task setup pins torch to one thread on the CPU (right for a side task); undo it here."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _new(name: str, device: str = "cpu", **overrides: Any) -> IterativeTask:
    task = make_task(name, {**SMALL[name], "device": device, **overrides})
    assert isinstance(task, IterativeTask)
    task.setup()
    return task


def _same(a: Any, b: Any, path: str = "state") -> None:
    """Bitwise equality of two nested states (tensors, dicts, lists, floats with NaN)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), path
    else:
        assert a == b, (path, a, b)


# ---------------------------------------------------------------- registry and params


def test_the_gpu_tasks_are_registered_by_entry_point() -> None:
    reg = registered()
    for name in NAMES:
        assert reg[name].name == name  # type: ignore[union-attr]
    import flowride.sidetasks as pkg

    assert pkg.GpuPageRankTask is GpuPageRankTask and pkg.GpuImageTask is GpuImageTask


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("gpu-cnn", {"batch_size": 0}, "batch_size"),
        ("gpu-cnn", {"momentum": 1.0}, "momentum"),
        ("gpu-transformer", {"d_model": 30, "n_heads": 4}, "d_model"),
        ("gpu-transformer", {"reset_prob": 1.5}, "reset_prob"),
        ("gpu-pagerank", {"damping": 1.0}, "damping"),
        ("gpu-pagerank", {"dtype": "float16"}, "dtype"),
        ("gpu-sssp", {"n": 10, "source": 10}, "source"),
        ("gpu-sssp", {"min_weight": 2.0, "max_weight": 1.0}, "max_weight"),
        ("gpu-image", {"filters": "blur,emboss"}, "filters"),
        ("gpu-image", {"mode": "lanczos"}, "mode"),
        ("gpu-image", {"device": "tpu"}, "device"),
        ("gpu-cnn", {"device": "cuda:x"}, "device"),
        ("gpu-pagerank", {"seed": -1}, "seed"),
    ],
)
def test_bad_params_name_the_field(name: str, params: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: param {field}=") as e:
        make_task(name, params)
    assert field in str(e.value)
    with pytest.raises(Exception, match=field):  # what `tasks submit` says: an InputError
        check_params(name, params)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_params_and_wrong_types_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="unknown params"):
        make_task(name, {"sed": 1})
    with pytest.raises(ValueError, match="device"):
        make_task(name, {"device": 0})


@pytest.mark.skipif(CUDA, reason="checks the error where CUDA is missing")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_without_cuda_is_a_clear_error(name: str) -> None:
    task = make_task(name, {**SMALL[name], "device": "cuda"})  # accepted: the runner may have one
    with pytest.raises(ValueError, match=rf"{name}: param device='cuda' but CUDA is not available"):
        task.setup()  # type: ignore[union-attr]
    assert make_task(name, {**SMALL[name], "device": "auto"}).params["device"] == "auto"


# ---------------------------------------------------------------- progress and correctness


@pytest.mark.parametrize("name", NAMES)
def test_steps_do_work_on_one_thread_and_leave_the_host_rng_alone(name: str) -> None:
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    task = _new(name)
    assert torch.get_num_threads() == 1
    units = [task.step() for _ in range(3)]
    assert all(u > 0 for u in units), units
    assert torch.equal(torch.get_rng_state(), before)


def _losses(name: str, steps: int) -> list[float]:
    task = _new(name)
    out = []
    for _ in range(steps):
        task.step()
        out.append(task.last_loss)  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize(("name", "drop"), [("gpu-cnn", 0.25), ("gpu-transformer", 1.5)])
def test_training_loss_really_falls(name: str, drop: float) -> None:
    losses = _losses(name, 60)
    first, last = np.mean(losses[:5]), np.mean(losses[-10:])
    assert last < first - drop, (first, last)


def test_the_transformer_learns_the_chain_beyond_unigrams() -> None:
    """Below ln(vocab) = 3.47 means it predicts from context (the chain), not token frequency."""
    assert np.mean(_losses("gpu-transformer", 60)[-10:]) < 0.7 * math.log(32)


def test_pagerank_sums_to_one_converges_and_matches_networkx() -> None:
    task = _new("gpu-pagerank", tol=1e-12, max_sweeps=500)
    assert isinstance(task, GpuPageRankTask)
    deltas = []
    while not task.finished():
        task.step()
        deltas.append(task.last_delta)
    assert deltas[-1] < 1e-12 < deltas[0] and deltas[-1] < deltas[len(deltas) // 2] < deltas[0]
    assert abs(float(task.ranks.sum()) - 1.0) < 1e-9
    g = nx.DiGraph()
    g.add_nodes_from(range(task.config.n))
    csr = task.matrix.to_sparse_coo().coalesce().indices()  # rows: dst, cols: src
    g.add_edges_from(zip(csr[1].tolist(), csr[0].tolist(), strict=True))
    ref = nx.pagerank(g, alpha=0.85, tol=1e-13, max_iter=1000)
    assert np.allclose(task.ranks.numpy(), [ref[i] for i in range(task.config.n)], atol=1e-9)


def test_the_cuda_spmv_path_equals_the_csr_product() -> None:
    """PageRank on CUDA sums rows with segment_reduce (deterministic); check it on the CPU."""
    task = _new("gpu-pagerank")
    assert isinstance(task, GpuPageRankTask)
    x = torch.rand(task.config.n, dtype=torch.float64)
    got = segment_spmv(task._rows, task._src, task._val, x)
    assert torch.allclose(got, torch.mv(task.matrix, x), rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sssp_matches_dijkstra(dtype: str) -> None:
    task = _new("gpu-sssp", dtype=dtype, sweeps_per_step=3)
    assert isinstance(task, GpuSsspTask)
    while not task.finished():
        assert task.step() == 3
    n = task.config.n
    w = sp.csr_matrix(
        (task.weight.double().numpy(), (task.src.numpy(), task.dst.numpy())), shape=(n, n)
    )
    ref = dijkstra(w, indices=task.source)
    got = task.dist.double().numpy()
    reach = np.isfinite(ref)
    assert np.array_equal(reach, np.isfinite(got)) and 100 < reach.sum() < n
    tol = 1e-12 if dtype == "float64" else 1e-4
    assert np.allclose(got[reach], ref[reach], rtol=tol, atol=tol)


def test_image_outputs_and_checksums() -> None:
    task = _new("gpu-image")
    assert isinstance(task, GpuImageTask) and task.kernel is not None
    out = task.kernel.process(0)
    assert out.shape == (4, 3, 16, 16) and out.dtype == torch.uint8 and 0 < out.float().mean() < 255
    assert torch.equal(out, task.kernel.process(0))  # batch 0 is a function of (seed, 0)
    assert not torch.equal(out, task.kernel.process(1))
    sums = [task.state()["checksum"]]
    for _ in range(3):
        assert task.step() == 4
        sums.append(task.state()["checksum"])
    assert len(set(sums)) == 4
    other = _new("gpu-image", seed=1)
    other.step()
    assert other.state()["checksum"] != sums[1]
    for filters in ("", "sobel", "blur,blur"):
        t = _new("gpu-image", filters=filters)
        assert t.kernel.process(0).shape == (4, 3, 16, 16)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- exact resumption


def _run(task: IterativeTask, steps: int) -> None:
    for _ in range(steps):
        task.step()


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=5, deadline=None)
@given(n=st.integers(0, 4), k=st.integers(1, 3))
def test_resume_is_bit_identical(name: str, n: int, k: int) -> None:
    """N steps, pickled state, a fresh task loads it, K more == N + K straight, bit for bit."""
    straight = _new(name)
    _run(straight, n + k)
    first = _new(name)
    _run(first, n)
    saved = first.state()
    blob = pickle.dumps(saved)
    _run(first, 2)  # the snapshot must not follow the task
    _same(saved, pickle.loads(blob))
    resumed = _new(name)
    resumed.load_state(pickle.loads(blob))
    _run(resumed, k)
    _same(resumed.state(), straight.state())


@pytest.mark.parametrize("name", NAMES)
def test_a_state_of_other_params_or_another_task_is_refused(name: str) -> None:
    saved = _new(name).state()
    assert saved["task"] == name and saved["identity"]["rng"] == "cpu"
    with pytest.raises(ValueError, match=rf"{name}: state was saved for different .*'seed'"):
        _new(name, seed=7).load_state(saved)
    other = "gpu-sssp" if name != "gpu-sssp" else "gpu-pagerank"
    with pytest.raises(ValueError, match=f"saved by task '{name}'"):
        _new(other).load_state(saved)
    _new(name, **PROGRESS[name]).load_state(saved)  # how far to go is not the model or data


PROGRESS = {
    "gpu-cnn": {"total_steps": 5},
    "gpu-transformer": {"total_steps": 5, "target_loss": 1.0},
    "gpu-pagerank": {"max_sweeps": 5, "sweeps_per_step": 3},
    "gpu-sssp": {"sweeps_per_step": 2},
    "gpu-image": {"total_batches": 5},
}


# ---------------------------------------------------------------- no host work in a step


@pytest.mark.parametrize("name", NAMES)
def test_a_step_calls_no_numpy(name: str) -> None:
    """Trace every Python and C call a step makes: none may land in numpy (data is made by
    torch generators on the task's device, not by numpy on the host)."""
    task = _new(name)
    task.step()  # warm-up: lazy imports and first-call paths
    np_dir = str(Path(np.__file__).parent)
    seen: list[str] = []

    def tracer(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(np_dir):
            seen.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")
        elif event == "c_call" and str(getattr(arg, "__module__", "") or "").startswith("numpy"):
            seen.append(repr(arg))

    sys.setprofile(tracer)
    try:
        task.step()
    finally:
        sys.setprofile(None)
    assert seen == []


# ---------------------------------------------------------------- CUDA only


@needs_cuda
@pytest.mark.parametrize("name", NAMES)
def test_on_cuda_everything_lives_on_the_device_and_a_step_syncs_once(name: str) -> None:
    task = _new(name, device="cuda")
    assert task.device.type == "cuda"  # type: ignore[attr-defined]
    tensors = [v for v in vars(task).values() if isinstance(v, torch.Tensor)]
    model = getattr(task, "model", None)
    if model is not None:
        tensors += list(model.parameters()) + list(model.buffers())
    kernel = getattr(task, "kernel", None)
    if kernel is not None:
        tensors += [v for v in vars(kernel).values() if isinstance(v, torch.Tensor)]
    assert tensors and all(t.is_cuda for t in tensors)
    task.step()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            task.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
    state = task.state()
    assert all(not t.is_cuda for t in _tensors(state))


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list | tuple):
        return [t for v in obj for t in _tensors(v)]
    return []


@needs_cuda
@pytest.mark.parametrize("name", NAMES)
def test_on_cuda_resume_is_bit_identical_too(name: str) -> None:
    """Every kernel a step runs is deterministic (PageRank's row sums, deterministic cuDNN)."""
    straight = _new(name, device="cuda")
    _run(straight, 5)
    first = _new(name, device="cuda")
    _run(first, 2)
    resumed = _new(name, device="cuda")
    resumed.load_state(pickle.loads(pickle.dumps(first.state())))
    _run(resumed, 3)
    _same(resumed.state(), straight.state())


@needs_cuda
def test_default_sizes_run_under_a_memory_cap_and_the_cap_binds() -> None:
    total = torch.cuda.get_device_properties(0).total_memory
    cap = 1 << 30
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap / total)
    try:
        for name in NAMES:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            task = make_task(name, {"device": "cuda"})
            task.setup()  # type: ignore[union-attr]
            _run(task, 3)  # type: ignore[arg-type]
            assert torch.cuda.max_memory_allocated() - base < cap // 2, name
            del task
            torch.cuda.empty_cache()
        big = make_task("gpu-image", {"device": "cuda", "batch_size": 256, "in_size": 1024})
        with pytest.raises(torch.OutOfMemoryError):
            big.setup()  # type: ignore[union-attr]
            big.step()  # type: ignore[union-attr]
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


@needs_cuda
def test_profile_task_times_cuda_steps_with_events() -> None:
    from flowride.harvest.profile import profile_task

    prof = profile_task("gpu-cnn", {"device": "auto"}, steps=10, seconds=20)
    assert prof["resolved_device"].startswith("cuda")
    assert 0 < prof["median_gpu_step_s"] <= prof["median_step_s"] * 1.5
    assert prof["median_cpu_step_s"] > 0
    assert 0 < prof["peak_memory_bytes"] < 1 << 30  # device memory, not the process's RSS


# ---------------------------------------------------------------- the CLI, end to end


def test_cli_profile_task_gpu_pagerank(tmp_path: Path) -> None:
    out = tmp_path / "prof.json"
    params = {"n": 3000, "tol": 0.0, "device": "cpu"}
    r = cli(
        "profile-task",
        "gpu-pagerank",
        "--params",
        json.dumps(params),
        "--steps",
        "8",
        "--seconds",
        "20",
        "--out",
        out,
    )
    assert r.code == 0, r.err[-2000:]
    prof = json.loads(out.read_text())
    assert prof["task"] == "gpu-pagerank" and prof["unit"] == "sweeps" and prof["steps"] == 8
    assert prof["device"] == "cpu" and prof["resolved_device"] == "cpu"
    assert prof["median_gpu_step_s"] is None
    assert 0 < prof["median_step_s"] < 5 and 0 <= prof["median_cpu_step_s"] < 5
    assert prof["throughput"] > 0 and prof["peak_memory_bytes"] > 0
    bad = cli("profile-task", "gpu-pagerank", "--params", '{"damping": 2}')
    assert bad.code == 2 and "damping" in bad.err
