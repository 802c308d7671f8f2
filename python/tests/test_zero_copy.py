"""The host engine's arenas as tensors: a model writes K/V straight into the cache's pages and
the cache moves those very bytes (no copy in the binding)."""

import numpy as np
import pytest
import torch

import radixtier as rt
from conftest import Stack, small_config


def test_views_share_the_arenas_memory(stack):
    a = stack.arenas
    for view, items, item in [(a.gpu_kv, 16, 64), (a.host_kv, 40, 64),  # the one host pool: 32 + 8 x 1
                              (a.gpu_snapshots, 4, 32), (a.host_snapshots, 8, 32)]:
        arr = np.asarray(view)
        assert arr.shape == (items, item) and arr.dtype == np.uint8 and arr.flags.writeable
        assert arr.ctypes.data == view.address
        t = rt.as_tensor(view)
        assert t.data_ptr() == view.address and t.shape == (items, item)
    kv = rt.as_tensor(a.gpu_kv, torch.float32, (16, 2, 2, 4))
    kv[3, 1, 0, 2] = 2.5
    assert np.asarray(a.gpu_kv).view(np.float32).reshape(16, 16)[3, 10] == 2.5
    odd = rt.HostArenas(small_config(snapshot_bytes=12))
    with pytest.raises(rt.InvalidArgumentError, match="whole number"):
        rt.as_tensor(odd.gpu_snapshots, torch.float64)


def test_views_keep_the_arenas_alive():
    s = Stack()
    t = rt.as_tensor(s.arenas.gpu_kv, torch.float32)
    t.fill_(1.0)
    del s
    import gc
    gc.collect()
    assert float(t.sum()) == 16 * 16  # still the arena's memory, still valid


def test_engine_copies_the_bytes_a_tensor_wrote():
    s = Stack()
    gpu = rt.as_tensor(s.arenas.gpu_kv, torch.float32)
    host = rt.as_tensor(s.arenas.host_kv, torch.float32)
    gpu[5] = torch.arange(16, dtype=torch.float32)
    t = s.engine.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[5, 9]]))
    assert t.wait() == rt.TransferState.DONE
    assert torch.equal(host[9], gpu[5])
    host[9] += 1
    s.engine.submit(rt.Direction.HOST_TO_DEVICE, pages=np.array([[2, 9]])).wait()
    assert torch.equal(gpu[2], torch.arange(16, dtype=torch.float32) + 1)
    with pytest.raises(rt.InvalidArgumentError, match="out of range"):
        s.engine.submit(rt.Direction.DEVICE_TO_HOST, pages=np.array([[99, 0]]))


def test_bytes_written_through_tensors_survive_demotion_and_promotion():
    """A request writes its pages and snapshot through torch views; other traffic pushes them
    to host; a later admission promotes them: the bytes are the ones written (rule 5)."""
    cfg = small_config(gpu_pages=8, host_pages=32, gpu_snapshot_slots=2, host_snapshot_slots=8)
    s = Stack(cfg)
    kv = rt.as_tensor(s.arenas.gpu_kv, torch.float32)
    snaps = rt.as_tensor(s.arenas.gpu_snapshots, torch.float32)
    c = s.cache
    conv = np.arange(1000, 1016, dtype=np.int32)  # 4 pages
    a = c.admit(np.append(conv, 0))
    pages = c.alloc_pages(a.lock, 4)
    slot = c.alloc_snapshot_slot(a.lock)
    payload = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    state = torch.randn(8, generator=torch.Generator().manual_seed(2))
    kv[torch.from_numpy(pages)] = payload
    snaps[slot] = state
    c.insert(a.lock, conv, pages, slot)
    c.release(a.lock)
    for base in (2000, 3000, 4000):  # other sessions: the conversation leaves the GPU
        s.serve(np.arange(base, base + 16, dtype=np.int32))
    m = c.match(conv)
    assert m.host_tokens == 16 and not m.snapshot_on_gpu
    kv.fill_(float("nan"))  # nothing on the GPU side may be relied on
    b = c.admit(np.append(conv, 0))
    assert b.cached_tokens == 16 and b.host_tokens == 16 and b.snapshot_from_host
    c.wait(b.lock)
    got = kv[torch.from_numpy(c.path_pages(b.lock))]
    assert torch.equal(got.view(torch.int32), payload.view(torch.int32))
    assert torch.equal(snaps[c.path_snapshot(b.lock)].view(torch.int32), state.view(torch.int32))
    c.release(b.lock)
    assert c.stats().kv_pages_promoted == 4 and c.check_invariants() == ""
