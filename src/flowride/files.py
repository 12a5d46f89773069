"""Reading and writing the files users hand us and the files we hand back.

Every file flowride writes goes through :func:`atomic_write`: a temp file in the same directory,
flushed and fsynced, then renamed over the target. A crash or a full disk never leaves half a
file behind, and a reader sees the old file or the new one. The result gets the permissions a
plain ``open(path, "w")`` would give (0666 less the umask), not mkstemp's 0600.

Output paths are checked before any work starts (:func:`check_output_file`,
:func:`check_output_dir`), so an unwritable ``--out`` fails in a second, not after an hour's solve.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from flowride.errors import InputError
from flowride.sizes import MAX_JSON_MIB

MAX_JSON_BYTES = MAX_JSON_MIB * 2**20  # an input JSON larger than this is refused before it is parsed

_umask_lock = threading.Lock()


def _umask() -> int:
    """This process's umask: read from /proc on Linux (setting it to read it, the only portable
    way, would briefly change it for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _umask_lock:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def parse_json_text(text: str, field: str, where: str = "") -> Any:
    """``json.loads`` with a size guard; bad or absurdly nested JSON is an InputError on ``field``."""
    where = where or field
    if len(text) > MAX_JSON_BYTES:
        raise InputError(field, f"{where} is {len(text) / 2**20:.0f} MiB, over the {MAX_JSON_BYTES >> 20} MiB limit",
                         "give a smaller file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(field, f"{where} is not valid JSON (line {e.lineno}: {e.msg})", "fix the file") from None
    except RecursionError:  # thousands of nested brackets: no flowride file nests like that
        raise InputError(field, f"{where} nests too deeply to be a flowride file", "fix the file") from None


def read_text(path: str | Path, field: str, fix: str, limit: int = MAX_JSON_BYTES, too_big_fix: str = "give a smaller file") -> str:
    """The UTF-8 text of ``path``, read up to ``limit`` bytes (a pipe or /dev/zero has no size to
    stat); a directory, an unreadable, oversized or not-UTF-8 file is an InputError on ``field``."""
    p = Path(path)
    try:
        if p.is_dir():
            raise InputError(field, f"{p} is a directory", fix)
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise InputError(field, f"cannot read {p}: {e.strerror or e}", fix) from None
    if len(data) > limit:
        raise InputError(field, f"{p} is over the {limit >> 20} MiB limit", too_big_fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(field, f"{p} is not UTF-8 text", fix) from None


def read_json(path: str | Path, field: str, fix: str) -> Any:
    """Parsed JSON of ``path``; an unreadable, oversized, too deep or bad JSON file is an
    InputError on ``field``."""
    return parse_json_text(read_text(path, field, fix), field, str(Path(path)))


@contextmanager
def atomic_write(path: str | Path, mode: str = "w") -> Iterator[IO]:
    """A file object whose contents replace ``path`` only when the block ends without error."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode {mode!r}: use 'w' or 'wb'")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".fr-", suffix=".tmp")  # short: any legal name still fits
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        try:
            os.replace(tmp, p)
        except OSError as e:  # name the file the user asked for, not our temp file
            raise OSError(e.errno, f"cannot write {p}: {e.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


def write_json_atomic(path: str | Path, data: Any, indent: int | None = None, sort_keys: bool = False) -> None:
    """JSON (compact unless ``indent``), newline-terminated, written atomically."""
    with atomic_write(path) as f:
        json.dump(data, f, indent=indent, separators=None if indent else (",", ":"), sort_keys=sort_keys)
        f.write("\n")


def write_with(path: str | Path, writer: Callable[[IO], None], binary: bool = True) -> None:
    """Atomically write what ``writer(file)`` writes (e.g. ``fig.savefig``, ``torch.save``)."""
    with atomic_write(path, "wb" if binary else "w") as f:
        writer(f)


def _cannot_write_in(d: Path) -> str | None:
    """Why no file can be created in directory ``d`` (None if one can). Tried for real, with a
    temp file removed at once: permission bits do not tell (root, read-only mounts, /proc)."""
    try:
        fd, name = tempfile.mkstemp(dir=d, prefix=".flowride-probe-")
    except OSError as e:
        return (e.strerror or str(e)).lower()
    os.close(fd)
    os.unlink(name)
    return None


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists():
        if q.parent == q:
            break
        q = q.parent
    return q


def _guarded(check: Callable[[Path, str], Path], path: str | Path, field: str, what: str) -> Path:
    """Run an output check; an empty path or an OSError on the way (a name too long, a path
    through something we may not search) is an InputError on ``field`` too."""
    if str(path).strip() == "":
        raise InputError(field, "is empty", f"give a {what}")
    try:
        return check(Path(path), field)
    except OSError as e:
        raise InputError(field, f"cannot use {str(path)[:80]}: {e.strerror or e}", f"give another {what}") from None


def check_output_file(path: str | Path, field: str) -> Path:
    """An output file we will be able to write: not a directory, its parent an existing,
    writable directory. Checked before the work, so a typo costs a second, not the run."""
    return _guarded(_check_output_file, path, field, "file name")


def check_output_dir(path: str | Path, field: str) -> Path:
    """A directory we will be able to create or write into: an existing writable directory,
    or a path whose nearest existing ancestor is a writable directory."""
    return _guarded(_check_output_dir, path, field, "directory")


def check_output_tree(out_dir: str | Path, files: list[str], field: str, dirs: tuple[str, ...] = ()) -> Path:
    """``out_dir`` and every file a command will write in it (``files``, relative paths) and every
    folder it will create there (``dirs``), tried before the work: a name that is a directory, a
    folder that is a file, or one we cannot write in is refused naming that path, so a sweep never
    runs for an hour and then fails on its last file."""
    d = check_output_dir(out_dir, field)
    for sub in dirs:
        q = d / sub
        if q.exists() and not q.is_dir():
            raise InputError(field, f"{q} is a file, and {sub}/ is where the command writes", "remove it or give another directory")
        if q.is_dir():
            _guarded(_check_output_dir, q, field, "directory")
    for name in files:
        q = d / name
        if q.is_dir():
            raise InputError(field, f"{q} is a directory, and the command writes a file of that name",
                             "remove it or give another directory")
        for up in list(q.relative_to(d).parents)[:-1]:
            if (d / up).exists() and not (d / up).is_dir():
                raise InputError(field, f"{d / up} is a file, so {q} cannot be written", "remove it or give another directory")
    return d


def _check_output_file(p: Path, field: str) -> Path:
    if len(p.name.encode()) > 255:
        raise InputError(field, f"the file name is {len(p.name.encode())} bytes long, over the 255 a file system allows", "give a shorter name")
    if p.is_dir():
        raise InputError(field, f"{p} is a directory", "give a file name inside it")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise InputError(field, f"the directory {parent} does not exist", "create it first or give another path")
    if not parent.is_dir():
        raise InputError(field, f"{parent} is not a directory", "give a path inside a directory")
    why = _cannot_write_in(parent)
    if why:
        raise InputError(field, f"cannot write in {parent} ({why})", "give a path in a directory you can write")
    return p


def _check_output_dir(p: Path, field: str) -> Path:
    if p.exists():
        if not p.is_dir():
            raise InputError(field, f"{p} is a file, not a directory", "give a directory")
        why = _cannot_write_in(p)
        if why:
            raise InputError(field, f"cannot write in {p} ({why})", "give a directory you can write")
        return p
    anc = _nearest_existing(p.absolute())
    if not anc.is_dir():
        raise InputError(field, f"{anc} is a file, so {p} cannot be created", "give another directory")
    why = _cannot_write_in(anc)
    if why:
        raise InputError(field, f"cannot create {p} in {anc} ({why})", "give a directory you can write")
    return p
