"""Bubble events: published by a training stage without ever blocking it.

A stage sends each event as one UDP datagram to 127.0.0.1:port from a non-blocking socket. A
missing subscriber, a slow one or a full receive buffer costs the sender nothing: the datagram
is dropped (the kernel never makes a UDP sender wait for its receiver). Subscribers read at
their own pace.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass


@dataclass
class BubbleEvent:
    # "bubble" (a bubble starts), "busy" (the stage computes again), or "off" / "on" (harvesting is
    # switched off / on for a block of iterations of a paired overhead measurement)
    kind: str
    stage: int
    type: str  # A, B, C, D (S for steady-state gaps)
    start: float  # time.monotonic() of the stage's host when the bubble started
    predicted_end: float | None  # from the bubble profile, None without one
    free_memory: int  # bytes
    iteration: int

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


class BubblePublisher:
    """Fire-and-forget sender; ``publish`` never blocks and never raises."""

    def __init__(self, port: int | None, host: str = "127.0.0.1") -> None:
        self.addr = (host, port) if port else None
        self.sock: socket.socket | None = None
        self.sent = 0
        self.dropped = 0
        self.seconds = 0.0  # time spent inside publish, for the overhead check
        if self.addr:
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.sock.setblocking(False)

    def publish(self, ev: BubbleEvent) -> None:
        if self.sock is None:
            return
        t0 = time.perf_counter()
        try:
            self.sock.sendto(ev.to_bytes(), self.addr)
            self.sent += 1
        except OSError:  # nobody listening, buffer full: drop, never wait
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
    avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return int(max(0, avail - peak))
