// The CUDA engine's feeding: a batch's next slice onto its direction's copy stream, the
// events after its last slice and the batch's completion (stats, errors, the ticket), the
// feeder thread of each direction (a bounded ring of slices in flight) and feed_all() for a
// caller that needs the rest enqueued now. Locks: see cuda_transfer_engine.cpp.
#include <cstddef>
#include <memory>
#include <mutex>

#include "cuda_engine_internal.hpp"
#include "cuda_runtime.hpp"
#include "radixtier/cuda/cuda_transfer_engine.hpp"

namespace radixtier::cuda {
namespace {

using detail::classify;
using detail::cuda_error;
using detail::ErrorClass;

}  // namespace

void CudaTransferEngine::feed_slice(Lane& lane, Work& w) {
  if (w.finished) return;
  cudaStream_t stream = streams_[index(w.dir)];
  if (!w.started) {
    w.started = true;
    // Before the first slice: the batch's stream (compute -> copy), then every pending
    // ticket of TransferBatch::after (their events were recorded by submit()).
    if (w.ready != nullptr && w.err == cudaSuccess)
      w.err = rt_.stream_wait_event(stream, w.ready, 0);
    for (cudaEvent_t ev : w.after_events) {
      if (w.err != cudaSuccess) break;
      w.err = rt_.stream_wait_event(stream, ev, 0);
      ++w.counts.after_waits;
    }
    w.after_events.clear();
    if (!w.after_held.empty()) {  // the waits are enqueued: those events may be recycled now
      std::lock_guard lock(mu_);
      for (TicketId held : w.after_held) unhold(held);
      w.after_held.clear();
    }
  }
  if (w.err == cudaSuccess && w.next < w.slices.size()) {
    const SliceDesc& d = w.slices[w.next];
    const bool inject = w.inject == static_cast<std::int64_t>(w.next);
    if (cudaError_t err = enqueue_slice(w, d, inject); err != cudaSuccess) {
      w.err = err;
    } else {
      ++w.counts.slices;
      if (d.ends_group && w.groups_recorded < w.group_events.size()) {
        w.err = rt_.event_record(w.group_events[w.groups_recorded++], stream);
        ++w.counts.layer_events;
      }
    }
    ++w.next;
  }
  if (w.err != cudaSuccess || w.next >= w.slices.size()) finish(lane, w);
}

void CudaTransferEngine::finish(Lane& /*lane*/, Work& w) {
  if (w.finished) return;
  w.finished = true;
  w.next = w.slices.size();
  cudaStream_t stream = streams_[index(w.dir)];
  // Every event of the ticket follows what was enqueued, even after a failure: a GPU-side
  // wait never meets an event that was never recorded, and the batch's memory stays
  // off-limits until the GPU is done with it.
  cudaError_t record = cudaSuccess;
  while (w.groups_recorded < w.group_events.size() && record == cudaSuccess)
    record = rt_.event_record(w.group_events[w.groups_recorded++], stream);
  if (record == cudaSuccess) record = rt_.event_record(w.done, stream);
  if (record != cudaSuccess) (void)rt_.stream_synchronize(stream);  // nothing to wait on later

  std::lock_guard lock(mu_);
  stats_.slices += w.counts.slices;
  stats_.pieces += w.counts.pieces;
  stats_.kernel_launches += w.counts.launches;
  stats_.auto_kernel_slices += w.counts.auto_kernel;
  stats_.auto_dma_slices += w.counts.auto_dma;
  stats_.layer_events += w.counts.layer_events;
  stats_.d2d_launches += w.counts.d2d_launches;
  stats_.d2d_dma_runs += w.counts.d2d_dma_runs;
  stats_.after_waits += w.counts.after_waits;
  auto it = jobs_.find(w.id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  job.work.reset();
  for (cudaError_t e : {w.err, record}) {
    if (classify(e) == ErrorClass::kFatal) {
      job.failed = true;
      (void)mark_fatal(e, e == w.err ? "enqueue" : "cudaEventRecord");
    }
  }
  if (w.err != cudaSuccess) {
    job.failed = true;
    if (classify(w.err) != ErrorClass::kFatal) stats_.last_error = cuda_error("enqueue", w.err);
  }
  if (record != cudaSuccess) {
    free_events_.push_back(job.event);
    job.event = nullptr;
    job.failed = true;
    if (classify(record) != ErrorClass::kFatal)
      stats_.last_error = cuda_error("cudaEventRecord", record);
    settle(job, cudaSuccess, "submit");  // drained above: final now
  }
}

void CudaTransferEngine::feed_all(const std::shared_ptr<Work>& w) {
  Lane& lane = lanes_[index(w->dir)];
  std::lock_guard lock(lane.mu);
  while (!w->finished) feed_slice(lane, *w);
}

void CudaTransferEngine::feeder_loop(Direction dir) {
  Lane& lane = lanes_[index(dir)];
  // This thread's own settings for its whole life: relaxed capture mode, the engine's context.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)rt_.thread_exchange_stream_capture_mode(&mode);
  (void)rt_.ctx_set_current(ctx_);
  const std::size_t cap = lane.ring.size();
  std::unique_lock lock(lane.mu);
  while (true) {
    lane.cv.wait(lock, [&] { return lane.stop || !lane.queue.empty(); });
    if (lane.queue.empty()) break;  // stopped, nothing left
    const std::shared_ptr<Work> w = lane.queue.front();
    if (w->finished) {  // a waiter enqueued the rest
      lane.queue.pop_front();
      continue;
    }
    if (!lane.stop && lane.in_flight >= cap) {
      // The oldest slice in flight must finish first. A failure shows in the tickets' events.
      cudaEvent_t oldest = lane.ring[(lane.ring_next + cap - lane.in_flight) % cap];
      lock.unlock();
      (void)rt_.event_synchronize(oldest);
      lock.lock();
      --lane.in_flight;
      continue;
    }
    const std::size_t before = w->counts.slices;
    feed_slice(lane, *w);
    if (w->counts.slices != before &&
        rt_.event_record(lane.ring[lane.ring_next], streams_[index(dir)]) == cudaSuccess) {
      lane.ring_next = (lane.ring_next + 1) % cap;
      ++lane.in_flight;
    }
    if (w->finished) lane.queue.pop_front();
  }
  lock.unlock();
  (void)rt_.get_last_error();  // nothing this thread left behind is anyone's
  (void)rt_.ctx_set_current(nullptr);
}

}  // namespace radixtier::cuda
