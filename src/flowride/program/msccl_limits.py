"""What the MSCCL executor (Azure/msccl-executor-nccl) accepts: its limits and its XML vocabulary.

The writer (:mod:`flowride.program.msccl_write`) stays within these numbers and the reader
(:mod:`flowride.program.msccl_read`) refuses what goes beyond them, so both follow one reading of
``msccl_struct.h``, ``msccl_parser.h`` and ``msccl_kernel.cu`` (see ``docs/msccl.md``). Offsets
count chunks of ``count * sizeMultiplier / nchunksperloop`` elements.
"""

from __future__ import annotations

import re

from flowride.collectives.demand import Collective

# Limits of the executor (msccl_struct.h, msccl_parser.h, msccl_kernel.cu).
MAX_STEPS_PER_TB = 64  # MSCCL_MAX_NUM_STEPS: bound on a step's ``s``
MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL, counted for send and recv peers
MAX_CHANNELS = 32  # MAXCHANNELS of NCCL
MAX_TBS = MAX_TBS_PER_CHANNEL * MAX_CHANNELS  # MSCCL_MAX_NUM_THREAD_BLOCKS
MAX_COUNT = 72  # MSCCL_MAX_COUNT: cnt must stay below it
MAX_DEP_TB = 127  # dependentBid is an int8_t
MAX_OFFSET = 32767  # srcOffset / dstOffset are int16_t
MAX_NODES = 4096  # XML elements the parser keeps per rank: algo, every gpu, own tbs and steps
MAX_NAME = 128  # attribute values are read into 255-byte buffers without a bound check

COLLS = {c.value: c for c in Collective}
OTHER_COLLS = ("reduce", "broadcast", "send", "recv", "gather", "scatter", "alltoallv")
PROTOS = ("Simple", "LL128", "LL")
STEP_ATTRS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")
SEND_TYPES = frozenset({"s", "rcs", "rrs", "rrcs"})
RECV_TYPES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
STEP_TYPES = SEND_TYPES | RECV_TYPES | {"cpy", "re", "nop"}
# local slots each step type reads (src) and writes (dst); the other field is informational
LOCAL_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
LOCAL_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
# the fields the executor bounds-checks (checkSrc / checkDst in msccl_parser.cc)
CHECKED_SRC = frozenset({"s", "rrs", "rrcs", "cpy", "re"})
CHECKED_DST = frozenset({"r", "rcs", "rrcs", "cpy", "re"})


def clean_name(name: str) -> str:
    """An algorithm name the executor reads safely: ``[A-Za-z0-9_.+-]``, at most MAX_NAME
    characters (both the writer and the reader name algorithms this way)."""
    text = re.sub(r"[^A-Za-z0-9_.+-]+", "_", str(name)).strip("_") or "flowride"
    return text[:MAX_NAME]
