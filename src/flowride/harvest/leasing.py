"""The manager's side of the cluster queue (:mod:`flowride.harvest.store_pg`): what it leases,
what it gives up, what it cancels.

Kept out of :mod:`flowride.harvest.manager` so the scheduler reads the same for either store: its
``_poll_store`` hands a queue to :func:`poll_queue`, which then does for the tasks this host
holds what ``_poll_store`` does for every task of a SQLite file (start the submitted ones, stop
the cancelled ones), and beforehand kills at once any task this host no longer holds.
"""

from __future__ import annotations

import time
from typing import Any

from flowride.harvest.states import TaskState

QUEUE_POLL_S = 0.5  # how often the queue's leases and cancellations are read (the lost ones: every poll)


def poll_queue(m: Any) -> None:
    """One poll of the queue by manager ``m`` (its scheduler thread): stop what this host lost
    (another host took it over, or the leases could not be renewed: a task runs on one host at
    a time), then, every QUEUE_POLL_S, lease tasks up to the cap (``lease_tasks``, default one
    per stage) and start or cancel the tasks held."""
    for tid in m.store.lost():
        live = m.live.get(tid)
        if live is not None:
            live.kill()
            m._forget(live)
    now = time.monotonic()
    if now - m.last_queue_poll < QUEUE_POLL_S:
        return
    m.last_queue_poll = now
    cap = m.opts.lease_tasks or m.stages
    m.store.lease(cap - len(m.store.held))
    for rec in m.store.held_records():
        if rec.cancel_requested:
            live = m.live.get(rec.id)
            if live is not None:
                live.kill()
                m._forget(live)
            m.store.transition(rec.id, TaskState.STOPPED, "cancelled by the user")
        elif rec.state is TaskState.SUBMITTED and rec.id not in m.live:
            try:
                m._spawn(rec)
            except Exception as e:  # a task that cannot even start fails alone
                m.store.transition(rec.id, TaskState.FAILED, f"could not start: {e}")
