"""The public side-task interface: what a task must offer the harvester.

Iterative tasks expose one step at a time, so the runtime can start a step only when it fits the
bubble (remaining time > profiled step time x 1.2). Imperative tasks are free-form processes,
paused with SIGSTOP and resumed with SIGCONT; SIGTERM asks them to save their state and exit.

Built-in tasks live in :mod:`flowride.sidetasks` and use nothing but this module.
"""

from __future__ import annotations

import math
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from flowride.errors import InputError


class IterativeTask(ABC):
    """A side task that advances in short, separately schedulable steps.

    ``params`` come from the submission (JSON-serialisable). ``step`` returns the work units it
    completed (images processed, PageRank sweeps, training samples...). ``state`` must capture
    everything needed to resume after a crash: it is pickled into the durable store.
    """

    name: str = "task"
    unit: str = "steps"

    def __init__(self, **params: Any) -> None:
        self.params = params

    @abstractmethod
    def setup(self) -> None:
        """Allocate data and models. Runs once per process, before any step."""

    @abstractmethod
    def step(self) -> float:
        """Do one unit of work and return how many work units it completed."""

    @abstractmethod
    def finished(self) -> bool:
        """True once the task has nothing left to do."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """Everything needed to resume (picklable)."""

    @abstractmethod
    def load_state(self, state: dict[str, Any]) -> None:
        """Resume from ``state()`` of an earlier process."""


@dataclass(frozen=True)
class ImperativeSpec:
    """A free-form side task: ``main(params, checkpoint_path)`` run as its own process.

    ``main`` should save its progress to ``checkpoint_path`` when it receives SIGTERM (and may do
    so periodically); on restart it is called again with the same path and resumes from it. A JSON
    checkpoint with a ``units`` key tells the harvester how much work is done.
    """

    name: str
    main: Callable[[dict[str, Any], str], None]
    unit: str = "units"


@dataclass(frozen=True)
class TaskSpec:
    """How a submitted side task is created: a registered name and its parameters."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    priority: int = 0  # higher runs first
    memory_limit_mb: int | None = None  # refuse / kill above this (RLIMIT_AS on CPU)


_REGISTRY: dict[str, Callable[..., IterativeTask] | ImperativeSpec] = {}


def register(name: str, factory: Callable[..., IterativeTask] | ImperativeSpec) -> None:
    """Make a task available by name (built-ins register themselves on import)."""
    _REGISTRY[name] = factory


def registered() -> dict[str, Callable[..., IterativeTask] | ImperativeSpec]:
    import flowride.sidetasks  # noqa: F401  (registers the built-ins)

    return dict(_REGISTRY)


def resolve(name: str) -> Callable[..., IterativeTask] | ImperativeSpec:
    """A registered task, or ``package.module:Attribute`` naming an IterativeTask subclass or an
    ImperativeSpec (how users bring their own tasks)."""
    from flowride.errors import InputError

    reg = registered()
    if name in reg:
        return reg[name]
    if ":" in name:
        import importlib

        mod, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise InputError("task", f"cannot load {name!r}: {e}", "give module:Class importable here") from None
        if isinstance(obj, ImperativeSpec) or (isinstance(obj, type) and issubclass(obj, IterativeTask)):
            return obj
        raise InputError("task", f"{name!r} is neither an IterativeTask nor an ImperativeSpec", "see flowride.harvest.task")
    raise InputError("task", f"unknown side task {name!r}", f"choose one of {', '.join(sorted(reg))} or module:Class")


def make_task(name: str, params: dict[str, Any] | None = None) -> IterativeTask | ImperativeSpec:
    factory = resolve(name)
    if isinstance(factory, ImperativeSpec):
        return factory
    return factory(**(params or {}))


def check_params(name: str, params: dict[str, Any]) -> None:
    """Build the task from ``params`` once, here, so unknown keys or bad values are refused when
    the task is submitted (an InputError on ``params``), not hours later in the manager. Task
    constructors only parse their parameters; the work starts in ``setup``."""
    factory = resolve(name)
    if isinstance(factory, ImperativeSpec):
        return
    try:
        factory(**params)
    except (ValueError, TypeError, ArithmeticError) as e:
        raise InputError("params", str(e), f"see the parameters of {name} in docs/harvest.md") from None


T = typing.TypeVar("T")


def _finite(v: float) -> bool:
    """A number a float can hold (a 400-digit integer is not: float() overflows)."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def parse_params(cls: type[T], params: dict[str, Any], task: str) -> T:
    """A task's config dataclass from submitted ``params``: unknown names are refused (a typo must
    not run the defaults), and each value must have its field's type (an int for an int field,
    a finite number for a float, never a bool for either). Ranges are the task's to check."""
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]  # type: ignore[arg-type]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise ValueError(f"{task}: unknown params {unknown}; known: {sorted(known)}")
    for name, v in params.items():
        want = hints[name]
        allowed = [a for a in typing.get_args(want)] or [want]
        if v is None and type(None) in allowed:
            continue
        ok = any(
            (a is int and isinstance(v, int) and not isinstance(v, bool))
            or (a is float and isinstance(v, int | float) and not isinstance(v, bool) and _finite(v))
            or (a is bool and isinstance(v, bool))
            or (a is str and isinstance(v, str))
            for a in allowed
        )
        if not ok:
            names = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", type(None): "null"}
            kinds = " or ".join(names.get(a, str(a)) for a in allowed)
            raise ValueError(f"{task}: param {name}={v!r} is not {kinds}")
    return cls(**params)
