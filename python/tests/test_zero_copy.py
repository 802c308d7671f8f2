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


def test_device_to_device_materializes_a_slot_into_pages_and_resumes_it():
    """DEVICE_TO_DEVICE slot pieces: a snapshot slot into scattered GPU pages (the last one
    partly filled) and back into another slot, byte for byte; bad batches are refused whole."""
    s = Stack(small_config(snapshot_bytes=150))  # 64-byte pages: pieces of 64, 64 and 22 bytes
    kv, snaps = np.asarray(s.arenas.gpu_kv), np.asarray(s.arenas.gpu_snapshots)
    kv[:] = 0x5A
    snaps[1] = (np.arange(150) * 37 + 11) % 251 + 1
    snaps[3] = 0
    pages = [9, 2, 14]
    down = np.array([[1, 64 * k, p, 0] for k, p in enumerate(pages)])
    t = s.engine.submit(rt.Direction.DEVICE_TO_DEVICE, slot_pieces=down)
    assert t.wait() == rt.TransferState.DONE
    assert np.array_equal(kv[9], snaps[1][:64]) and np.array_equal(kv[2], snaps[1][64:128])
    assert np.array_equal(kv[14][:22], snaps[1][128:]) and (kv[14][22:] == 0x5A).all()
    assert (np.delete(kv, pages, axis=0) == 0x5A).all()
    up = np.array([[3, 64 * k, p, 1] for k, p in reversed(list(enumerate(pages)))])
    assert s.engine.submit(rt.Direction.DEVICE_TO_DEVICE, slot_pieces=up).wait() == \
        rt.TransferState.DONE
    assert np.array_equal(snaps[3], snaps[1])
    st = s.engine.stats()
    assert st.bytes_d2d == 300 and st.bytes_d2h == 0 and st.bytes_h2d == 0
    before = (kv.copy(), snaps.copy())
    for direction, pieces in [(rt.Direction.DEVICE_TO_HOST, [[1, 0, 9, 0]]),  # wrong direction
                              (rt.Direction.DEVICE_TO_DEVICE, [[1, 0, 9, 0], [1, 5, 2, 0]]),
                              (rt.Direction.DEVICE_TO_DEVICE, [[1, 0, 9, 0], [1, 192, 2, 0]]),
                              (rt.Direction.DEVICE_TO_DEVICE, [[1, 0, 16, 1]]),
                              (rt.Direction.DEVICE_TO_DEVICE, [[4, 0, 9, 1]])]:
        with pytest.raises(rt.InvalidArgumentError, match="rejected"):
            s.engine.submit(direction, slot_pieces=np.array(pieces))
    with pytest.raises(rt.InvalidArgumentError, match="rejected"):
        s.engine.submit(rt.Direction.DEVICE_TO_DEVICE, pages=np.array([[5, 9]]),
                        slot_pieces=down)
    with pytest.raises(rt.InvalidArgumentError, match="shape"):
        s.engine.submit(rt.Direction.DEVICE_TO_DEVICE, slot_pieces=np.array([[1, 0, 9]]))
    with pytest.raises(rt.InvalidArgumentError, match="to_slot"):
        s.engine.submit(rt.Direction.DEVICE_TO_DEVICE, slot_pieces=np.array([[1, 0, 9, 2]]))
    assert np.array_equal(kv, before[0]) and np.array_equal(snaps, before[1])
    assert s.engine.stats().batches == 2


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
