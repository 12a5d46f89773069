"""torch.distributed's own collective on the same buffers: the answer the schedule must match and
the time it must stay close to.

Each collective is tried with its tensor API first (``all_gather_into_tensor``,
``all_to_all_single``, ``reduce_scatter_tensor``, ``all_reduce``), which gloo supports in current
torch. Older gloo builds lack some of them; then a fallback that gloo always has is used and the
report says which one ran (``reference``): ``all_gather`` into a list; ``all_to_all`` with lists,
else point-to-point isend/irecv; ReduceScatter as ``all_reduce`` of the whole input, then this
rank's block sliced out (it moves N times the data, so its time is not a fair baseline).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from flowride.collectives.demand import Collective


class Reference:
    """A prepared torch.distributed collective: ``run()`` fills ``out`` from ``inp``."""

    def __init__(self, coll: Collective, inp: torch.Tensor, out: torch.Tensor, rank: int, world: int, group=None) -> None:
        self.coll, self.inp, self.out, self.rank, self.world, self.group = coll, inp, out, rank, world, group
        self.name = ""
        self._run: Callable[[], None] | None = None
        self._scratch: torch.Tensor | None = None

    def run(self) -> None:
        if self._run is None:
            self._pick()
        else:
            self._run()

    def _pick(self) -> None:
        """Run once, choosing the first variant this backend supports (all ranks see the same
        backend, so they all pick the same one)."""
        for name, fn in self._variants():
            try:
                fn()
            except (RuntimeError, NotImplementedError, ValueError) as e:
                if "not supported" in str(e).lower() or "unsupported" in str(e).lower() or isinstance(e, NotImplementedError):
                    continue
                raise
            self.name, self._run = name, fn
            return
        raise RuntimeError(f"no torch.distributed variant of {self.coll.value} works on this backend")

    def _variants(self) -> list[tuple[str, Callable[[], None]]]:
        inp, out, n, g = self.inp, self.out, self.world, self.group
        if self.coll is Collective.ALLGATHER:
            return [("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(out, inp, group=g)),
                    ("all_gather", lambda: dist.all_gather(list(out.chunk(n)), inp, group=g))]
        if self.coll is Collective.ALLTOALL:
            return [("all_to_all_single", lambda: dist.all_to_all_single(out, inp, group=g)),
                    ("all_to_all", lambda: dist.all_to_all(list(out.chunk(n)), list(inp.chunk(n)), group=g)),
                    ("isend/irecv", self._alltoall_p2p)]
        if self.coll is Collective.REDUCESCATTER:
            return [("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(out, inp, group=g)),
                    ("all_reduce, then slice", self._rs_via_allreduce)]

        def allreduce() -> None:
            out.copy_(inp)
            dist.all_reduce(out, group=g)

        return [("all_reduce", allreduce)]

    def _alltoall_p2p(self) -> None:
        n, r = self.world, self.rank
        ins, outs = self.inp.chunk(n), self.out.chunk(n)
        outs[r].copy_(ins[r])
        works = []
        for p in range(n):
            if p != r:
                works.append(dist.irecv(outs[p], src=p, group=self.group))
                works.append(dist.isend(ins[p].contiguous(), dst=p, group=self.group))
        for w in works:
            w.wait()

    def _rs_via_allreduce(self) -> None:
        if self._scratch is None:
            self._scratch = torch.empty_like(self.inp)
        self._scratch.copy_(self.inp)
        dist.all_reduce(self._scratch, group=self.group)
        self.out.copy_(self._scratch.chunk(self.world)[self.rank])
