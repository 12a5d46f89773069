"""Which task store a manager, ``flowride tasks`` and ``flowride manager`` use: one factory.

``--store`` left out (or ``sqlite``): the embedded store, one SQLite file per host under the run
directory (:func:`flowride.harvest.hostfs.store_path`). ``--store postgresql://USER@HOST/DB``:
one queue in PostgreSQL that every host's manager leases from (:mod:`flowride.harvest.store_pg`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from flowride.errors import InputError
from flowride.harvest.hostfs import host_id, store_path
from flowride.harvest.store import TaskStore, network_note
from flowride.harvest.store_pg import DEFAULT_LEASE_S, PgTaskStore, is_postgres, redact

STORE_FIX = "leave it out for each host's own SQLite store, or give postgresql://USER@HOST[:PORT]/DB for one queue that every host shares"


def check_store(store: str | None, field: str = "--store") -> str | None:
    """``store`` as the manager keeps it: None for the embedded per-host SQLite store, else a
    PostgreSQL URL."""
    if store is None or store == "" or store == "sqlite":
        return None
    if not isinstance(store, str):
        raise InputError(field, f"{store!r} is not a store", STORE_FIX)
    if is_postgres(store):
        try:
            urlsplit(store).port  # noqa: B018 - a port that is not a number raises here
        except ValueError as e:
            raise InputError(field, f"{redact(store)}: {e}", STORE_FIX) from None
        return store
    raise InputError(field, f"{store!r} is not a store", STORE_FIX)


def open_store(store: str | None, run_dir: str | Path, host: str | None = None,
               lease_s: float = DEFAULT_LEASE_S) -> TaskStore | PgTaskStore:
    """The task store: ``host``'s SQLite file in ``run_dir`` (``store`` None), or the PostgreSQL
    queue (``store`` a URL), leased under ``host`` (default: this host's id)."""
    store = check_store(store)
    host = host or host_id()
    if store is None:
        return TaskStore(store_path(run_dir, host))
    return PgTaskStore(store, host, lease_s)


def store_exists(store: str | None, run_dir: str | Path, host: str | None = None) -> bool:
    """Whether there is a store to read (a queue always is; a SQLite file once a task was submitted)."""
    return check_store(store) is not None or store_path(run_dir, host).exists()


def describe_store(store: str | None, run_dir: str | Path, host: str | None = None) -> str:
    """What a summary names: the SQLite file, or the queue's URL without its password."""
    store = check_store(store)
    return f"sqlite:{store_path(run_dir, host)}" if store is None else redact(store)


def store_notes(store: str | None, run_dir: str | Path) -> list[str]:
    """What a summary says about where the tasks are kept: a run directory on a network
    filesystem (the embedded store switches SQLite's WAL off there)."""
    if check_store(store) is not None:
        return []
    note = network_note(run_dir)
    return [note] if note else []
