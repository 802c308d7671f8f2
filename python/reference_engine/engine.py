"""A minimal serving engine around radixtier: the hybrid model, its KV pool and snapshot slots
in the cache's own arenas (zero-copy), and a scheduler that drives the cache.

A request's life (the C++ reference scheduler's, src/scheduler/scheduler.hpp):

  admit       cache.admit(prompt) -> lock + usable match. A match still arriving: with
              EngineConfig.stream_wait, cache.stream_wait(lock) orders the compute stream after
              its copies (the CUDA engine waits on the device, the host engine on the host) and
              the forward starts at once; otherwise, or when a copy already failed,
              cache.wait(lock) -> the tokens it resumes from (less than the match when a copy
              failed: the lock moved to the deepest usable boundary; a refused copy raises
              TransferFailedError: release and admit again); the page
              table starts with cache.path_pages(lock); the live state is a COPY of snapshot
              slot cache.path_snapshot(lock) (rule 6) or zeros.
  confirm     after stream_wait, before the first commit (insert, sampling):
              cache.poll(lock) == DONE, else what was computed is discarded and the request is
              admitted again (it matches less, rule 7).
  prefill     chunks cut at multiples of chunk_tokens (absolute positions, so boundaries line
              up across requests), where the policy asks (next_cut) and at the prompt floored
              to a page; after a chunk that ends on a page boundary, insert the pages, with a
              snapshot of the live state when the policy keeps one there.
  decode      one token per step; a page when one fills; a checkpoint of the state at each
              page boundary.
  finish      insert the finish boundary with the checkpoint as its snapshot, free own pages,
              release.
  no GPU room the youngest running request is preempted (re-admitted later, it resumes from
              what it inserted) or, alone, fails.

Requests in flight take turns: one chunk or one decode token each per step, on a virtual clock
of 1e-4 s per forwarded token (arrival-time scheduling is the same on every machine).

Ids stay in numpy int64 arrays end to end: page tables, insert/free arguments and the
adopted/duplicate bookkeeping are array operations, never a Python loop per page.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

import radixtier as rt
from reference_engine.model import HybridModel

SECONDS_PER_TOKEN = 1e-4


@dataclass
class EngineConfig:
    page_size: int = 16
    gpu_pages: int = 128
    host_pages: int = 1024
    gpu_snapshot_slots: int = 4
    host_snapshot_slots: int = 32
    slice_pages: int = 32
    write_policy: rt.WritePolicy = rt.WritePolicy.WRITE_BACK
    snapshot_eviction: rt.SnapshotEviction = rt.SnapshotEviction.COST_AWARE
    chunk_tokens: int = 128
    max_running: int = 1
    policy: str = "budgeted"
    max_admissions: int = 8
    check_invariants: bool = False
    engine_mode: rt.HostTransferEngine.Mode = rt.HostTransferEngine.Mode.THREADED
    metrics_bind: str | None = None  # "host:port": serve Prometheus metrics (rt.MetricsServer)
    events_endpoint: str | None = None  # ZMQ PUB address for KV events (rt.EventPublisher)
    events_replay_endpoint: str = ""  # its replay socket ("": none)
    # More rt.EventPublisher keywords: wire_format, data_parallel_rank, namespace_names,
    # snapshot_endpoint... (docs/events-and-metrics.md).
    events_options: dict = field(default_factory=dict)
    # "cpu": the host engine, the model in its arenas. "cuda" / "cuda:N": the model's KV pool
    # and snapshot slots are CUDA tensors, the host tier a pinned pool of that GPU, copies by
    # the CUDA engine on torch's current stream.
    device: str = "cpu"
    # A resumed prefix still arriving does not hold the scheduler's thread: its forward starts
    # on a stream ordered after the copies (cache.stream_wait), and the request checks
    # cache.poll(lock) before its first commit. False: cache.wait(lock) at admission.
    stream_wait: bool = True
    # The disk tier below host (rt.disk): a directory and a byte budget; close() persists.
    disk_dir: str | None = None
    disk_budget_bytes: int = 64 << 20
    # The shared tier (rt.shared): Redis Cluster seeds ("host:port"); needs WRITE_THROUGH.
    shared_seeds: list[str] | None = None
    # More rt.shared.SharedTier keywords (min_tokens, deadlines, namespace_salts...).
    shared_options: dict = field(default_factory=dict)
    # What the disk and shared tiers name the model's bytes by (another model's are refused).
    model_id: str = "radixtier/reference-hybrid"


@dataclass
class Request:
    id: int
    prompt: np.ndarray
    max_new_tokens: int = 0
    arrival_s: float = 0.0
    label: str = ""


@dataclass
class Result:
    id: int
    label: str = ""
    error: str = ""
    output: list[int] = field(default_factory=list)
    first_logits: torch.Tensor | None = None
    final_logits: torch.Tensor | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    host_cached_tokens: int = 0
    recomputed_tokens: int = 0
    kv_tokens: int = 0
    snapshots_kept: int = 0
    admissions: int = 0
    transfer_failures: int = 0
    preemptions: int = 0
    shared_tokens: int = 0  # the boundary the shared tier brought before admission (0: none)


@dataclass
class _Running:
    req: Request
    res: Result
    lock: int
    table: np.ndarray  # int64 page ids, page i holds positions [i*P, (i+1)*P)
    owned: np.ndarray  # bool: table[i] is this request's (not the tree's)
    seq: list[int]  # prompt + output so far
    state: torch.Tensor  # the request's own live recurrent state
    done: int = 0  # positions computed (the live state's position)
    inserted: int = 0  # boundary the lock has moved down to
    checkpoint: torch.Tensor | None = None
    checkpoint_at: int = 0
    logits: torch.Tensor | None = None
    prefilled: bool = False
    unconfirmed: bool = False  # started after stream_wait: poll(lock) before the first commit


class Engine:
    """The model, the cache and its host engine, and the scheduler loop."""

    def __init__(self, model: HybridModel, config: EngineConfig,
                 failing_submissions=(), fail_at_admission=None):
        """failing_submissions: copies (0-based submission counts from the start) that fail;
        fail_at_admission: {request id: [n, ...]}: when that request is first admitted, the
        n-th copy submitted from then on fails (0: its own promotion)."""
        if config.page_size != model.page_size:
            raise ValueError(f"EngineConfig.page_size {config.page_size} != the model's "
                             f"{model.page_size}")
        if config.chunk_tokens <= 0 or config.chunk_tokens % model.page_size:
            raise ValueError("EngineConfig.chunk_tokens must be a positive page multiple")
        self.model = model
        self.cfg = config
        self.policy = rt.SnapshotPolicy(config.policy)
        self.policy.validate(model.page_size)
        cache_config = rt.CacheConfig(
            page_size=model.page_size, gpu_pages=config.gpu_pages, host_pages=config.host_pages,
            gpu_snapshot_slots=config.gpu_snapshot_slots,
            host_snapshot_slots=config.host_snapshot_slots, page_bytes=model.page_bytes,
            snapshot_bytes=model.state_bytes, slice_pages=config.slice_pages,
            write_policy=config.write_policy, snapshot_eviction=config.snapshot_eviction)
        self.device = torch.device(config.device)
        if model.device.type != self.device.type or (
                self.device.index is not None and model.device.index != self.device.index):
            raise ValueError(f"the model is on {model.device}, EngineConfig.device is "
                             f"{self.device}: pass model.to(config.device)")
        if self.device.type == "cpu":
            self.arenas = rt.HostArenas(cache_config)
            self.transfers = rt.HostTransferEngine(self.arenas, config.slice_pages,
                                                   config.engine_mode)
            for n in failing_submissions:
                self.transfers.fail_nth_submission(n)
            # The model computes straight in the cache's memory.
            self.kv = model.kv_pool(self.arenas.gpu_kv, config.gpu_pages)
            self.slots = rt.as_tensor(self.arenas.gpu_snapshots, torch.float32,
                                      (config.gpu_snapshot_slots, model.state_floats))
        else:
            self._make_cuda_engine(model, config, cache_config,
                                   failing_submissions or fail_at_admission)
        self.disk_store = self.disk = None
        if config.disk_dir is not None:
            weights = hashlib.sha256(repr(model.cfg).encode()).hexdigest()[:16]
            self.disk_store = rt.disk.DiskStore(config.disk_dir, config.disk_budget_bytes,
                                                cache_config, config.model_id, weights)
            self.disk = rt.disk.DiskStoreEngine(self.disk_store, self.transfers)
        self.cache = rt.PrefixCache(cache_config, self.transfers, store=self.disk)
        self.shared = None
        if config.shared_seeds is not None:
            if config.write_policy != rt.WritePolicy.WRITE_THROUGH:
                raise ValueError("EngineConfig.shared_seeds needs write_policy=WRITE_THROUGH "
                                 "(what a request inserts must have host copies to publish)")
            if not rt.HAVE_SHARED:
                raise ValueError("EngineConfig.shared_seeds: radixtier was built without its "
                                 "shared tier (hiredis, libsodium)")
            options = dict(weights_version=hashlib.sha256(repr(model.cfg).encode()).hexdigest()
                           [:16], kv_dtype="fp32")
            options.update(config.shared_options)
            self.shared = rt.shared.SharedTier(
                self.cache, rt.shared.RedisCluster(list(config.shared_seeds)), config.model_id,
                **options)
        self.metrics = rt.MetricsServer(self.cache, config.metrics_bind) \
            if config.metrics_bind is not None else None
        self.events = rt.EventPublisher(self.cache, config.events_endpoint,
                                        config.events_replay_endpoint, **config.events_options) \
            if config.events_endpoint is not None else None
        self.fail_at_admission = dict(fail_at_admission or {})
        self.now = 0.0
        self.queue: list[tuple[Request, Result | None]] = []  # by arrival, then submission
        self.running: list[_Running] = []
        self.results: dict[int, Result] = {}
        self.hold_admission = False
        self.steps = 0
        self.preemptions = 0

    def _make_cuda_engine(self, model, config, cache_config, faults) -> None:
        """The model's KV pool and snapshot slots as CUDA tensors of this device, the host tier
        a pinned pool of the same GPU (its NUMA node), copies by the CUDA engine ordered after
        torch's current stream."""
        if not rt.HAVE_CUDA:
            raise ValueError(f"EngineConfig.device={config.device!r}: radixtier was built "
                             "without its CUDA engine (nvcc)")
        if faults:
            raise ValueError("fault injection (failing_submissions, fail_at_admission) is the "
                             "host engine's")
        dev = self.device if self.device.index is not None else \
            torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.arenas = None
        self.kv = torch.zeros((config.gpu_pages, *model.kv_shape), dtype=torch.float32,
                              device=dev)
        self.slots = torch.zeros((config.gpu_snapshot_slots, model.state_floats),
                                 dtype=torch.float32, device=dev)
        self.host_pool = rt.cuda.PinnedHostPool(cache_config.host_pool_pages * model.page_bytes,
                                                model.page_bytes, device=dev)
        self.transfers = rt.cuda.CudaTransferEngine(
            rt.cuda.DeviceLayout.from_tensors(self.kv, item_dim=0),
            rt.cuda.DeviceLayout.from_tensors(self.slots, item_dim=0), self.host_pool,
            slice_pages=config.slice_pages, device=dev,
            compute_stream=torch.cuda.current_stream(dev))

    def health(self):
        """The engine's health (rt.EngineHealth): the host engine is always ok; the CUDA
        engine reports DEVICE_LOST with the CUDA error once its context is gone."""
        return self.cache.health()

    def check_health(self) -> None:
        """Raises rt.DeviceLostError when the device is lost: the process must restart. Called
        after every failed copy (a sticky CUDA error fails every ticket)."""
        h = self.cache.health()
        if not h.ok:
            raise rt.DeviceLostError(f"the engine's device is lost: {h.message} (restart the "
                                     "process)")

    def close(self) -> None:
        """A graceful shutdown: publishes what is queued (shared tier), persists everything
        the cache holds to the disk tier. The engine serves nothing afterwards."""
        if self.shared is not None:
            self.shared.flush_publishes()
            self.shared.close()
        if self.disk is not None:
            self.cache.persist()

    # --- public -------------------------------------------------------------------------------
    def submit(self, request: Request) -> None:
        if len(request.prompt) == 0:
            raise ValueError(f"request {request.id}: empty prompt")
        # Checked here, not in the forward: a bad token found mid-run would leave the request
        # holding its lock and pages.
        prompt = np.asarray(request.prompt)
        if prompt.ndim != 1 or not np.issubdtype(prompt.dtype, np.integer):
            raise ValueError(f"request {request.id}: the prompt must be a 1-D integer array")
        vocab = self.model.cfg.vocab
        if prompt.min() < 0 or prompt.max() >= vocab:
            raise ValueError(f"request {request.id}: prompt tokens must be in [0, {vocab})")
        if request.max_new_tokens < 0:
            raise ValueError(f"request {request.id}: max_new_tokens must be >= 0")
        i = len(self.queue)
        while i > 0 and self.queue[i - 1][0].arrival_s > request.arrival_s:
            i -= 1
        self.queue.insert(i, (request, None))

    def run(self) -> dict[int, Result]:
        while self.queue or self.running:
            self.step()
            if self.metrics is not None:
                self.metrics.update()
        err = self.cache.check_invariants()
        if err:
            raise AssertionError(f"cache invariant broken: {err}")
        return self.results

    def step(self) -> None:
        self.steps += 1
        if not self.running and self.queue and self.queue[0][0].arrival_s > self.now:
            self.now = self.queue[0][0].arrival_s  # idle: jump to the next arrival
        while (not self.hold_admission and len(self.running) < self.cfg.max_running
               and self.queue and self.queue[0][0].arrival_s <= self.now):
            self._admit(*self.queue.pop(0))
        progressed = stalled = False
        i = 0
        while i < len(self.running):
            outcome = self._advance(self.running[i])
            if outcome in ("finished", "failed"):
                self.running.pop(i)
                progressed = True
                continue
            stalled |= outcome == "stalled"
            progressed |= outcome == "progress"
            i += 1
        if stalled and not progressed:
            victim = self.running.pop()
            if self.running:
                self._preempt(victim)
            else:
                self._fail(victim, f"request {victim.req.id} does not fit in the GPU KV pool "
                                   "even running alone")
        if self.cfg.check_invariants:
            err = self.cache.check_invariants()
            if err:
                raise AssertionError(f"cache invariant broken: {err}")

    # --- admission ----------------------------------------------------------------------------
    def _admit(self, req: Request, res: Result | None) -> None:
        res = res or Result(id=req.id, label=req.label, prompt_tokens=len(req.prompt))
        for n in self.fail_at_admission.pop(req.id, ()):
            self.transfers.fail_nth_submission(n)
        if self.shared is not None and res.admissions == 0:
            # What another instance computed enters the cache as host nodes; admit promotes it.
            res.shared_tokens = self.shared.before_admit(req.prompt).tokens
        while True:
            if res.admissions >= self.cfg.max_admissions:
                res.error = f"gave up after {res.admissions} admissions"
                self.results[req.id] = res
                return
            a = self.cache.admit(req.prompt)
            res.admissions += 1
            if self._stream_wait(a):
                cached, streamed = a.cached_tokens, True
                break
            streamed = False
            try:
                # wait() also reports a promotion that already failed.
                cached = self.cache.wait(a.lock)
            except rt.TransferFailedError:
                # The engine refused the copy: release and admit again (matches less), unless
                # the device is gone (recomputing on a lost context is pointless).
                self.cache.release(a.lock)
                res.transfer_failures += 1
                self.check_health()
                continue
            if cached < a.cached_tokens:
                # Rule 7: a copy failed; the lock moved to the deepest boundary still usable.
                res.transfer_failures += 1
                self.check_health()
            break
        table = np.zeros(0, dtype=np.int64)
        if cached > 0:
            table = self.cache.path_pages(a.lock)
            # Rule 6: the request runs on its own copy; the cached snapshot stays untouched.
            state = self.slots[self.cache.path_snapshot(a.lock)].clone()
        else:
            state = self.model.new_state()
        res.cached_tokens = cached
        res.host_cached_tokens = a.host_tokens if cached == a.cached_tokens else 0
        res.recomputed_tokens = len(req.prompt) - cached
        res.kv_tokens = max(a.kv_tokens, cached)
        res.output, res.first_logits, res.final_logits = [], None, None
        self.running.append(_Running(
            req=req, res=res, lock=a.lock, table=table,
            owned=np.zeros(len(table), dtype=bool), seq=[int(t) for t in req.prompt],
            state=state, done=cached, inserted=cached, unconfirmed=streamed))

    def _stream_wait(self, a) -> bool:
        """A resumed prefix still arriving: orders the compute stream after its copies. False:
        nothing to wait for, stream_wait is off, or a copy already failed (wait() sorts it)."""
        if not (self.cfg.stream_wait and a.promoting and a.cached_tokens > 0):
            return False
        try:
            self.cache.stream_wait(a.lock)
        except rt.TransferFailedError:
            return False
        return True

    def _confirm(self, r: _Running) -> bool:
        """Before the first commit of a request started after stream_wait: True when its
        prefix arrived. False: a copy failed after the forward started; what it computed is
        discarded and the request is admitted again (it matches less and recomputes)."""
        state = self.cache.poll(r.lock)
        if state == rt.TransferState.PENDING:
            # The forward ran on the stream after the copies; the host engine reports late.
            state = rt.TransferState.DONE if self.cache.wait(r.lock) == r.res.cached_tokens \
                else rt.TransferState.FAILED
        if state == rt.TransferState.DONE:
            r.unconfirmed = False
            return True
        r.res.transfer_failures += 1
        self.check_health()
        self._stop(r)
        self.queue.insert(0, (r.req, r.res))
        return False

    # --- running ------------------------------------------------------------------------------
    def _alloc(self, r: _Running, n: int) -> bool:
        try:
            pages = self.cache.alloc_pages(r.lock, n)
        except rt.OutOfMemoryError:
            return False
        r.table = np.concatenate([r.table, pages])
        r.owned = np.concatenate([r.owned, np.ones(len(pages), dtype=bool)])
        return True

    def _forward(self, r: _Running, tokens, pos: int) -> None:
        r.logits = self.model.forward(tokens, pos, torch.from_numpy(r.table), self.kv, r.state)
        self.now += SECONDS_PER_TOKEN * len(tokens)

    def _query(self, r: _Running, boundary: int, last_chunk=False, at_finish=False):
        return rt.SnapshotQuery(
            boundary=boundary, prompt_tokens=len(r.req.prompt),
            cached_tokens=r.res.cached_tokens, branch_tokens=r.res.kv_tokens,
            last_prompt_chunk=last_chunk, at_finish=at_finish,
            snapshot_bytes=self.model.state_bytes,
            kv_bytes_per_token=self.model.page_bytes // self.model.page_size,
            page_size=self.model.page_size, chunk_tokens=self.cfg.chunk_tokens)

    def _insert(self, r: _Running, boundary: int, state: torch.Tensor | None) -> None:
        slot = None
        if state is not None:
            try:
                slot = self.cache.alloc_snapshot_slot(r.lock)
                self.slots[slot].copy_(state)
            except rt.OutOfMemoryError:
                slot = None  # a snapshot is optional: go on without one
        n = boundary // self.model.page_size
        ins = self.cache.insert(r.lock, np.asarray(r.seq[:boundary], dtype=np.int32),
                                r.table[:n], slot)
        # Adopted pages are the tree's now. Where the tree kept its own copy of the same
        # prefix, switch the page table to it (same tokens, same positions, same bytes) and
        # free ours instead of holding the prefix twice.
        head, owned = r.table[:n].copy(), r.owned[:n].copy()
        still_ours = owned & np.isin(head, ins.not_taken)  # the rest was adopted
        tree = self.cache.path_pages(r.lock)
        dup = still_ours & (tree != head) if len(tree) == n else np.zeros(n, dtype=bool)
        if dup.any():
            self.cache.free_pages(r.lock, head[dup])
        r.table[:n] = np.where(dup, tree if len(tree) == n else head, head)
        r.owned[:n] = still_ours & ~dup
        if slot is not None:
            if ins.snapshot_taken:
                r.res.snapshots_kept += 1
            else:
                self.cache.free_snapshot_slot(r.lock, slot)
        r.inserted = boundary

    def _advance(self, r: _Running) -> str:
        try:
            if not r.prefilled:
                outcome = self._prefill_chunk(r)
                if outcome != "progress" or not r.prefilled or r.req.max_new_tokens > 0:
                    return outcome
                return self._finish(r)
            if len(r.res.output) < r.req.max_new_tokens:
                return self._decode(r)
            return self._finish(r)
        except rt.DeviceLostError:
            raise  # not this request's failure: the process must restart
        except rt.Error as e:
            self._fail(r, str(e))
            return "failed"

    def _prefill_chunk(self, r: _Running) -> str:
        P, chunk = self.model.page_size, self.cfg.chunk_tokens
        length = len(r.req.prompt)
        last_boundary = length // P * P
        start, end = r.done, length
        if start < last_boundary:
            end = min((start // chunk + 1) * chunk, last_boundary)
            cut = self.policy.next_cut(start)
            if cut is not None and cut < end:
                end = cut
        need = -(-end // P)
        if need > len(r.table) and not self._alloc(r, need - len(r.table)):
            return "stalled"
        self._forward(r, r.req.prompt[start:end], start)
        if r.unconfirmed and not self._confirm(r):
            return "failed"  # admitted again: its result is not recorded yet
        r.done = end
        if end % P == 0 and end > r.inserted:
            keep = self.policy.keep(self._query(r, end, last_chunk=end == last_boundary))
            self._insert(r, end, r.state if keep else None)
        if end < length:
            return "progress"
        r.prefilled = True
        r.res.first_logits = r.logits.clone()
        if r.req.max_new_tokens > 0:
            self._emit(r)
        return "progress"

    def _emit(self, r: _Running) -> None:
        t = self.model.greedy(r.logits)
        r.res.output.append(t)
        r.seq.append(t)

    def _decode(self, r: _Running) -> str:
        P, pos = self.model.page_size, r.done
        if pos // P + 1 > len(r.table) and not self._alloc(r, 1):
            return "stalled"
        self._forward(r, [r.seq[pos]], pos)
        r.done = pos + 1
        if r.done % P == 0:
            r.checkpoint = r.state.clone()
            r.checkpoint_at = r.done
        self._emit(r)
        return "progress"

    def _finish(self, r: _Running) -> str:
        r.res.final_logits = r.logits.clone()
        boundary = r.done // self.model.page_size * self.model.page_size
        if boundary > r.inserted and r.checkpoint_at == boundary:
            if self.policy.keep(self._query(r, boundary, at_finish=True)):
                self._insert(r, boundary, r.checkpoint)
        self._stop(r)
        if self.shared is not None and r.inserted > 0:
            self.shared.after_finish(np.asarray(r.seq[:r.inserted], dtype=np.int32))
        self.results[r.req.id] = r.res
        self.hold_admission = False
        return "finished"

    def _stop(self, r: _Running) -> None:
        self.cache.free_pages(r.lock, r.table[r.owned])
        self.cache.release(r.lock)
        r.table = np.zeros(0, dtype=np.int64)
        r.owned = np.zeros(0, dtype=bool)

    def _fail(self, r: _Running, why: str) -> None:
        self._stop(r)
        r.res.error = why
        self.results[r.req.id] = r.res
        self.hold_admission = False

    def _preempt(self, r: _Running) -> None:
        self._stop(r)
        r.res.preemptions += 1
        self.preemptions += 1
        self.queue.insert(0, (r.req, r.res))
        self.hold_admission = True


def reference_run(model: HybridModel, request: Request) -> Result:
    """The request computed from scratch: no scheduler, no cache, one forward() over the whole
    prompt, then token-by-token decode, in private memory. Every reuse run must match it bit
    for bit."""
    res = Result(id=request.id, label=request.label, prompt_tokens=len(request.prompt))
    total = len(request.prompt) + request.max_new_tokens
    pages = model.pages_for(total)
    kv = torch.zeros(pages, *model.kv_shape, device=model.device)
    table = torch.arange(pages)
    state = model.new_state()
    logits = model.forward(request.prompt, 0, table, kv, state)
    res.first_logits = logits.clone()
    pos = len(request.prompt)
    for i in range(request.max_new_tokens):
        t = model.greedy(logits)
        res.output.append(t)
        if i + 1 == request.max_new_tokens:
            break
        logits = model.forward([t], pos, table, kv, state)
        pos += 1
    res.final_logits = logits.clone()
    res.recomputed_tokens = len(request.prompt)
    return res


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is not None and b is not None and a.shape == b.shape
            and torch.equal(a.view(torch.int32), b.view(torch.int32)))


def same_answer(a: Result, b: Result) -> bool:
    """Output tokens, first logits and final logits bit-identical (and both ok)."""
    return (not a.error and not b.error and a.output == b.output
            and same_bits(a.first_logits, b.first_logits)
            and same_bits(a.final_logits, b.final_logits))
