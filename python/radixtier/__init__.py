"""radixtier: a node-residency prefix cache for hybrid (attention + Gated DeltaNet) models.

The C++ library through pybind11 (the extension radixtier._core):

    CacheConfig            the validated, immutable config
    PrefixCache            admit, poll, wait, path_pages, path_snapshot, alloc_pages,
                           alloc_snapshot_slot, free_pages, free_snapshot_slot, insert,
                           release; match, peek, evict, sizes, stats, occupancy,
                           check_invariants, drain, drop_host
    HostArenas             the host engine's byte arenas; each an ArenaView (buffer protocol):
                           a model writes K/V straight into the cache's pages
    HostTransferEngine     sliced copies between them, threaded or manual, fault injection
    SnapshotPolicy         the snapshot placement policies of the C++ scheduler
    disk                   the disk tier below host: DiskStore, DiskStoreEngine
    shared                 the shared tier: RedisCluster, SharedTier (HAVE_SHARED)
    cuda                   the CUDA engine over an engine's own device tensors (HAVE_CUDA)
    Error                  base of the exceptions a Status that is not ok becomes
    block_hash(es)         the KV events' chained block hashes, from tokens
    EventPublisher         KV events over ZMQ PUB, vLLM's wire format (HAVE_EVENTS)
    MetricsServer          Prometheus metrics over HTTP (HAVE_METRICS)

Ids cross as ints and int64 numpy arrays (torch.from_numpy shares them); token and page
arguments take numpy arrays, CPU torch tensors or sequences of ints.
"""

from radixtier._core import (  # noqa: F401
    HAVE_CUDA,
    HAVE_EVENTS,
    HAVE_METRICS,
    HAVE_SHARED,
    Admission,
    ArenaView,
    CacheConfig,
    CacheSizes,
    CacheStats,
    Copy,
    DeviceLostError,
    Direction,
    EngineHealth,
    Error,
    ErrorCode,
    EvictResult,
    FailedPreconditionError,
    HostArenas,
    HostEngineStats,
    HostTransferEngine,
    InsertResult,
    InvalidArgumentError,
    MatchResult,
    NodeInfo,
    NotFoundError,
    Occupancy,
    OutOfMemoryError,
    PendingError,
    PrefixCache,
    Residency,
    SnapshotEviction,
    SnapshotPolicy,
    SnapshotQuery,
    Ticket,
    TransferEngine,
    TransferFailedError,
    Tier,
    TierSizes,
    TransferState,
    WritePolicy,
    __version__,
    block_hash,
    block_hashes,
    disk,
)

if HAVE_CUDA:
    from radixtier._core import cuda  # noqa: F401
if HAVE_SHARED:
    from radixtier._core import shared  # noqa: F401
if HAVE_EVENTS:
    from radixtier._core import EventPublisher  # noqa: F401
if HAVE_METRICS:
    from radixtier._core import MetricsServer  # noqa: F401


def as_tensor(view, dtype=None, shape=None):
    """A torch tensor sharing an ArenaView's bytes (no copy).

    `dtype` (default torch.uint8) reinterprets the bytes; `shape` (default
    [items, item_bytes / dtype size]) views them, e.g. a KV pool as
    [pages, layers, 2, page_size, kv_heads, head_dim]. The tensor keeps the arenas alive.
    """
    import torch

    dtype = torch.uint8 if dtype is None else dtype
    itemsize = torch.empty((), dtype=dtype).element_size()
    if view.item_bytes % itemsize != 0:
        raise InvalidArgumentError(
            f"{view.name}: items of {view.item_bytes} bytes are not a whole number of "
            f"{dtype} elements")
    default = (view.items, view.item_bytes // itemsize)
    if view.nbytes == 0:
        return torch.empty(shape if shape is not None else default, dtype=dtype)
    t = torch.frombuffer(view, dtype=dtype)
    return t.view(*(shape if shape is not None else default))
