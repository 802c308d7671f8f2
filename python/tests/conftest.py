"""pytest setup: import `radixtier` from the build tree and `reference_engine` from python/.

ctest sets PYTHONPATH itself; when pytest is run by hand this finds build/default/python (or
$RADIXTIER_BUILD_DIR/python)."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
try:
    import radixtier  # noqa: F401
except ImportError:
    build = Path(os.environ.get("RADIXTIER_BUILD_DIR", ROOT / "build" / "default"))
    sys.path.insert(0, str(build / "python"))
    import radixtier  # noqa: F401


def small_config(**changes):
    import radixtier as rt

    base = dict(page_size=4, gpu_pages=16, host_pages=32, gpu_snapshot_slots=4,
                host_snapshot_slots=8, page_bytes=64, snapshot_bytes=32, slice_pages=2)
    base.update(changes)
    return rt.CacheConfig(**base)


class Stack:
    """Arenas + engine + cache for one config."""

    def __init__(self, config=None, mode=None):
        import radixtier as rt

        self.config = config or small_config()
        self.arenas = rt.HostArenas(self.config)
        mode = mode if mode is not None else rt.HostTransferEngine.Mode.THREADED
        self.engine = rt.HostTransferEngine(self.arenas, self.config.slice_pages, mode)
        self.cache = rt.PrefixCache(self.config, self.engine)

    def serve(self, tokens, snapshot=True):
        """Inserts `tokens` (whole pages) as one request would, then releases; returns the
        page ids the request computed into."""
        tokens = np.asarray(tokens, dtype=np.int32)
        a = self.cache.admit(np.append(tokens, 0).astype(np.int32))
        self.cache.wait(a.lock)
        table = self.cache.path_pages(a.lock)
        need = len(tokens) // self.config.page_size - len(table)
        table = np.concatenate([table, self.cache.alloc_pages(a.lock, need)])
        slot = self.cache.alloc_snapshot_slot(a.lock) if snapshot else None
        self.cache.insert(a.lock, tokens, table, slot)
        self.cache.release(a.lock)
        return table


@pytest.fixture
def stack():
    s = Stack()
    yield s
    assert s.cache.check_invariants() == ""


@pytest.fixture(scope="session")
def cluster():
    """A Redis Cluster of three redis-server masters on loopback ports (redis_cluster.py),
    stopped after the session; the test is skipped, saying why, without redis-server."""
    from redis_cluster import LocalCluster, redis_server

    if redis_server() is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    c = LocalCluster(masters=3)
    yield c
    c.stop()
