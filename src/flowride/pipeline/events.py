"""Bubble events: published by a training stage without ever blocking it.

A stage sends each event as one UDP datagram to 127.0.0.1:port from a non-blocking socket. A
missing subscriber, a slow one or a full receive buffer costs the sender nothing: the datagram
is dropped (the kernel never makes a UDP sender wait for its receiver). Subscribers read at
their own pace.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass


@dataclass
class BubbleEvent:
    # "bubble" (a bubble starts), "busy" (the stage computes again), or "off" / "on" (harvesting is
    # switched off / on for a block of iterations of a paired overhead measurement), or "iter"
    # (stage 0 begins iteration ``iteration`` at ``start``: the budget guard's iteration times)
    kind: str
    stage: int
    type: str  # A, B, C, D (S for steady-state gaps)
    start: float  # time.monotonic() of the stage's host when the bubble started
    predicted_end: float | None  # from the bubble profile, None without one
    free_memory: int  # bytes
    iteration: int

    def to_bytes(self) -> bytes:
        """The JSON of the event. Built by hand on the usual path (a stage sends two per bubble,
        on the training thread; ``asdict`` + ``json.dumps`` cost ~3x more); anything unusual
        (a label that needs escaping, a non-finite time) goes through ``json``."""
        return event_bytes(self.kind, self.stage, self.type, self.start, self.predicted_end, self.free_memory, self.iteration)


def event_bytes(kind: str, stage: int, type_: str, start: float, end: float | None, free_memory: int, iteration: int) -> bytes:
    """:meth:`BubbleEvent.to_bytes` of the event with these fields, without building the event."""
    if (type(start) is float and math.isfinite(start) and (end is None or (type(end) is float and math.isfinite(end)))
            and _plain(kind) and _plain(type_)):
        return (f'{{"kind":"{kind}","stage":{int(stage)},"type":"{type_}","start":{start!r},'
                f'"predicted_end":{"null" if end is None else repr(end)},"free_memory":{int(free_memory)},'
                f'"iteration":{int(iteration)}}}').encode()
    ev = BubbleEvent(kind, stage, type_, start, end, free_memory, iteration)
    return json.dumps(asdict(ev), separators=(",", ":")).encode()


def _plain(s: object) -> bool:
    """A string JSON writes as is (no quote, backslash or control character)."""
    return type(s) is str and s.isascii() and s.isprintable() and '"' not in s and "\\" not in s


class BubblePublisher:
    """Fire-and-forget sender; ``publish`` never blocks and never raises."""

    def __init__(self, port: int | None, host: str = "127.0.0.1") -> None:
        self.addr = (host, port) if port else None
        self.sock: socket.socket | None = None
        self.sent = 0
        self.dropped = 0
        self.seconds = 0.0  # time spent inside publish, for the overhead check
        self.connected = False
        if self.addr:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.setblocking(False)
            try:  # connected: each send skips the address parsing and the route lookup
                self.sock.connect(self.addr)
                self.connected = True
            except OSError:
                pass

    def publish(self, ev: BubbleEvent) -> None:
        if self.sock is not None:
            t0 = time.perf_counter()
            self._send(t0, ev.to_bytes())

    def emit(self, kind: str, stage: int, type_: str, start: float, end: float | None, free_memory: int,
             iteration: int) -> None:
        """:meth:`publish` of the event with these fields; with no socket, nothing is built at all
        (the training step's path: no event object, no JSON for a datagram that goes nowhere)."""
        if self.sock is not None:
            t0 = time.perf_counter()
            self._send(t0, event_bytes(kind, stage, type_, start, end, free_memory, iteration))

    def _send(self, t0: float, data: bytes) -> None:
        """Send ``data`` (built since ``t0``: the time counted includes building it)."""
        try:
            if self.connected:
                self.sock.send(data)
            else:
                self.sock.sendto(data, self.addr)
            self.sent += 1
        except OSError:  # nobody listening (refused), buffer full: drop, never wait
            self.dropped += 1
        self.seconds += time.perf_counter() - t0

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


class BubbleSubscriber:
    """Receives bubble events on 127.0.0.1:port (0 picks a free port)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]

    def receive(self, timeout: float | None = 1.0) -> BubbleEvent | None:
        self.sock.settimeout(timeout)
        try:
            data, _ = self.sock.recvfrom(65536)
        except (TimeoutError, BlockingIOError):
            return None
        return BubbleEvent(**json.loads(data))

    def drain(self) -> list[BubbleEvent]:
        out = []
        while (ev := self.receive(timeout=0.0)) is not None:
            out.append(ev)
        return out

    def close(self) -> None:
        self.sock.close()


def free_memory_bytes(device: str = "cpu") -> int:
    """Memory a side task could use now. CPU: MemAvailable minus this process's peak RSS (the stage
    will grow back to it). CUDA: free device memory minus the peak allocated by this process."""
    if device == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(max(0, free - torch.cuda.max_memory_allocated() + torch.cuda.memory_allocated()))
    return _cpu_free_memory()


MEMINFO_MAX_AGE_S = 0.2  # a stage re-reads MemAvailable and its own peak RSS at most this often
_meminfo_fd: int | None = None
_meminfo_lock = threading.Lock()
_free_last: tuple[float, int] = (-1e18, 0)


def _cpu_free_memory() -> int:
    """MemAvailable minus this process's peak RSS, at most :data:`MEMINFO_MAX_AGE_S` old. A stage
    asks every iteration, from inside its training step, where the kernel composing /proc/meminfo
    and a getrusage call took tens of microseconds (~35 us in a tight loop with the old open and
    line-by-line parse): a visible share of the observer's cost on a fast step, for figures that
    move far more slowly than a step."""
    global _free_last
    now = time.monotonic()
    last = _free_last  # one tuple, swapped whole: read without the lock on the usual (fresh) path
    if now - last[0] < MEMINFO_MAX_AGE_S:
        return last[1]
    with _meminfo_lock:
        if now - _free_last[0] < MEMINFO_MAX_AGE_S:
            return _free_last[1]
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        free = int(max(0, _mem_available() - peak))
        _free_last = (now, free)
        return free


def _mem_available() -> int:
    """MemAvailable in bytes, from a /proc/meminfo kept open and re-read with one ``pread``."""
    global _meminfo_fd
    try:
        if _meminfo_fd is None:
            _meminfo_fd = os.open("/proc/meminfo", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        data = os.pread(_meminfo_fd, 8192, 0)
        i = data.find(b"MemAvailable:")
        if i >= 0:
            return int(data[i + 13:data.index(b"kB", i)]) * 1024
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
