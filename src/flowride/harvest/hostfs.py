"""Where a host keeps its side-task store: its host id, the per-host SQLite path, and whether the
run directory lies on a network filesystem.

With the embedded (SQLite) store every host keeps its own file, ``RUN_DIR/<host>/tasks.sqlite``,
so two hosts that share a run directory (a home or scratch directory on NFS, Lustre, GPFS, ...)
never open the same database: SQLite's locks and its WAL index (a memory-mapped file) are only
as good as the filesystem's, and a network filesystem's are not. :func:`store_path` is the one
place that says where the file is; the manager, ``flowride tasks``, ``flowride manager status``
and :meth:`flowride.harvest.store.TaskStore.in_run_dir` all ask it.

The host id is ``FLOWRIDE_HOST_ID`` when set (several "hosts" on one machine in tests, or a
container whose hostname is shared), else the hostname; either is made safe as a folder name.
The filesystem is read from ``/proc/self/mountinfo``: the mount whose device is the run
directory's and whose mount point is its longest prefix gives the type (``nfs4``, ``lustre``,
...). ``FLOWRIDE_MOUNTINFO`` names another file to read instead, for tests.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from flowride.errors import InputError

HOST_ENV = "FLOWRIDE_HOST_ID"
MOUNTINFO_ENV = "FLOWRIDE_MOUNTINFO"  # a mountinfo file to read instead of /proc/self/mountinfo (tests)
STORE_FILE = "tasks.sqlite"
MAX_HOST_CHARS = 100
# filesystems whose locking and shared memory SQLite's WAL cannot rely on
NETWORK_FS = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "afs", "9p",
    "orangefs", "pvfs2", "panfs", "wekafs", "virtiofs", "fuse.sshfs", "fuse.ceph", "fuse.glusterfs", "fuse.s3fs",
    "fuse.gcsfuse", "fuse.juicefs", "fuse.beegfs", "fuse.rclone", "fuse.lizardfs", "fuse.moosefs",
})


def sanitize_host(raw: str, field: str = HOST_ENV) -> str:
    """``raw`` as a folder name: letters, digits, ``.``, ``_`` and ``-`` kept, anything else
    ``_``, no leading dot (never ``..`` or a hidden folder)."""
    s = re.sub(r"[^A-Za-z0-9._-]", "_", raw.strip()).lstrip(".")
    if not s:
        raise InputError(field, f"{raw!r} is not a usable host id", "give letters, digits, '.', '_' or '-'")
    if len(s) > MAX_HOST_CHARS:
        raise InputError(field, f"{raw[:40]!r}... is longer than {MAX_HOST_CHARS} characters", "give a shorter host id")
    return s


def host_id(env: dict[str, str] | None = None) -> str:
    """This host's id: ``FLOWRIDE_HOST_ID`` if set, else the hostname, sanitised."""
    env = os.environ if env is None else env
    given = env.get(HOST_ENV)
    if given is not None and given.strip():
        return sanitize_host(given)
    return sanitize_host(socket.gethostname() or "localhost", "hostname")


def check_host(host: str, field: str = "host") -> str:
    """A host id given explicitly (``ManagerOptions.host``): already in its safe form."""
    if not isinstance(host, str) or sanitize_host(host, field) != host:
        raise InputError(field, f"{host!r} is not a host id", "use letters, digits, '.', '_' or '-' (no leading dot)")
    return host


def host_dir(run_dir: str | Path, host: str | None = None) -> Path:
    """This host's own folder in a run directory."""
    return Path(run_dir) / check_host(host if host is not None else host_id())


def store_path(run_dir: str | Path, host: str | None = None) -> Path:
    """Where ``host``'s (default: this host's) SQLite task store lives: ``RUN_DIR/<host>/tasks.sqlite``.

    A run directory written before stores were kept per host holds ``RUN_DIR/tasks.sqlite``; on
    a local disk that file (one host's by construction) stays the store until a per-host one
    exists, so such a run resumes its tasks. On a network filesystem it is never used: a file
    there may be another host's."""
    d = Path(run_dir)
    mine = host_dir(d, host) / STORE_FILE
    legacy = d / STORE_FILE
    if (legacy.exists() or legacy.is_symlink()) and not mine.exists() and network_mount(d) is None:
        return legacy
    return mine


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str

    @property
    def network(self) -> bool:
        return self.fstype in NETWORK_FS or self.fstype.split(".")[-1] in NETWORK_FS


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline and backslash in a path as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(text: str) -> list[tuple[str, str, str, str]]:
    """(major:minor, mount point, fstype, source) per line of a mountinfo file."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if "-" not in parts[6:]:
            continue
        sep = parts.index("-", 6)
        if len(parts) < sep + 3 or len(parts) < 5:
            continue
        out.append((parts[2], _unescape(parts[4]), parts[sep + 1], _unescape(parts[sep + 2])))
    return out


def _existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p.resolve()


def _within(path: str, point: str) -> bool:
    return point == "/" or path == point or path.startswith(point.rstrip("/") + "/")


def mount_of(path: str | Path, env: dict[str, str] | None = None) -> Mount | None:
    """The mount that holds ``path`` (or its nearest existing ancestor): among the mounts whose
    device is the path's, the one with the longest mount point that is a prefix of it. None when
    the mount table cannot be read (not Linux)."""
    env = os.environ if env is None else env
    p = _existing(Path(path))
    source = env.get(MOUNTINFO_ENV) or "/proc/self/mountinfo"
    try:
        text = Path(source).read_text(errors="replace")
        st = os.stat(p)
    except OSError:
        return None
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    here = [m for m in _mounts(text) if _within(str(p), m[1])]
    same = [m for m in here if m[0] == dev] or here  # bind mounts and btrfs subvolumes can differ
    if not same:
        return None
    _, point, fstype, src = max(same, key=lambda m: len(m[1]))
    return Mount(point, fstype, src)


def network_mount(path: str | Path) -> Mount | None:
    """The network filesystem ``path`` lies on, or None on a local one."""
    m = mount_of(path)
    return m if m is not None and m.network else None
