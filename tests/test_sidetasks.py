"""Built-in side tasks: registry, progress, exact resumption, and correctness against references.

Resumption is checked the way the harvester uses it: ``state()`` is pickled, a fresh instance in
(conceptually) a new process runs ``setup`` then ``load_state``, and must end bitwise where an
uninterrupted run ends. The imperative ``image-proc`` is run as a real child process and stopped
with SIGSTOP / SIGTERM / SIGCONT, as the harvester does.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np
import pytest
import torch
from scipy.sparse.csgraph import dijkstra

import flowride.harvest.task as task_mod
from flowride.errors import InputError
from flowride.harvest.task import ImperativeSpec, IterativeTask, make_task, registered
from flowride.sidetasks.cnn import CnnTask, make_batch
from flowride.sidetasks.graph import PageRankTask, SsspTask, power_law_digraph
from flowride.sidetasks.image import ImageTask, image_proc_main, read_checkpoint

SRC = Path(__file__).resolve().parents[1] / "src"

# Small params per task: quick steps, and every task finishes within a few dozen steps.
SMALL: dict[str, dict[str, Any]] = {
    "cnn": {"batch_size": 8, "width": 8, "image_size": 16, "total_steps": 12},
    "pagerank": {"n": 2000, "sweeps_per_step": 2, "tol": 1e-9},
    "sssp": {"n": 2000},
    "image": {"batch_size": 4, "in_size": 32, "out_size": 16, "total_batches": 10},
}


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """Task setup pins torch to one thread (right for a side-task process); undo it here."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _new(name: str, **overrides: Any) -> IterativeTask:
    task = make_task(name, {**SMALL[name], **overrides})
    assert isinstance(task, IterativeTask)
    task.setup()
    return task


# ---------------------------------------------------------------- registry


def test_registry_has_the_builtins() -> None:
    reg = registered()
    for name in ("cnn", "pagerank", "sssp", "image", "image-proc"):
        assert name in reg
    pr = make_task("pagerank")
    assert isinstance(pr, PageRankTask) and pr.unit == "sweeps"
    assert isinstance(make_task("sssp"), SsspTask)
    assert isinstance(make_task("cnn", {"batch_size": 4}), CnnTask)
    assert make_task("cnn", {"batch_size": 4}).config.batch_size == 4  # type: ignore[union-attr]
    spec = make_task("image-proc")
    assert isinstance(spec, ImperativeSpec)
    assert spec.main is image_proc_main and spec.unit == "images" and spec.name == "image-proc"


def test_unknown_task_raises_input_error() -> None:
    with pytest.raises(InputError, match="unknown side task"):
        make_task("no-such-task")


def test_unknown_task_lists_the_known_names_sorted() -> None:
    with pytest.raises(InputError) as e:
        make_task("no-such-task")
    assert e.value.field == "task"
    assert e.value.fix == ("choose one of cnn, gpu-cnn, gpu-image, gpu-pagerank, gpu-sssp, gpu-transformer, image, image-proc, "
                           "pagerank, sssp or module:Class")


def test_builtins_are_declared_as_entry_points() -> None:
    """The built-ins come from pyproject.toml's entry-point table (reinstall after editing it)."""
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group=task_mod.ENTRY_POINT_GROUP)}
    assert eps["cnn"] == "flowride.sidetasks.cnn:CnnTask"
    assert eps["pagerank"] == "flowride.sidetasks.graph:PageRankTask"
    assert eps["sssp"] == "flowride.sidetasks.graph:SsspTask"
    assert eps["image"] == "flowride.sidetasks.image:ImageTask"
    assert eps["image-proc"] == "flowride.sidetasks.image:IMAGE_PROC"


@pytest.fixture
def entry_point_table(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    """Replace the installed entry points with ``{name: "module:attr"}``, read afresh on the next
    lookup; monkeypatch puts the real table back afterwards."""
    from importlib.metadata import EntryPoint

    def use(table: dict[str, str]) -> None:
        eps = [EntryPoint(name, value, task_mod.ENTRY_POINT_GROUP) for name, value in table.items()]
        monkeypatch.setattr(task_mod, "entry_points", lambda group: [ep for ep in eps if ep.group == group])
        monkeypatch.setattr(task_mod, "_ENTRY_POINTS", None)

    return use


def test_another_package_adds_a_task_by_entry_point(entry_point_table) -> None:
    entry_point_table({"pagerank": "flowride.sidetasks.graph:PageRankTask", "counter": "harvest_fixtures.fake_tasks:Counter"})
    from harvest_fixtures.fake_tasks import Counter

    assert task_mod.resolve("counter") is Counter
    assert task_mod.known_names() == ["counter", "pagerank"]
    assert set(registered()) == {"counter", "pagerank"}


def test_a_stale_entry_point_is_an_input_error(entry_point_table) -> None:
    entry_point_table({"cnn": "flowride.sidetasks.gone:CnnTask", "sssp": "flowride.sidetasks.graph:NoSuchTask",
                       "bad": "flowride.sidetasks.graph:power_law_digraph"})
    for name, needle in [("cnn", "No module named 'flowride.sidetasks.gone'"), ("sssp", "NoSuchTask"),
                         ("bad", "neither an IterativeTask nor an ImperativeSpec")]:
        with pytest.raises(InputError) as e:
            make_task(name)
        assert e.value.field == "task" and f"entry point {name} = " in e.value.problem and needle in e.value.problem
        assert "reinstall flowride (pip install -e .)" in e.value.fix
    with pytest.raises(InputError) as e:
        registered()
    assert "reinstall flowride" in str(e.value)


def test_no_entry_points_at_all_says_to_reinstall(entry_point_table) -> None:
    entry_point_table({})
    with pytest.raises(InputError, match="unknown side task") as e:
        make_task("cnn")
    assert "reinstall flowride (pip install -e .)" in e.value.fix


def test_a_task_registered_at_run_time_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from harvest_fixtures.fake_tasks import Counter

    monkeypatch.setattr(task_mod, "_REGISTRY", {})
    task_mod.register("counter-rt", Counter)
    task_mod.register("pagerank", Counter)
    assert task_mod.resolve("counter-rt") is Counter and task_mod.resolve("pagerank") is Counter
    assert registered()["pagerank"] is Counter and registered()["sssp"] is SsspTask
    assert "counter-rt" in task_mod.known_names()


def test_harvest_imports_no_higher_floor() -> None:
    """harvest sits below the side tasks, the CLI and the API: it never imports them (the built-in
    tasks reach it through the entry-point table), not even inside a function."""
    import ast

    offenders = []
    for py in sorted((SRC / "flowride" / "harvest").rglob("*.py")):
        for node in ast.walk(ast.parse(py.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for n in names:
                if n.split(".")[:2] in (["flowride", "sidetasks"], ["flowride", "cli"], ["flowride", "api"]):
                    offenders.append(f"{py.name}:{node.lineno}: {n}")
    assert offenders == []


def test_sidetasks_registers_nothing_on_import() -> None:
    code = ("import flowride.sidetasks, flowride.harvest.task as t, sys; "
            "assert t._REGISTRY == {} and t._ENTRY_POINTS is None; "
            "import flowride.sidetasks.graph; assert 'torch' not in sys.modules; "
            "from flowride.sidetasks import CnnTask, IMAGE_PROC; assert IMAGE_PROC.main is flowride.sidetasks.image_proc_main")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


@pytest.mark.parametrize("name", ["cnn", "pagerank", "sssp", "image"])
def test_bad_params_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="unknown params"):
        make_task(name, {"sed": 1})  # typo of seed must not silently run the defaults
    with pytest.raises(ValueError):
        make_task(name, {"seed": -1})


# ---------------------------------------------------------------- progress


@pytest.mark.parametrize("name", ["cnn", "pagerank", "sssp", "image"])
def test_steps_return_units_and_finish(name: str) -> None:
    torch.set_num_threads(2)
    task = _new(name)
    if name in ("cnn", "image"):
        assert torch.get_num_threads() == 1  # a side task must not take every core
    assert not task.finished()
    units = [task.step() for _ in range(2)]
    assert all(u > 0 for u in units)
    for _ in range(200):
        if task.finished():
            break
        task.step()
    assert task.finished()


def test_step_units_are_what_the_task_says() -> None:
    assert _new("cnn").step() == SMALL["cnn"]["batch_size"]
    assert _new("image").step() == SMALL["image"]["batch_size"]
    assert _new("pagerank").step() == SMALL["pagerank"]["sweeps_per_step"]
    assert _new("sssp").step() == 1


# ---------------------------------------------------------------- resumption


def _summary(task: IterativeTask) -> dict[str, Any]:
    """What must match between a resumed and an uninterrupted run."""
    if isinstance(task, CnnTask):
        assert task.model is not None
        return {
            "steps": task.steps_done,
            "params": {k: v.clone() for k, v in task.model.state_dict().items()},
            "loss": task.last_loss,
        }
    if isinstance(task, PageRankTask):
        assert task.ranks is not None
        return {"sweeps": task.sweeps, "ranks": task.ranks.copy(), "delta": task.last_delta}
    if isinstance(task, SsspTask):
        assert task.dist is not None
        return {"sweeps": task.sweeps, "dist": task.dist.copy(), "done": task.converged}
    assert isinstance(task, ImageTask)
    return {"next": task.next_batch, "checksum": task.checksum}


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for p in x:
                assert torch.equal(x[p], y[p]), p
        elif isinstance(x, np.ndarray):
            assert np.array_equal(x, y), k
        else:
            assert x == y, k


@pytest.mark.parametrize(
    ("name", "k", "j"), [("cnn", 3, 4), ("pagerank", 2, 2), ("sssp", 2, 3), ("image", 3, 4)]
)
def test_resume_from_pickled_state_is_exact(name: str, k: int, j: int) -> None:
    task = _new(name)
    for _ in range(k):
        task.step()
    live_snapshot = task.state()
    blob = pickle.dumps(live_snapshot)
    for _ in range(j):
        task.step()
    expected = _summary(task)

    # The snapshot must not have moved while the task kept running.
    _assert_same_state(live_snapshot, pickle.loads(blob))

    resumed = _new(name)
    loaded = pickle.loads(blob)
    resumed.load_state(loaded)
    for _ in range(j):
        resumed.step()
    _assert_same_state(loaded, pickle.loads(blob))  # resuming must not write into its input
    _assert_same(_summary(resumed), expected)
    _assert_same_state(resumed.state(), task.state())


def _assert_same_state(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same_state(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_state(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    elif isinstance(a, float) and np.isnan(a):
        assert isinstance(b, float) and np.isnan(b)
    else:
        assert a == b


def test_resume_continues_momentum_not_just_weights() -> None:
    """Dropping the optimiser state would still give the right weights at the resume point."""
    task = _new("cnn")
    task.step()
    task.step()
    snap = pickle.loads(pickle.dumps(task.state()))
    assert snap["optimizer"]["state"], "momentum buffers must be in the state"
    task.step()
    fresh_opt = _new("cnn")
    snap_no_momentum = dict(snap, optimizer=_new("cnn").state()["optimizer"])
    fresh_opt.load_state(snap_no_momentum)
    fresh_opt.step()
    assert isinstance(task, CnnTask) and isinstance(fresh_opt, CnnTask)
    assert task.model is not None and fresh_opt.model is not None
    assert not torch.equal(task.model.fc.weight, fresh_opt.model.fc.weight)


@pytest.mark.parametrize("name", ["cnn", "pagerank", "sssp", "image"])
def test_state_from_other_params_is_refused(name: str) -> None:
    state = _new(name).state()
    other = _new(name, seed=7)
    with pytest.raises(ValueError, match="different"):
        other.load_state(state)


# ---------------------------------------------------------------- cnn


def test_cnn_batches_are_deterministic_and_learnable() -> None:
    x1, y1 = make_batch(0, 5, 16, 4, 32, 0.25)
    x2, y2 = make_batch(0, 5, 16, 4, 32, 0.25)
    x3, _ = make_batch(0, 6, 16, 4, 32, 0.25)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert not np.array_equal(x1, x3)
    assert x1.shape == (16, 3, 32, 32) and x1.dtype == np.float32
    assert set(np.unique(y1)) <= {0, 1, 2, 3}


def test_cnn_loss_falls_and_target_loss_stops_it() -> None:
    task = CnnTask(batch_size=32, total_steps=1000, target_loss=0.9)
    task.setup()
    assert torch.get_num_threads() == 1
    losses = []
    while not task.finished():
        task.step()
        losses.append(task.last_loss)
    assert task.steps_done < 1000, "should reach target_loss long before total_steps"
    assert task.ema_loss < 0.9
    assert np.mean(losses[-10:]) < 0.75 * np.mean(losses[:10])
    assert 0.0 <= task.last_accuracy <= 1.0


# ---------------------------------------------------------------- graph


def test_power_law_graph_has_no_self_loops_or_duplicates_and_heavy_tail() -> None:
    src, dst = power_law_digraph(5000, 8.0, 2.5, seed=3)
    assert not np.any(src == dst)
    assert len(np.unique(src * 5000 + dst)) == len(src)
    assert 6.0 < len(src) / 5000 <= 8.0
    indeg = np.bincount(dst, minlength=5000)
    assert indeg.max() > 20 * indeg.mean()  # hubs: far from a Poisson degree distribution
    s2, d2 = power_law_digraph(5000, 8.0, 2.5, seed=3)
    assert np.array_equal(src, s2) and np.array_equal(dst, d2)


def test_pagerank_matches_networkx() -> None:
    task = PageRankTask(n=300, avg_degree=4.0, tol=1e-13, sweeps_per_step=1)
    task.setup()
    while not task.finished():
        task.step()
    assert task.last_delta < 1e-13 and task.sweeps < task.config.max_sweeps
    assert task.dangling is not None and task.dangling.any()  # exercise the dangling rule
    g = nx.DiGraph()
    g.add_nodes_from(range(300))
    assert task.src is not None and task.dst is not None
    g.add_edges_from(zip(task.src.tolist(), task.dst.tolist(), strict=True))
    ref = nx.pagerank(g, alpha=0.85, tol=1e-14, max_iter=10_000)
    ref_vec = np.array([ref[i] for i in range(300)])
    assert task.ranks is not None
    np.testing.assert_allclose(task.ranks, ref_vec, rtol=1e-6)
    assert abs(task.ranks.sum() - 1.0) < 1e-9


def test_pagerank_max_sweeps_caps_work() -> None:
    task = PageRankTask(n=1000, max_sweeps=5, sweeps_per_step=3, tol=1e-15)
    task.setup()
    assert task.step() == 3
    assert task.step() == 2  # stops at the cap, and says so
    assert task.finished() and task.sweeps == 5


@pytest.mark.parametrize("source", [None, 17])
def test_sssp_matches_dijkstra(source: int | None) -> None:
    task = SsspTask(n=3000, seed=4, source=source)
    task.setup()
    steps = 0
    while not task.finished():
        task.step()
        steps += 1
    assert steps < 100
    assert task.graph is not None and task.dist is not None
    ref = dijkstra(task.graph, directed=True, indices=task.source)
    assert np.array_equal(np.isinf(ref), np.isinf(task.dist))
    finite = np.isfinite(ref)
    assert finite.sum() > 1  # the source reaches something
    np.testing.assert_allclose(task.dist[finite], ref[finite], rtol=1e-12)
    assert task.step() == 0.0  # nothing more to do at the fixpoint


# ---------------------------------------------------------------- image


def test_image_checksum_depends_on_content() -> None:
    def run(**kw: Any) -> str:
        task = _new("image", **kw)
        while not task.finished():
            task.step()
        assert isinstance(task, ImageTask)
        return task.checksum

    base = run()
    assert run() == base
    assert run(seed=1) != base
    assert run(alpha=0.0) != base


def test_image_proc_in_process_matches_iterative(tmp_path: Path) -> None:
    params = dict(SMALL["image"], total_batches=12, checkpoint_every=5)
    ckpt = tmp_path / "ck.json"
    before = signal.getsignal(signal.SIGTERM)
    image_proc_main(params, str(ckpt))
    assert signal.getsignal(signal.SIGTERM) == before  # handler restored
    saved = read_checkpoint(str(ckpt))
    assert saved is not None and saved["done"] and saved["next_batch"] == 12
    assert saved["units"] == 12 * saved["identity"]["batch_size"]  # what the harvester reads

    task = _new("image", total_batches=12)
    while not task.finished():
        task.step()
    assert isinstance(task, ImageTask)
    assert saved["checksum"] == task.checksum

    image_proc_main(params, str(ckpt))  # already done: no work, same result
    again = read_checkpoint(str(ckpt))
    assert again is not None and again["checksum"] == task.checksum
    assert again["batches_this_start"] == 0 and again["starts"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name != "ck.json"], "temp files left behind"


def _spawn(params: dict[str, Any], ckpt: Path) -> subprocess.Popen[bytes]:
    code = (
        "import json, sys\n"
        "from flowride.sidetasks.image import image_proc_main\n"
        "image_proc_main(json.loads(sys.argv[1]), sys.argv[2])\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(params), str(ckpt)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _wait_for(pred: Callable[[], bool], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting")
        time.sleep(0.002)


def test_image_proc_sigterm_checkpoint_and_resume(tmp_path: Path) -> None:
    total, every = 2000, 200  # few checkpoints: each costs an fsync
    params = {
        "batch_size": 2,
        "in_size": 16,
        "out_size": 8,
        "total_batches": total,
        "checkpoint_every": every,
    }
    ckpt = tmp_path / "image-proc.json"

    # Reference: one uninterrupted run (in this process).
    ref_path = tmp_path / "ref.json"
    image_proc_main(params, str(ref_path))
    reference = read_checkpoint(str(ref_path))
    assert reference is not None and reference["done"]

    proc = _spawn(params, ckpt)
    try:
        _wait_for(ckpt.exists, timeout=60)  # the periodic checkpoint
        periodic = read_checkpoint(str(ckpt))
        assert periodic is not None and periodic["next_batch"] % every == 0
        assert not periodic["done"]
        # What the harvester does: pause at a bubble's end, then ask it to save and exit.
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    assert out == b""  # library code never prints
    stopped = read_checkpoint(str(ckpt))
    assert stopped is not None and not stopped["done"]
    assert periodic["next_batch"] <= stopped["next_batch"] < total
    assert stopped["batches_this_start"] == stopped["next_batch"]
    interrupted_at = stopped["next_batch"]

    proc = _spawn(params, ckpt)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    final = read_checkpoint(str(ckpt))
    assert final is not None and final["done"] and final["next_batch"] == total
    assert final["starts"] == 2
    assert final["batches_this_start"] == total - interrupted_at  # resumed, did not restart
    assert final["checksum"] == reference["checksum"]


def test_image_proc_refuses_a_foreign_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ck.json"
    params = dict(SMALL["image"], total_batches=2)
    image_proc_main(params, str(ckpt))
    with pytest.raises(ValueError, match="different job"):
        image_proc_main(dict(params, seed=9), str(ckpt))
