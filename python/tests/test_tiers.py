"""The stack an engine written in Python builds, tier by tier: the host engine (health, the
per-call stream, stream_wait), the disk tier below host (a restart serves the prefix bit-exact)
and the shared tier over a real Redis Cluster (a second instance resumes the first's prefix,
bit-exact). Every bad argument gets a clear error and changes nothing."""

import gc
import threading
import time

import numpy as np
import pytest

import radixtier as rt
from conftest import small_config

MODEL = "test/tiny-hybrid"


class Instance:
    """Arenas, host engine, optional disk tier and cache: one engine process."""

    def __init__(self, config, directory=None, model_id=MODEL, weights="w1", budget=1 << 20,
                 mode=rt.HostTransferEngine.Mode.THREADED):
        self.config = config
        self.arenas = rt.HostArenas(config)
        self.engine = rt.HostTransferEngine(self.arenas, config.slice_pages, mode)
        self.store = self.disk = None
        if directory is not None:
            self.store = rt.disk.DiskStore(str(directory), budget, config, model_id, weights)
            self.disk = rt.disk.DiskStoreEngine(self.store, self.engine)
        self.cache = rt.PrefixCache(config, self.engine, store=self.disk)

    def serve(self, tokens, seed):
        """Computes `tokens` (whole pages) as a request would: pages and a snapshot at the end,
        filled with bytes that depend on `seed` and the position; returns (page bytes,
        snapshot bytes) as written."""
        c, P = self.cache, self.config.page_size
        tokens = np.asarray(tokens, dtype=np.int32)
        a = c.admit(np.append(tokens, 0).astype(np.int32))
        assert c.wait(a.lock) == 0
        pages = c.alloc_pages(a.lock, len(tokens) // P)
        kv = np.asarray(self.arenas.gpu_kv)
        rng = np.random.default_rng(seed)
        written = rng.integers(0, 256, size=(len(pages), kv.shape[1]), dtype=np.uint8)
        kv[pages] = written
        slot = c.alloc_snapshot_slot(a.lock)
        snap = rng.integers(0, 256, size=self.config.snapshot_bytes, dtype=np.uint8)
        np.asarray(self.arenas.gpu_snapshots)[slot] = snap
        ins = c.insert(a.lock, tokens, pages, slot)
        assert len(ins.not_taken) == 0 and ins.snapshot_taken
        c.release(a.lock)
        return written, snap

    def resume(self, tokens):
        """Admits `tokens` + one more; returns (cached tokens, their page bytes, the snapshot's
        bytes) as the engine would read them on GPU."""
        c = self.cache
        a = c.admit(np.append(np.asarray(tokens, dtype=np.int32), 0).astype(np.int32))
        cached = c.wait(a.lock)
        kv = np.asarray(self.arenas.gpu_kv)[c.path_pages(a.lock)].copy()
        snap = np.asarray(self.arenas.gpu_snapshots)[c.path_snapshot(a.lock)].copy() \
            if cached else None
        c.release(a.lock)
        return cached, kv, snap


def tier_config(**changes):
    base = dict(page_size=4, gpu_pages=32, host_pages=64, gpu_snapshot_slots=4,
                host_snapshot_slots=8, page_bytes=64, snapshot_bytes=96, slice_pages=4)
    base.update(changes)
    return small_config(**base)


# --- the host engine: health, the per-call stream, stream_wait ---------------------------------

def test_host_engine_health_is_always_ok():
    inst = Instance(tier_config())
    h = inst.engine.health()
    assert h and h.ok and h.code == rt.ErrorCode.OK and h.message == ""
    assert inst.cache.health() == h or inst.cache.health().ok
    assert h.to_dict() == {"ok": True, "code": rt.ErrorCode.OK, "message": ""}
    assert not inst.engine.waits_on_device  # the host engine has no streams: it waits on the host


def test_host_engine_stream_wait_waits_on_the_host_and_reports_failures():
    inst = Instance(tier_config())
    e = inst.engine
    for _ in range(50):  # the worker may run a copy before delay_ticket reaches it: retry
        t = e.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[0, 0]]), stream=0)
        e.delay_ticket(t.id)
        time.sleep(0.02)
        if t.poll() == rt.TransferState.PENDING:
            break  # held back for good until resume()
    assert t.poll() == rt.TransferState.PENDING
    done = threading.Event()

    def waiter():
        e.stream_wait(t.id)  # no stream: torch's current one on a CUDA engine, ignored here
        done.set()

    w = threading.Thread(target=waiter)
    w.start()
    time.sleep(0.1)
    assert not done.is_set(), "stream_wait on the host engine returned before the copy"
    e.resume(t.id)
    w.join(timeout=10)
    assert done.is_set() and t.poll() == rt.TransferState.DONE
    e.stream_wait(t.id, layer=0)  # done: returns at once (the host engine has no layers)

    e.fail_nth_submission(0)  # the next copy fails when it runs
    bad = e.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[1, 1]]))
    with pytest.raises(rt.TransferFailedError, match="failed"):
        e.stream_wait(bad.id)


def test_per_call_stream_and_after_arguments_are_checked():
    inst = Instance(tier_config())
    e = inst.engine

    class TorchLikeStream:
        cuda_stream = 0x1234

    first = e.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[0, 0]]),
                     stream=TorchLikeStream())
    second = e.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[1, 1]]), after=[first.id])
    assert second.wait() == rt.TransferState.DONE and first.poll() == rt.TransferState.DONE
    before = e.stats().batches
    with pytest.raises(TypeError, match="stream must be"):
        e.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[2, 2]]), stream="current")
    with pytest.raises(TypeError, match="stream must be"):
        e.stream_wait(first.id, stream=1.5)
    with pytest.raises(rt.InvalidArgumentError, match="after"):
        e.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[2, 2]]), after=[-1])
    with pytest.raises(rt.InvalidArgumentError, match="layer"):
        e.stream_wait(first.id, layer=-1)
    assert e.stats().batches == before  # nothing submitted by the refused calls


# --- the disk tier ------------------------------------------------------------------------------

def test_disk_tier_serves_a_prefix_bit_exact_after_a_restart(tmp_path):
    cfg = tier_config()
    prompt = np.arange(100, 132, dtype=np.int32)  # 8 pages
    first = Instance(cfg, tmp_path / "store")
    assert first.store.recovery.created and first.disk.attached
    assert first.cache.store is first.disk
    kv, snap = first.serve(prompt, seed=1)
    first.cache.persist()  # graceful shutdown: every node gets a disk copy, synced
    st = first.store.stats()
    assert st.records >= 9 and st.unsynced_entries == 0  # 8 pages + 1 snapshot
    assert first.store.check_invariants() == ""
    del first
    gc.collect()

    second = Instance(cfg, tmp_path / "store")  # a new process: nothing on GPU or host
    rec = second.store.recovery
    assert not rec.created and rec.records == st.records
    assert second.cache.stats().restored_kv_pages == 8
    assert second.cache.stats().restored_snapshots == 1
    cached, got_kv, got_snap = second.resume(prompt)
    assert cached == 32
    assert np.array_equal(got_kv, kv) and np.array_equal(got_snap, snap)
    s = second.cache.stats()
    assert s.kv_pages_loaded == 8 and s.snapshots_loaded == 1 and s.hit_tokens_store == 32
    assert second.cache.check_invariants() == ""


def test_disk_tier_refuses_another_model_and_bad_arguments(tmp_path):
    cfg = tier_config()
    first = Instance(cfg, tmp_path / "s")
    first.serve(np.arange(16, dtype=np.int32), seed=2)
    first.cache.persist()
    del first
    gc.collect()
    with pytest.raises(rt.FailedPreconditionError, match="weights_version"):
        rt.disk.DiskStore(str(tmp_path / "s"), 1 << 20, cfg, MODEL, "w2")
    with pytest.raises(rt.FailedPreconditionError, match="page_bytes"):
        rt.disk.DiskStore(str(tmp_path / "s"), 1 << 20, cfg.replace(page_bytes=128), MODEL, "w1")
    wiped = rt.disk.DiskStore(str(tmp_path / "s"), 1 << 20, cfg, MODEL, "w2",
                              on_mismatch=rt.disk.OnMismatch.WIPE)
    assert wiped.recovery.wiped and wiped.records == 0
    with pytest.raises(rt.FailedPreconditionError):  # one DiskStore per directory
        rt.disk.DiskStore(str(tmp_path / "s"), 1 << 20, cfg, MODEL, "w2")
    wiped.close()
    assert wiped.closed
    with pytest.raises(rt.FailedPreconditionError, match="closed"):
        wiped.stats()
    with pytest.raises(rt.InvalidArgumentError, match="model_id"):
        rt.disk.DiskStore(str(tmp_path / "t"), 1 << 20, cfg, "")
    with pytest.raises(rt.InvalidArgumentError, match="budget_bytes"):
        rt.disk.DiskStore(str(tmp_path / "t"), -1, cfg, MODEL)
    with pytest.raises(rt.InvalidArgumentError, match="directory"):
        rt.disk.DiskStore("", 1 << 20, cfg, MODEL)
    with pytest.raises(rt.InvalidArgumentError, match="io_threads"):
        rt.disk.DiskStore(str(tmp_path / "t"), 1 << 20, cfg, MODEL, io_threads=-2)


def test_disk_store_engine_belongs_to_one_engine_and_one_cache(tmp_path):
    cfg = tier_config()
    a = Instance(cfg)
    store = rt.disk.DiskStore(str(tmp_path / "d"), 1 << 20, cfg, MODEL)
    disk = rt.disk.DiskStoreEngine(store, a.engine)
    with pytest.raises(rt.InvalidArgumentError, match="already has a DiskStoreEngine"):
        rt.disk.DiskStoreEngine(store, a.engine)
    with pytest.raises(TypeError, match="DiskStore"):
        rt.disk.DiskStoreEngine(object(), a.engine)
    with pytest.raises(TypeError, match="HostTransferEngine"):
        rt.disk.DiskStoreEngine(store, object())
    other = Instance(cfg)
    with pytest.raises(rt.InvalidArgumentError, match="another transfer engine"):
        rt.PrefixCache(cfg, other.engine, store=disk)
    assert not disk.attached
    with pytest.raises(TypeError, match="DiskStoreEngine"):
        rt.PrefixCache(cfg, a.engine, store=store)
    with pytest.raises(rt.FailedPreconditionError):
        a.cache.persist()  # a cache without a store
    with pytest.raises(rt.InvalidArgumentError, match="already serves a PrefixCache"):
        rt.PrefixCache(cfg, a.engine, store=disk)  # a.cache is on a.engine
    assert not disk.attached
    a.cache = None
    gc.collect()
    cache = rt.PrefixCache(cfg, a.engine, store=disk)
    with pytest.raises(rt.InvalidArgumentError, match="already serves a cache"):
        rt.PrefixCache(cfg, a.engine, store=disk)
    with pytest.raises(rt.FailedPreconditionError, match="DiskStoreEngine still uses it"):
        store.close()
    assert disk.capacity_slots == (1 << 20) // 64 and disk.pending_tickets == 0
    del cache
    gc.collect()
    assert not disk.attached  # the cache is gone: the store engine may serve another
    with pytest.raises(rt.InvalidArgumentError, match="pages are 64 bytes, the store's pages 128"):
        rt.disk.DiskStoreEngine(
            rt.disk.DiskStore(str(tmp_path / "e"), 1 << 20, cfg.replace(page_bytes=128), MODEL),
            a.engine)


# --- the shared tier (the `cluster` fixture: conftest.py) -----------------------------------------

def shared_tier(inst, cluster, **changes):
    options = dict(weights_version="w1", kv_dtype="u8", min_tokens=4, probe_deadline_ms=2000,
                   fetch_deadline_ms=5000, publish_deadline_ms=5000)
    options.update(changes)
    return rt.shared.SharedTier(inst.cache, rt.shared.RedisCluster(cluster.seeds), MODEL,
                                **options)


@pytest.mark.skipif(not rt.HAVE_SHARED, reason="built without radixtier::shared (hiredis, "
                    "libsodium)")
def test_shared_tier_second_instance_resumes_the_first_ones_prefix(cluster):
    cfg = tier_config(write_policy=rt.WritePolicy.WRITE_THROUGH)
    prompt = np.arange(300, 364, dtype=np.int32)  # 16 pages
    a, b = Instance(cfg), Instance(cfg)
    tier_a, tier_b = shared_tier(a, cluster), shared_tier(b, cluster)
    kv, snap = a.serve(prompt, seed=3)
    a.cache.drain()  # the write-through copies landed: host copies to publish
    tier_a.after_finish(prompt)
    tier_a.flush_publishes()
    sa = tier_a.stats()
    assert sa.publish_jobs == 1 and sa.published_keys >= 17 and sa.publish_failures == 0
    assert cluster.dbsize() >= 17

    assert b.cache.peek(np.append(prompt, 0)).resume_tokens == 0  # b has computed nothing
    fetched = tier_b.before_admit(np.append(prompt, 0).astype(np.int32))
    assert fetched.tokens == 64 and fetched.bytes >= 16 * 64 + 96
    cached, got_kv, got_snap = b.resume(prompt)
    assert cached == 64
    assert np.array_equal(got_kv, kv) and np.array_equal(got_snap, snap)
    sb = tier_b.stats()
    assert sb.imports == 1 and sb.imported_pages == 16 and sb.imported_snapshots == 1
    assert sb.values_rejected == 0
    assert b.cache.check_invariants() == ""

    # Another weights version names other keys: nothing to fetch, nothing entered.
    c = Instance(cfg)
    tier_c = shared_tier(c, cluster, weights_version="w2")
    assert tier_c.before_admit(np.append(prompt, 0).astype(np.int32)).tokens == 0
    assert c.resume(prompt)[0] == 0
    for t in (tier_a, tier_b, tier_c):
        t.close()
    with pytest.raises(rt.FailedPreconditionError, match="closed"):
        tier_a.pump()


@pytest.mark.skipif(not rt.HAVE_SHARED, reason="built without radixtier::shared")
def test_shared_tier_arguments_are_checked(cluster):
    inst = Instance(tier_config())
    fp = dict(weights_version="w1", kv_dtype="u8")
    store = rt.shared.RedisCluster(cluster.seeds)
    assert "127.0.0.1" in store.describe() and store.stats().connect_errors == 0
    with pytest.raises(rt.InvalidArgumentError, match="model_id"):
        rt.shared.SharedTier(inst.cache, store, "")
    with pytest.raises(rt.InvalidArgumentError, match="kv_dtype"):
        rt.shared.SharedTier(inst.cache, store, MODEL, weights_version="w1")
    with pytest.raises(rt.InvalidArgumentError, match="tp_rank"):
        rt.shared.SharedTier(inst.cache, store, MODEL, tp_rank=2, tp_size=2, **fp)
    with pytest.raises(rt.InvalidArgumentError, match="key"):
        rt.shared.SharedTier(inst.cache, store, MODEL, namespace_keys={0: b"short"}, **fp)
    with pytest.raises(rt.InvalidArgumentError, match="probe_deadline_ms"):
        rt.shared.SharedTier(inst.cache, store, MODEL, probe_deadline_ms=-1, **fp)
    with pytest.raises(TypeError, match="RedisCluster"):
        rt.shared.SharedTier(inst.cache, object(), MODEL, **fp)
    with pytest.raises(TypeError, match="PrefixCache"):
        rt.shared.SharedTier(object(), store, MODEL, **fp)
    with pytest.raises(rt.InvalidArgumentError, match="seeds"):
        rt.shared.RedisCluster([])
    with pytest.raises(rt.InvalidArgumentError, match="connect_timeout_ms"):
        rt.shared.RedisCluster(cluster.seeds, connect_timeout_ms=-5)
    with pytest.raises(rt.Error):
        rt.shared.RedisCluster(["127.0.0.1:1"], connect_timeout_ms=200)  # nothing listens
    tier = rt.shared.SharedTier(inst.cache, store, MODEL, weights_version="w1", kv_dtype="u8")
    with pytest.raises(rt.InvalidArgumentError, match="namespace"):
        tier.lookup(np.arange(8, dtype=np.int32), namespace=-1)
    assert tier.lookup(np.arange(8, dtype=np.int32)) == 0  # below min_tokens: no probe
    assert tier.stats().lookups == 0


# --- the per-call stream through the cache (RequestOptions::stream, PrefixCache::stream_wait) --

def test_cache_stream_wait_waits_on_the_host_engine():
    """The host engine has no streams: cache.stream_wait(lock) waits on the host for the lock's
    promotion (counted in host_waits), then path_pages() hands out the pages."""
    cfg = tier_config()
    inst = Instance(cfg, mode=rt.HostTransferEngine.Mode.MANUAL)  # copies run when waited for
    prompt = np.arange(500, 532, dtype=np.int32)
    kv, _ = inst.serve(prompt, seed=4)
    inst.cache.evict(tokens=1 << 20)  # the KV to host: the next admission promotes it
    inst.cache.drain()
    e, c = inst.engine, inst.cache
    a = c.admit(np.append(prompt, 0).astype(np.int32), stream=0)
    assert a.promoting and c.poll(a.lock) == rt.TransferState.PENDING
    before = c.stats().host_waits
    c.stream_wait(a.lock)
    assert c.poll(a.lock) == rt.TransferState.DONE
    assert c.stats().host_waits > before
    assert np.array_equal(np.asarray(inst.arenas.gpu_kv)[c.path_pages(a.lock)], kv)
    c.release(a.lock)


def test_cache_stream_arguments_are_checked():
    inst = Instance(tier_config())
    c = inst.cache
    before = c.stats().admissions
    with pytest.raises(TypeError, match="stream must be"):
        c.admit(np.arange(9, dtype=np.int32), stream="current")
    assert c.stats().admissions == before  # refused before the cache saw it
    a = c.admit(np.arange(9, dtype=np.int32))
    with pytest.raises(rt.InvalidArgumentError, match="layer"):
        c.stream_wait(a.lock, layer=-1)
    with pytest.raises(TypeError, match="stream must be"):
        c.stream_wait(a.lock, stream=1.5)
    c.release(a.lock)
    with pytest.raises(rt.NotFoundError):
        c.stream_wait(a.lock)
