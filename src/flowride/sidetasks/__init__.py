"""Built-in side tasks. Importing this package registers nothing: each task is declared by name
in pyproject.toml's ``[project.entry-points."flowride.sidetasks"]`` table, which
:mod:`flowride.harvest.task` reads when a name is looked up (another package adds its own tasks
the same way). Harvest sits below these tasks and never imports them by name.

Each task uses only the public interface in :mod:`flowride.harvest.task` (plus numpy, scipy and
torch), so it is also an example of how to write one:

=============== ========== ======= ============================================================
name            form       unit    work (entry point)
=============== ========== ======= ============================================================
cnn             iterative  samples small ResNet-style CNN, one SGD batch per step
                                   (``flowride.sidetasks.cnn:CnnTask``)
pagerank        iterative  sweeps  PageRank power iteration on a generated power-law digraph
                                   (``flowride.sidetasks.graph:PageRankTask``)
sssp            iterative  sweeps  Bellman-Ford relaxation sweeps on the same graph, weighted
                                   (``flowride.sidetasks.graph:SsspTask``)
image           iterative  images  resize + watermark, one batch per step
                                   (``flowride.sidetasks.image:ImageTask``)
image-proc      imperative images  the same image work as a free-form process (SIGTERM = save)
                                   (``flowride.sidetasks.image:IMAGE_PROC``, an ImperativeSpec)
gpu-cnn         iterative  samples SmallResNet + SGD on images generated on the device
                                   (``flowride.sidetasks.gpu_train:GpuCnnTask``)
gpu-transformer iterative  tokens  small decoder-only transformer LM + AdamW, Markov tokens
                                   (``flowride.sidetasks.gpu_train:GpuTransformerTask``)
gpu-pagerank    iterative  sweeps  PageRank on a device-made power-law digraph (CSR SpMV)
                                   (``flowride.sidetasks.gpu_graph:GpuPageRankTask``)
gpu-sssp        iterative  sweeps  Bellman-Ford sweeps: gather + scatter_reduce(amin)
                                   (``flowride.sidetasks.gpu_graph:GpuSsspTask``)
gpu-image       iterative  images  resize + blur/sharpen/sobel + watermark, device checksum
                                   (``flowride.sidetasks.gpu_image:GpuImageTask``)
=============== ========== ======= ============================================================

The ``gpu-*`` tasks compute with torch on their ``device`` param (default ``"auto"``: CUDA
when there is one), generate all their data on that device and end each step with one sync
(:mod:`flowride.sidetasks.gpu_common` says why); on the CPU they run too, on one thread.

The task classes are also importable from here (on first use, so that importing one task's
module does not import the others, and torch with them).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "CnnTask": "flowride.sidetasks.cnn",
    "PageRankTask": "flowride.sidetasks.graph",
    "SsspTask": "flowride.sidetasks.graph",
    "ImageTask": "flowride.sidetasks.image",
    "image_proc_main": "flowride.sidetasks.image",
    "IMAGE_PROC": "flowride.sidetasks.image",
    "GpuCnnTask": "flowride.sidetasks.gpu_train",
    "GpuTransformerTask": "flowride.sidetasks.gpu_train",
    "GpuPageRankTask": "flowride.sidetasks.gpu_graph",
    "GpuSsspTask": "flowride.sidetasks.gpu_graph",
    "GpuImageTask": "flowride.sidetasks.gpu_image",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'flowride.sidetasks' has no attribute {name!r}")
