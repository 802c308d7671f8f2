"""The CUDA engine's binding. It is built when nvcc is found; without a GPU only what needs no
device runs: the description of an engine's device tensors (pointer, shape, strides, item
size) and its validation, and the engine's refusal to start without a device."""

import pytest

import radixtier as rt

pytestmark = pytest.mark.skipif(not rt.HAVE_CUDA, reason="built without nvcc")


class FakeCuda:
    """An object with __cuda_array_interface__ (what CuPy, Numba and torch expose)."""

    def __init__(self, shape, typestr="<f2", ptr=1 << 32, strides=None, readonly=False):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, readonly), "strides": strides,
                                         "version": 3}


class FakeTorch:
    """The torch tensor attributes the binding reads."""

    def __init__(self, shape, element_size=2, is_cuda=True, ptr=1 << 33):
        self.shape, self._es, self.is_cuda, self._ptr = tuple(shape), element_size, is_cuda, ptr
        self.device = type("Device", (), {"index": 0})()

    def data_ptr(self):
        return self._ptr

    def element_size(self):
        return self._es

    def stride(self):
        s, out = 1, []
        for d in reversed(self.shape):
            out.append(s)
            s *= d
        return tuple(reversed(out))


def test_layer_first_kv_pool_is_two_segments_per_layer():
    # [2, layers=3, pages=10, page_size=4, kv_heads=2, head_dim=8] fp16
    t = FakeCuda((2, 3, 10, 4, 2, 8))
    layout = rt.cuda.DeviceLayout.from_tensors(t, item_dim=2)
    chunk = 4 * 2 * 8 * 2
    assert layout.items == 10 and layout.item_bytes == 6 * chunk
    segs = layout.segments
    assert len(segs) == 6
    assert segs[0] == (1 << 32, chunk, chunk)
    assert segs[1] == ((1 << 32) + 10 * chunk, chunk, chunk)  # next layer
    assert segs[3] == ((1 << 32) + 30 * chunk, chunk, chunk)  # V of layer 0
    assert layout.sources[0] is t


def test_per_layer_tensors_and_snapshot_pools():
    ks = [FakeTorch((10, 4, 2, 8), ptr=(1 << 34) + i * (1 << 20)) for i in range(2)]
    vs = [FakeTorch((10, 4, 2, 8), ptr=(1 << 35) + i * (1 << 20)) for i in range(2)]
    kv = rt.cuda.DeviceLayout.from_tensors(ks + vs, item_dim=0)
    assert kv.items == 10 and len(kv.segments) == 4 and kv.item_bytes == 4 * 128
    assert kv.device == 0
    conv = FakeTorch((36, 5, 100), element_size=2, ptr=1 << 36)  # [layers, slots, conv]
    rec = FakeTorch((36, 5, 4, 8, 8), element_size=4, ptr=1 << 37)
    snaps = rt.cuda.DeviceLayout.from_tensors([conv, rec], item_dim=1)
    assert snaps.items == 5 and len(snaps.segments) == 72
    assert snaps.item_bytes == 36 * (200 + 4 * 8 * 8 * 4)


def test_device_tensors_are_validated():
    L = rt.cuda.DeviceLayout
    with pytest.raises(rt.InvalidArgumentError, match="CPU tensor"):
        L.from_tensors(FakeTorch((4, 8), is_cuda=False))
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        L.from_tensors(object())
    with pytest.raises(rt.InvalidArgumentError, match="contiguous"):
        L.from_tensors(FakeCuda((10, 4, 8), strides=(64, 2, 8)), item_dim=0)
    with pytest.raises(rt.InvalidArgumentError, match="items along dim"):
        L.from_tensors([FakeCuda((10, 8)), FakeCuda((9, 8), ptr=1 << 40)])
    with pytest.raises(rt.InvalidArgumentError, match="read-only"):
        L.from_tensors(FakeCuda((10, 8), readonly=True))
    with pytest.raises(rt.InvalidArgumentError, match="item_dim 3"):
        L.from_tensors(FakeCuda((10, 8)), item_dim=3)
    with pytest.raises(rt.InvalidArgumentError, match="overlap"):
        L.from_tensors(FakeCuda((10, 8), strides=(8, 2)))
    raw = L.from_segments([(1 << 32, 256, 256)], 4)
    assert raw.item_bytes == 256 and raw.items == 4


def test_layers_and_the_stream_rule():
    L = rt.cuda.DeviceLayout
    t = FakeCuda((2, 3, 10, 4, 2, 8))  # [2, layers=3, pages, ...]: segment c is layer c % 3
    assert L.from_tensors(t, item_dim=2, layers=3).layers == 3
    assert L.from_tensors(t, item_dim=2).layers == 0  # promotions then in page order
    with pytest.raises(rt.InvalidArgumentError, match="multiple of layers"):
        L.from_tensors(t, item_dim=2, layers=4)
    assert L.from_segments([(1 << 32, 256, 256), (1 << 33, 256, 256)], 4, layers=1).layers == 1
    # cudaStreamPerThread (handle 2) is a different stream on every thread: refused before
    # any device is needed. 0 is PyTorch's default stream, the legacy one: accepted.
    with pytest.raises(rt.InvalidArgumentError, match="cudaStreamPerThread"):
        rt.cuda.CudaTransferEngine(L.from_tensors(t, item_dim=2, layers=3), compute_stream=2)
    assert rt.cuda.CopyMethod.AUTO != rt.cuda.CopyMethod.DMA_BATCH


def test_engine_needs_a_device(monkeypatch):
    kv = rt.cuda.DeviceLayout.from_tensors(FakeCuda((10, 64)))
    # compute_stream defaults to 0, the legacy default stream. Without a device (or a driver
    # new enough for this module's CUDA runtime) the engine refuses to start and says why;
    # on a GPU the fake pointer is refused: it is in no device allocation.
    with pytest.raises((rt.FailedPreconditionError, rt.InvalidArgumentError)) as e:
        rt.cuda.CudaTransferEngine(kv, slice_pages=4)
    assert "cuda" in str(e.value).lower()


def test_pinned_pool_device_and_numa_arguments():
    """PinnedHostPool(device=..., numa_node=...): the device reaches the pool (it retains that
    GPU's context, not GPU 0's), None is torch's current device (an error without
    torch.cuda), and every bad argument is refused before anything is mapped."""
    import torch

    P = rt.cuda.PinnedHostPool
    with pytest.raises(rt.InvalidArgumentError, match="does not exist"):
        P(4096, 64, device=0, numa_node=1 << 15)
    with pytest.raises(rt.InvalidArgumentError, match="numa_node = -3"):
        P(4096, 64, device=0, numa_node=-3)
    with pytest.raises(rt.InvalidArgumentError, match="numa_strict"):
        P(4096, 64, device=0, numa_node=-1, numa_strict=True)
    with pytest.raises(rt.InvalidArgumentError, match="not >= 0"):
        P(4096, 64, device=-1)
    with pytest.raises(rt.InvalidArgumentError, match="not a CUDA device"):
        P(4096, 64, device="cpu")
    with pytest.raises(rt.InvalidArgumentError, match="cuda:N"):
        P(4096, 64, device="cuda:x")
    with pytest.raises(TypeError, match="device must be"):
        P(4096, 64, device=1.5)
    with pytest.raises(rt.InvalidArgumentError, match="bytes must be > 0"):
        P(0, 64, device=0)
    if torch.cuda.is_available():
        pytest.skip("the rest needs a machine without a CUDA device")
    with pytest.raises(rt.FailedPreconditionError, match="torch.cuda is not available"):
        P(4096, 64)
    with pytest.raises(rt.FailedPreconditionError, match="torch.cuda is not available"):
        P(4096, 64, device="cuda")  # no index: the current device, which needs torch.cuda
    # The device given is the one whose context the pool asks for.
    for device in (3, "cuda:3", torch.device("cuda", 3)):
        with pytest.raises(rt.FailedPreconditionError, match=r"PrimaryCtxRetain\(device 3\)"):
            P(4096, 64, device=device)
