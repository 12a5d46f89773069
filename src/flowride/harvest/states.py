"""Side-task life cycle: SUBMITTED -> CREATED -> PAUSED <-> RUNNING -> FINISHED / FAILED / STOPPED.

SUBMITTED: in the store, not yet instantiated. CREATED: its process exists and ``setup`` ran.
PAUSED / RUNNING: between bubbles / inside one. FINISHED: ``finished()`` said so. FAILED: it
crashed, ran out of memory or ignored a pause (the reason is kept). STOPPED: cancelled by a user.
"""

from __future__ import annotations

from enum import StrEnum


class TaskState(StrEnum):
    SUBMITTED = "SUBMITTED"
    CREATED = "CREATED"
    PAUSED = "PAUSED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.FINISHED, TaskState.FAILED, TaskState.STOPPED)


S = TaskState
ALLOWED: dict[TaskState, frozenset[TaskState]] = {
    S.SUBMITTED: frozenset({S.CREATED, S.FAILED, S.STOPPED}),
    S.CREATED: frozenset({S.PAUSED, S.RUNNING, S.FAILED, S.STOPPED}),
    S.PAUSED: frozenset({S.RUNNING, S.FINISHED, S.FAILED, S.STOPPED}),
    S.RUNNING: frozenset({S.PAUSED, S.FINISHED, S.FAILED, S.STOPPED}),
    S.FINISHED: frozenset(),
    S.FAILED: frozenset(),
    S.STOPPED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, old: TaskState, new: TaskState) -> None:
        super().__init__(f"a side task cannot go from {old} to {new}")
        self.old, self.new = old, new


def check_transition(old: TaskState | str, new: TaskState | str) -> TaskState:
    """The new state, if the life cycle allows ``old -> new``; raises IllegalTransition otherwise."""
    o, n = TaskState(old), TaskState(new)
    if n not in ALLOWED[o]:
        raise IllegalTransition(o, n)
    return n
