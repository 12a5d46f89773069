"""The public side-task interface: what a task must offer the harvester.

Iterative tasks expose one step at a time, so the runtime can start a step only when it fits the
bubble (remaining time > profiled step time x 1.2). Imperative tasks are free-form processes,
paused with SIGSTOP and resumed with SIGCONT; SIGTERM asks them to save their state and exit.

Tasks are found by name in the ``flowride.sidetasks`` entry-point group (flowride's built-ins
are declared there in pyproject.toml, and any installed package can add its own), among the
names given to :func:`register` at run time, or as ``package.module:Class``. The entry points
are read on the first lookup, and only the task looked up is imported, so this module depends on
no task: the built-in ones (:mod:`flowride.sidetasks` and its table) use nothing but this module.
"""

from __future__ import annotations

import json
import math
import reprlib
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from importlib.metadata import EntryPoint, entry_points
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


ENTRY_POINT_GROUP = "flowride.sidetasks"
REINSTALL = "reinstall flowride (pip install -e .)"

Factory = Callable[..., IterativeTask] | ImperativeSpec

_REGISTRY: dict[str, Factory] = {}  # registered at run time: these win over entry points
_ENTRY_POINTS: dict[str, EntryPoint] | None = None  # the entry-point table, read on first lookup


def register(name: str, factory: Factory) -> None:
    """Make a task available by name, at run time. Installed tasks (flowride's built-ins and
    other packages') are declared as entry points instead, in the ``flowride.sidetasks`` group;
    a name registered here takes precedence over an entry point of the same name."""
    _REGISTRY[name] = factory


def _entry_points() -> dict[str, EntryPoint]:
    """The ``flowride.sidetasks`` entry points by name, read once per process (on the first
    lookup, never at import). Where two installed packages declare one name, the first found on
    ``sys.path`` wins, as for modules."""
    global _ENTRY_POINTS
    if _ENTRY_POINTS is None:
        table: dict[str, EntryPoint] = {}
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            table.setdefault(ep.name, ep)
        _ENTRY_POINTS = table
    return _ENTRY_POINTS


def _load(ep: EntryPoint) -> Factory:
    """The task an entry point names, or an InputError saying which entry point is broken (a
    checkout whose installed entry points no longer match its code)."""
    where = f"entry point {ep.name} = {ep.value} in group {ENTRY_POINT_GROUP}"
    dist = ep.dist.name if ep.dist is not None else "flowride"
    fix = REINSTALL if dist == "flowride" else f"reinstall {dist}, the package that declares it"
    try:
        obj = ep.load()
    except (ImportError, AttributeError) as e:
        raise InputError("task", f"cannot load side task {ep.name!r} ({where}): {e}", fix) from None
    if isinstance(obj, ImperativeSpec) or (isinstance(obj, type) and issubclass(obj, IterativeTask)):
        return obj
    raise InputError("task", f"side task {ep.name!r} ({where}) is neither an IterativeTask nor an ImperativeSpec", fix)


def known_names() -> list[str]:
    """Every task name that resolves, sorted: installed entry points and run-time registrations
    (nothing is imported)."""
    return sorted(set(_entry_points()) | set(_REGISTRY))


def registered() -> dict[str, Factory]:
    """Every named task, loaded: installed entry points, then run-time registrations over them."""
    out = {name: _load(ep) for name, ep in _entry_points().items()}
    out.update(_REGISTRY)
    return out


def _lookup(name: str) -> Factory | None:
    if name in _REGISTRY:
        return _REGISTRY[name]
    ep = _entry_points().get(name)
    return _load(ep) if ep is not None else None


MAX_NAME = 200  # characters of a task name or module:Class
MAX_PARAMS_BYTES = 64 * 1024  # a --params JSON: parameters, not data
MAX_PARAMS_DEPTH = 16  # nesting of a --params JSON; no task nests deeper
_echo = reprlib.Repr()
_echo.maxstring, _echo.maxother, _echo.maxlist, _echo.maxdict, _echo.maxlevel = 60, 60, 6, 6, 3
_short = _echo.repr  # a value echoed in an error: its head, never 100 kB of it


def check_task_name(name: object) -> str:
    """A task name as the user wrote it, checked for shape only (no import): not empty, not
    absurdly long, and for ``module:Class`` a dotted module path and an attribute name."""
    if not isinstance(name, str) or not name.strip():
        raise InputError("task", f"{_short(name)} is not a task name", "give a built-in name (pagerank, cnn, image) or module:Class")
    if len(name) > MAX_NAME:
        raise InputError("task", f"the name is {len(name)} characters long (at most {MAX_NAME})", "give a built-in name or module:Class")
    if ":" in name:
        mod, _, attr = name.partition(":")
        if not mod or not all(p.isidentifier() for p in mod.split(".")):
            raise InputError("task", f"{name!r}: {mod!r} is not a module path", "write module:Class, e.g. mytasks.train:Finetune")
        if not attr.isidentifier():
            raise InputError("task", f"{name!r}: {attr!r} is not a class or attribute name", "write module:Class, e.g. mytasks.train:Finetune")
    return name


def parse_params_json(text: str | None) -> dict[str, Any]:
    """A ``--params`` JSON object: at most :data:`MAX_PARAMS_BYTES` and :data:`MAX_PARAMS_DEPTH`
    deep (checked before parsing, so thousands of brackets never reach a RecursionError)."""
    if text is None or not text.strip():
        return {}
    if len(text) > MAX_PARAMS_BYTES:
        raise InputError("params", f"is {len(text):,} characters long (at most {MAX_PARAMS_BYTES:,})",
                         "give parameters, not data: point a parameter at a file instead")
    depth = deepest = 0
    in_str = esc = False
    for ch in text:  # bracket depth outside strings
        if in_str:
            esc, in_str = (False, True) if esc else (ch == "\\", ch != '"')
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    if deepest > MAX_PARAMS_DEPTH:
        raise InputError("params", f"nests {deepest} levels deep (at most {MAX_PARAMS_DEPTH})", "give a flat JSON object of parameters")
    try:
        v = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise InputError("params", f"is not JSON ({getattr(e, 'msg', 'too deep')})", 'write e.g. \'{"n": 1000}\'') from None
    if not isinstance(v, dict):
        raise InputError("params", f"{_short(v)} is not a JSON object", 'write e.g. \'{"n": 1000}\'')
    return v


def parse_task_spec(name: object, params: str | dict | None = None, priority: int = 0,
                    memory_limit_mb: int | None = None) -> TaskSpec:
    """The one parser of a submitted task (``profile-task``, ``tasks submit``, ``train
    --side-tasks``, :func:`~flowride.pipeline.attach`): the name's shape, that it resolves, the
    parameters' size and depth, and that the task accepts them (:func:`check_params`)."""
    check_task_name(name)
    resolve(name)  # type: ignore[arg-type]
    p = parse_params_json(params) if params is None or isinstance(params, str) else params
    if not isinstance(p, dict):
        raise InputError("params", f"{_short(p)} is not a mapping", "give a dict of parameters")
    check_params(name, p)  # type: ignore[arg-type]
    return TaskSpec(name, p, priority, memory_limit_mb)  # type: ignore[arg-type]


def parse_task_list(text: str | None) -> list[str]:
    """``--side-tasks a,b,c``: each name checked (:func:`check_task_name`, :func:`resolve`); an
    option given but naming no task is refused, not read as "no side tasks"."""
    if text is None:
        return []
    names = [t.strip() for t in text.split(",")]
    if not any(names):
        raise InputError("side_tasks", f"{text!r} names no side task", "give e.g. pagerank,cnn, or leave the option out")
    for n in names:
        if not n:
            raise InputError("side_tasks", f"{_short(text)} has an empty name between commas", "write e.g. pagerank,cnn")
        check_task_name(n)
        resolve(n)
    return names


def resolve(name: str) -> Factory:
    """A named task (registered at run time or installed as an entry point: only that one is
    imported), or ``package.module:Attribute`` naming an IterativeTask subclass or an
    ImperativeSpec (how users bring their own tasks without installing them)."""
    check_task_name(name)
    found = _lookup(name)
    if found is not None:
        return found
    if ":" in name:
        import importlib

        mod, _, attr = name.partition(":")
        try:
            obj = getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise InputError("task", f"cannot load {name!r}: {_short(str(e))}", "give module:Class importable here") from None
        if isinstance(obj, ImperativeSpec) or (isinstance(obj, type) and issubclass(obj, IterativeTask)):
            return obj
        raise InputError("task", f"{name!r} is neither an IterativeTask nor an ImperativeSpec", "see flowride.harvest.task")
    names = known_names()
    fix = f"choose one of {', '.join(names)} or module:Class" if names else "give module:Class"
    if not _entry_points():  # not even the built-ins: the installed metadata predates them
        fix += f"; no side task is installed under entry-point group {ENTRY_POINT_GROUP}: {REINSTALL}"
    raise InputError("task", f"unknown side task {name!r}", fix)


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
        msg = str(e)
        raise InputError("params", msg if len(msg) <= 300 else msg[:300] + "...", f"see the parameters of {name} in docs/harvest.md") from None


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
        raise ValueError(f"{task}: unknown params {_short(unknown)}; known: {sorted(known)}")
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
            raise ValueError(f"{task}: param {name}={_short(v)} is not {kinds}")
    return cls(**params)
