"""Built-in side tasks, registered by name on import.

Each task uses only the public interface in :mod:`flowride.harvest.task` (plus numpy, scipy and
torch), so it is also an example of how to write one:

========== ============ ========= ==============================================================
name       form         unit      work
========== ============ ========= ==============================================================
cnn        iterative    samples   small ResNet-style CNN, one SGD batch per step
pagerank   iterative    sweeps    PageRank power iteration on a generated power-law digraph
sssp       iterative    sweeps    Bellman-Ford relaxation sweeps on the same graph, weighted
image      iterative    images    resize + watermark, one batch per step
image-proc imperative   images    the same image work as a free-form process (SIGTERM = save)
========== ============ ========= ==============================================================
"""

from flowride.harvest.task import ImperativeSpec, register
from flowride.sidetasks.cnn import CnnTask
from flowride.sidetasks.graph import PageRankTask, SsspTask
from flowride.sidetasks.image import ImageTask, image_proc_main

__all__ = ["CnnTask", "ImageTask", "PageRankTask", "SsspTask", "image_proc_main"]

register("cnn", CnnTask)
register("pagerank", PageRankTask)
register("sssp", SsspTask)
register("image", ImageTask)
register("image-proc", ImperativeSpec("image-proc", image_proc_main, unit="images"))
