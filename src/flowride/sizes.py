"""The largest inputs flowride accepts, in one place (README: "Limits").

Each limit sits well above what was measured to work on a 2-core machine (a 1024-GPU torus
AllGather synthesises in 7 minutes) and well below what exhausts memory or hangs in native code.
Beyond a limit the input is refused before any work starts, with the size and the limit.
"""

MAX_NODES = 8192  # GPUs and switches of one topology
MAX_GPUS = 4096
MAX_LINKS = 262_144  # directed links
MIN_BANDWIDTH_GBPS = 1e-3  # 1 MB/s: slower links make epoch arithmetic overflow-prone
MAX_BANDWIDTH_GBPS = 1e6  # 1 PB/s
MAX_ALPHA_US = 1e6  # one second of link latency
MAX_CHUNKS = 1024  # chunks per source block
MAX_STAGES = 64  # pipeline stages, one local process each
MAX_MICROBATCHES = 4096
MAX_GRID_CELLS = 200_000  # schedule-show: stages x time steps drawn as text
MAX_SENDS = 20_000_000  # sends in one schedule file (the simulator replays them in minutes)
MAX_EPOCHS = 10_000_000  # the epoch a send may start in
MAX_BUFFER_BYTES = 10**15  # a size per GPU (1 PB; a run also needs the memory: see comm.launch)
MIN_EPOCH_S, MAX_EPOCH_S = 1e-12, 1.0  # an explicit --epoch
MAX_DATA_BYTES = 512 * 2**20  # flowride train --data: a text file read whole by every rank
DEFAULT_MAX_LOSS = 1.02  # export: a range's schedule may be at most 2% slower (modelled) than a size's own
MAX_JSON_MIB = 256  # an input JSON larger than this is refused unread
