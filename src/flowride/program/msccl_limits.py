"""What the MSCCL executor (Azure/msccl-executor-nccl) accepts: its limits and its XML vocabulary.

Numbers only, so every module that reads or writes MSCCL XML (and :mod:`flowride.sweep`) shares
one reading of ``msccl_struct.h``, ``msccl_parser.h``/``.cc``, ``device.h`` and
``msccl_kernel.cu`` (see ``docs/msccl.md``); the rules built on them live in
:mod:`flowride.program.msccl_rules`. Offsets count chunks of
``count * sizeMultiplier / nchunksperloop`` elements.
"""

from __future__ import annotations

import re

from flowride.collectives.demand import Collective

# Limits of the executor (msccl_struct.h, msccl_parser.h, msccl_kernel.cu, makefiles/common.mk).
MAX_STEPS_PER_TB = 64  # MSCCL_MAX_NUM_STEPS: bound on a step's ``s``
MAX_TBS_PER_CHANNEL = 32  # MSCCL_MAX_NUM_THREAD_BLOCKS_PER_CHANNEL, counted for send and recv peers
MAX_CHANNELS = 32  # MAXCHANNELS of NCCL
MAX_TBS = MAX_TBS_PER_CHANNEL * MAX_CHANNELS  # MSCCL_MAX_NUM_THREAD_BLOCKS: thread blocks per GPU
MAX_COUNT = 72  # MSCCL_MAX_COUNT: cnt must stay below it
MAX_DEP_TB = 127  # dependentBid is an int8_t
MAX_OFFSET = 32767  # srcOffset / dstOffset are int16_t
MAX_NODES = 4096  # XML elements the parser keeps per rank: algo, every gpu, own tbs and steps
MAX_NAME = 128  # attribute values are read into 255-byte buffers without a bound check
MAX_REDUCE_FUSION = 16  # MSCCL_MAX_REDUCE_FUSION: re steps the kernel adds in one transmission

# Connection FIFOs (device.h, prims_simple.h, prims_ll.h, prims_ll128.h): NCCL_STEPS slots per
# connection; one send call takes MSCCL_CHUNKSTEPS (NCCL_STEPS / 2) slots with Simple and one
# slot with LL and LL128, so a connection holds this many unreceived sends per protocol.
NCCL_STEPS = 8
STEPS_PER_SEND = {"Simple": NCCL_STEPS // 2, "LL128": 1, "LL": 1}
SENDS_IN_FLIGHT = {p: NCCL_STEPS // k for p, k in STEPS_PER_SEND.items()}

# <algo> attributes the parser reads with mscclXmlGetAttr*: a missing one fails the load
# (mscclGetAlgoFromXmlFile, mscclGetAlgoMetaFromXmlFile in msccl_parser.cc); ``name`` is not read.
REQUIRED_ALGO_ATTRS = ("proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace", "outofplace", "minBytes", "maxBytes")

# Streaming multiprocessors of GPUs (NVIDIA's data sheets): an MSCCL kernel's thread blocks
# spin-wait on each other, so all of a GPU's must be resident at once, one per SM.
GPU_SMS = {"v100": 80, "a100": 108, "a30": 56, "a10": 72, "l4": 58, "l40s": 142, "h100": 132, "h100-pcie": 114, "h200": 132, "b200": 148}
# Without a target GPU, more thread blocks than this get a warning: the fewest SMs of the GPUs
# MSCCL's own algorithms are written for (NDv2 V100, NDv4 A100, NDv5 H100).
SMS_WARN = GPU_SMS["v100"]

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
