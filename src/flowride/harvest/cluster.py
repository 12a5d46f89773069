"""``flowride train --side-tasks`` under torchrun across hosts: one side-task manager per host.

Started by torchrun, each ``flowride train`` process is one stage. Local rank 0 of each host
(torchrun's ``LOCAL_RANK``) starts a supervised manager beside its host's stages, as
:func:`flowride.harvest.training.connect` does for a user's script, and every rank of the host
sends its bubble events to that manager on 127.0.0.1. The port must be known before a stage's
training starts (its publisher is made with it), so it cannot go over the process group that
training creates: the ranks of a host learn it from torchrun's own key-value store, the
agent's TCPStore at ``MASTER_ADDR:MASTER_PORT`` that torchrun's workers join as clients
(``TORCHELASTIC_USE_AGENT_STORE``), keyed by node (``GROUP_RANK``). Other launchers provide no
such store and are refused.

Where the tasks are kept: left to the default, each host's own SQLite file
(``RUN_DIR/<host>/tasks.sqlite``), and every host runs its own copy of the side tasks; with
``--store postgresql://...`` one queue, to which the side tasks are submitted once (by the first
host to get there) and from which each host's manager leases. Host ids must differ between nodes
(``FLOWRIDE_HOST_ID``, else the hostname): they name the stores and the leases.

When training ends, each manager is stopped (its tasks saved) and its record goes to the store;
rank 0 merges them, each host's side-task steps moved onto rank 0's clock by the offset measured
for that host's local rank 0, and reports as a single-host run does. The overhead is measured
paired, inside the one run (``--paired-block``), or against ``--baseline-report``: a separate
baseline run needs flowride's own launcher.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from flowride.errors import InputError
from flowride.harvest.hostfs import HOST_ENV, host_id
from flowride.harvest.manager_files import ManagerOptions
from flowride.harvest.session import (
    Comparison,
    harvest_report,
    paired_options,
    profiles_for,
    submit_tasks,
    wait_until_created,
)
from flowride.harvest.stores import check_store
from flowride.harvest.supervise import ManagerProcess, ManagerUnavailable
from flowride.pipeline.config import TrainConfig

SETUP_TIMEOUT_S = 600.0  # profiling the tasks and starting a host's manager, which its ranks wait for


def check_cluster_run(paired_block: int, baseline_report: dict | None, env: dict[str, str] | None = None) -> None:
    """What a harvesting run under torchrun needs, checked before anything starts."""
    env = os.environ if env is None else env
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true" or not env.get("MASTER_PORT"):
        raise InputError("--side-tasks", "this launcher gives the ranks no torchrun agent store (TORCHELASTIC_USE_AGENT_STORE), "
                         "through which the ranks of a host learn their side-task manager's port",
                         "start the ranks with torchrun, or leave out --side-tasks")
    if not paired_block and baseline_report is None:
        raise InputError("--paired-block", "0 needs --baseline-report under torchrun (a separate baseline run needs "
                         "flowride's own launcher)", "measure paired (--paired-block 2), or give --baseline-report")


def agent_store(timeout_s: float, env: dict[str, str] | None = None):
    """torchrun's key-value store, joined as a client, under a prefix of this job and attempt."""
    import torch.distributed as dist

    env = os.environ if env is None else env
    base = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s))
    prefix = f"flowride-harvest/{env.get('TORCHELASTIC_RUN_ID', 'none')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    return dist.PrefixStore(prefix, base)


def _nodes(env: dict[str, str]) -> tuple[int, int, int, int]:
    """(global rank, local rank, node, nodes) of this process."""
    rank, local = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    world, per_node = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE", "1"))
    node = int(env.get("GROUP_RANK", rank // max(1, per_node)))
    nodes = int(env.get("GROUP_WORLD_SIZE", max(1, world // max(1, per_node))))
    return rank, local, node, nodes


def _distinct_hosts(kv, node: int, nodes: int, host: str) -> None:
    kv.set(f"host/{node}", host)
    hosts = [kv.get(f"host/{g}").decode() for g in range(nodes)]
    for g, h in enumerate(hosts):
        if h == host and g != node:
            raise InputError(HOST_ENV, f"nodes {min(g, node)} and {max(g, node)} both have the host id {host!r}, which names "
                             "each host's task store and leases", "set FLOWRIDE_HOST_ID to another name on each node "
                             "(or give the nodes distinct hostnames)")


def merge_records(parts: list[dict], offsets: list[dict], queue: bool) -> dict:
    """The hosts' manager records as one: steps on rank 0's clock (each host's moved by the offset
    of its manager's rank), each labelled with its host; tasks of per-host stores named
    ``host:id`` (ids repeat between stores), those of the queue once by id (every host lists them)."""
    off = {int(o["rank"]): float(o["offset_s"]) for o in offsets}
    steps, failures, tasks, hosts, notes, left = [], {}, {}, [], [], []
    for p in parts:
        rec, host, shift = p["record"], p["host"], off.get(int(p["rank"]), 0.0)

        def key(tid, host=host):
            return tid if queue else f"{host}:{tid}"

        steps += [{**st, "task": key(st["task"]), "host": host, "t0": st["t0"] - shift, "t1": st["t1"] - shift}
                  for st in rec.get("steps", [])]
        for f in rec.get("failures", []):
            failures[key(f["task"])] = {**f, "task": key(f["task"]), "host": f.get("host") or host}
        for t in rec.get("tasks", []):
            k = key(t["id"])
            if k not in tasks or t.get("updated", 0) >= tasks[k].get("updated", 0):
                tasks[k] = {**t, "id": k, "host": t.get("host") or host}
        left += [{**t, "id": key(t["id"]), "host": t.get("host") or host} for t in rec.get("tasks_left", [])]
        notes += [n for n in rec.get("store_notes", []) if n not in notes]
        hosts.append({"node": p["node"], "host": host, "rank": p["rank"], "store": rec.get("store"), "steps": len(rec.get("steps", [])),
                      "manager_restarts": rec.get("manager_restarts", 0), "harvest_stopped": rec.get("harvest_stopped")})
    stopped = [f"host {h['host']}: {h['harvest_stopped']}" for h in hosts if h["harvest_stopped"]]
    return {"steps": sorted(steps, key=lambda s: s["t0"]), "failures": list(failures.values()), "tasks": list(tasks.values()),
            "manager_restarts": sum(h["manager_restarts"] for h in hosts), "harvest_stopped": "; ".join(stopped) or None,
            "hosts": hosts, "store_notes": notes, "tasks_left": left}


def harvest_as_rank(cfg: TrainConfig, mode: str, tasks: list[str], *, paired_block: int = 2, baseline_report: dict | None = None,
                    p_ref: float = 1.0, p_main: float | None = None, budget_pct: float = 2.0, guard: bool = True,
                    bubble_profile: str | None = None, side_device: str = "cpu", store: str | None = None,
                    on_stage: Callable[[str], None] | None = None, on_progress=None,
                    env: dict[str, str] | None = None, resume_leftovers: bool = False) -> Comparison | None:
    """This torchrun process as one stage of a harvesting run (see the module's text). Returns the
    comparison on rank 0, None on the other ranks."""
    from flowride.pipeline.trainer import train_as_rank

    env = os.environ if env is None else env
    store = check_store(store)
    check_cluster_run(paired_block, baseline_report, env)
    rank, local, node, nodes = _nodes(env)
    say = on_stage or (lambda _s: None)
    kv = agent_store(max(cfg.timeout_s, SETUP_TIMEOUT_S), env)
    run_dir = Path(cfg.run_dir)
    mp: ManagerProcess | None = None
    profiles: dict[str, dict] = {}
    host = host_id(env)
    if local == 0:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            _distinct_hosts(kv, node, nodes, host)
            say("profiling side tasks alone (dedicated throughput, step time, memory)")
            profiles = profiles_for(tasks, run_dir / "task-profiles.json")
            mp = ManagerProcess(run_dir, ManagerOptions(stages=cfg.stages, mode=mode, device=side_device, store=store, host=host,
                                                        budget_pct=budget_pct if guard else None,
                                                        **paired_options(replace(cfg, paired_block=paired_block))), profiles)
            if store is None or kv.add("submitted", 1) == 1:  # a queue gets the tasks once, from the first host
                submit_tasks(mp, tasks, side_device, resume_leftovers)  # each host's store: the re-run rule
            port = mp.start()
            wait_until_created(run_dir, mp)
            mp.watch()
        except BaseException as e:
            kv.set(f"port/{node}", f"error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
            if mp is not None:
                mp.stop()
            raise
        kv.set(f"port/{node}", str(port))
    else:
        got = kv.get(f"port/{node}").decode()
        if got.startswith("error:"):
            raise ManagerUnavailable(f"the side-task manager of node {node} did not start ({got[6:].strip()})")
        port = int(got)
    say(f"harvesting: {mode} with {', '.join(tasks)} on {nodes} host(s)"
        + (f", on/off in blocks of {paired_block} iterations" if paired_block else ""))
    try:
        res = train_as_rank(replace(cfg, pin_cores=True, bubble_port=port, profile=bubble_profile, paired_block=paired_block),
                            on_progress)
    finally:
        if mp is not None:
            record = mp.stop()
            kv.set(f"record/{node}", json.dumps({"node": node, "rank": rank, "host": host, "profiles": profiles,
                                                 "record": record}))
    if res is None:
        return None
    parts = [json.loads(kv.get(f"record/{g}").decode()) for g in range(nodes)]
    for p in parts:
        profiles = {**p["profiles"], **profiles}
    rep = res.report()
    record = merge_records(parts, rep.get("clock_offsets", []), queue=store is not None)
    rep.update(harvest_report(baseline_report, rep, record, mode, profiles, p_ref, p_main, budget_pct, paired_block or None))
    rep["hosts"] = record["hosts"]
    rep["store_notes"] = record["store_notes"]
    return Comparison(baseline_report, res, record, rep)
