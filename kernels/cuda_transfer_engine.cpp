// The CUDA transfer engine's entry points (see include/radixtier/cuda/cuda_transfer_engine.hpp):
// submit(), the tickets (poll, wait, release, the stream waits), their events and settling,
// the fatal status and the stats. The rest of the engine: see cuda_engine_internal.hpp.
//
// Locks: mu_ guards the tickets, the event pool, the stats and the fatal status, and is held
// only for bookkeeping, never across a call that can block on the driver queue. Each
// direction's Lane::mu guards its queue, every Work of that direction, the slice descriptor
// arrays and the feeder's event ring, and is held while slices are enqueued on the
// direction's stream (by the feeder, or by a caller of wait() / stream_wait() enqueueing the
// rest of its ticket). Order: a lane lock may be taken before mu_, never after it.
//
// Every entry point opens a detail::EntryScope: last-error hygiene, relaxed capture mode and
// the engine's primary context (the caller's current context, or none, is restored). The
// feeder threads set the same mode and context once, for their whole life.
#include "radixtier/cuda/cuda_transfer_engine.hpp"

#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "cuda_engine_internal.hpp"
#include "cuda_runtime.hpp"

namespace radixtier::cuda {
namespace {

using detail::classify;
using detail::cuda_error;
using detail::ErrorClass;
using detail::kEventFlags;
using detail::stream_rule;

}  // namespace

cudaEvent_t CudaTransferEngine::acquire_event() {
  if (!free_events_.empty()) {
    cudaEvent_t ev = free_events_.back();
    free_events_.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  if (rt_.event_create_with_flags(&ev, kEventFlags) != cudaSuccess) return nullptr;
  return ev;
}

Status CudaTransferEngine::mark_fatal(cudaError_t err, const char* where) {
  if (fatal_.is_ok()) {
    fatal_ = Status(ErrorCode::kDeviceLost,
                    "CUDA context lost: " + cuda_error(where, err) +
                        ". A sticky error: it may come from any kernel of this context, the "
                        "model's included; no copy can run again. Restart the process.");
    stats_.fatal = true;
    stats_.last_error = fatal_.message();
    log("CUDA engine: " + fatal_.message());
  }
  return fatal_;
}

bool CudaTransferEngine::issued(TicketId id) const {
  if (!id.valid()) return false;
  if (ids_spent_ > TicketId::kInvalid) return true;  // the counter went all the way round
  return std::uint64_t{static_cast<std::uint32_t>(id.value() - first_id_)} < ids_spent_;
}

TicketId CudaTransferEngine::take_id() {
  const std::uint32_t before = next_id_;
  const TicketId id(detail::take_ticket_id(next_id_, jobs_));
  ids_spent_ += static_cast<std::uint32_t>(next_id_ - before);
  return id;
}

void CudaTransferEngine::unhold(TicketId id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  --job.waiters;
  recycle(job);
  if (job.released && job.waiters == 0 && job.state != TransferState::kPending) jobs_.erase(it);
}

// A ticket that ends at once (an empty batch, or one whose `after` ticket failed): nothing
// enqueued, no event. Under mu_.
Ticket CudaTransferEngine::settled_ticket(TransferState state) {
  const TicketId id = take_id();
  Job job;
  job.state = state;
  if (state == TransferState::kFailed) {
    job.failed = true;
    job.failed_flag = std::make_shared<bool>(true);
    ++stats_.failed;
  }
  jobs_.emplace(id, std::move(job));
  ++stats_.batches;
  return Ticket(this, id);
}

Result<Ticket> CudaTransferEngine::submit(TransferBatch batch) {
  if (Status s = validate(batch); !s) return s;
  // The stream this batch is ordered after (compute -> copy): the caller's, else the default.
  const bool own_stream = batch.stream != nullptr;
  const cudaStream_t order =
      own_stream ? detail::resolve_stream(static_cast<cudaStream_t>(batch.stream)) : compute_;
  const char* order_name = own_stream ? "TransferBatch.stream" : "CudaEngineOptions.compute_stream";
  detail::EntryScope scope(rt_, ctx_);
  if (Status s = health(); !s) return s;
  // TransferBatch::after, first look (no CUDA call): every id must be one this engine issued;
  // one that failed fails this batch; the pending ones still being enqueued are enqueued
  // below, so that their events are recorded before this batch's stream waits on them.
  std::vector<std::shared_ptr<Work>> unfed;
  bool after_failed = false;
  {
    std::lock_guard lock(mu_);
    for (TicketId a : batch.after) {
      if (!issued(a))
        return invalid_argument("transfer batch rejected: TransferBatch.after names " +
                                std::to_string(a.value()) + ", a ticket this engine never issued");
      auto it = jobs_.find(a);
      if (it == jobs_.end() || it->second.state == TransferState::kDone) continue;  // released
      if (it->second.failed || it->second.state == TransferState::kFailed) after_failed = true;
      if (it->second.work != nullptr) unfed.push_back(it->second.work);
    }
    if (batch.empty() || after_failed) {  // nothing to copy: ends at once, no CUDA call
      if (after_failed)
        stats_.last_error = "submit: a ticket of TransferBatch.after failed; nothing enqueued";
      return settled_ticket(after_failed ? TransferState::kFailed : TransferState::kDone);
    }
  }
  const std::int64_t inject = inject_slice_.exchange(-1);
  if (scope.error() != cudaSuccess) {
    std::lock_guard lock(mu_);
    if (classify(scope.error()) == ErrorClass::kFatal)
      return mark_fatal(scope.error(), "cuCtxSetCurrent");
    return Status(ErrorCode::kTransferFailed, cuda_error("submit: cuCtxSetCurrent", scope.error()));
  }
  // A caller's stream is checked as compute_stream is by create(): a stream of this device.
  if (own_stream && order != cudaStreamLegacy && order != compute_) {
    unsigned flags = 0;
    int stream_device = -1;
    if (cudaError_t err = rt_.stream_get_flags(order, &flags); err != cudaSuccess)
      return invalid_argument("TransferBatch.stream: not a valid stream (" +
                              cuda_error("cudaStreamGetFlags", err) + "); nothing enqueued");
    if (cudaError_t err = rt_.stream_get_device(order, &stream_device); err == cudaSuccess) {
      if (stream_device != options_.device)
        return invalid_argument("TransferBatch.stream: a stream of device " +
                                std::to_string(stream_device) + ", but the engine is on device " +
                                std::to_string(options_.device) + "; nothing enqueued");
    } else if (classify(err) != ErrorClass::kUnsupported) {
      return invalid_argument("TransferBatch.stream: not a valid stream (" +
                              cuda_error("cudaStreamGetDevice", err) + "); nothing enqueued");
    }
  }
  // A capture of the batch's stream would pull the copy stream into the graph (and the copy
  // would then fail and invalidate the server's capture): refuse before enqueueing anything.
  // For the legacy stream, CUDA answers cudaErrorStreamCaptureImplicit while a blocking
  // stream is captured: any use of the legacy stream would join that capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t err = rt_.stream_is_capturing(order, &capture); err != cudaSuccess) {
    std::lock_guard lock(mu_);
    if (classify(err) == ErrorClass::kFatal) return mark_fatal(err, "cudaStreamIsCapturing");
    const std::string what = std::string("submit: cudaStreamIsCapturing(") + order_name + ")";
    if (classify(err) == ErrorClass::kCapture) {
      ++stats_.refused_captures;
      return Status(ErrorCode::kFailedPrecondition,
                    cuda_error(what.c_str(), err) +
                        ": the legacy default stream cannot be used while a blocking stream is "
                        "captured into a CUDA graph. Nothing was enqueued: submit before or "
                        "after the capture");
    }
    return Status(ErrorCode::kFailedPrecondition, cuda_error(what.c_str(), err));
  }
  if (capture != cudaStreamCaptureStatusNone) {
    std::lock_guard lock(mu_);
    ++stats_.refused_captures;
    return Status(ErrorCode::kFailedPrecondition,
                  std::string("submit: ") + order_name + " is " +
                      (capture == cudaStreamCaptureStatusActive ? "being captured"
                                                                : "in an invalidated capture") +
                      " into a CUDA graph; a copy submitted now would join the capture and "
                      "invalidate it. Nothing was enqueued: submit before or after the capture");
  }
  const Direction dir = batch.direction;
  if (dir == Direction::kDeviceToDevice) {
    if (Status s = open_d2d_lane(); !s) return s;
  }
  // The tickets this batch runs after: their events must be recorded before a stream can
  // wait on them (the feeders may not have got to them yet).
  for (const std::shared_ptr<Work>& rest : unfed) {
    feed_all(rest);
    std::lock_guard lock(mu_);
    ++stats_.urgent_feeds;
  }
  // A device-to-device copy reads or writes slots and pages the model's kernels use: it always
  // waits for the queued compute.
  const bool after_compute = dir == Direction::kDeviceToHost   ? options_.demote_after_compute
                             : dir == Direction::kHostToDevice ? options_.promote_after_compute
                                                               : true;
  std::uint64_t bytes = batch.pages.size() * page_bytes_ + batch.snapshots.size() * snapshot_bytes_;
  for (const auto& p : batch.pieces) bytes += piece_bytes(p, page_bytes_, snapshot_bytes_);
  for (const auto& p : batch.slot_pieces) bytes += piece_bytes(p, page_bytes_, snapshot_bytes_);
  // Plan without a lock (descriptors; snapshot chunks), then take an id and the events.
  std::shared_ptr<Work> w = plan(batch, TicketId());
  w->inject = inject;
  const std::size_t group_events =
      dir == Direction::kHostToDevice && groups_ > 1 && !w->pairs.empty() ? groups_ - 1 : 0;
  {
    std::lock_guard lock(mu_);
    Job job;
    job.dir = dir;
    // The `after` tickets again, now that their events are recorded: the pending ones are
    // held (their events not recycled until this batch's copy stream waits on them).
    for (TicketId a : batch.after) {
      auto it = jobs_.find(a);
      if (it == jobs_.end() || it->second.state == TransferState::kDone) continue;
      Job& other = it->second;
      if (other.failed || other.state == TransferState::kFailed) after_failed = true;
      if (other.state != TransferState::kPending || other.event == nullptr) continue;
      if (other.failed_flag == nullptr) other.failed_flag = std::make_shared<bool>(false);
      job.after.emplace_back(a, other.failed_flag);
      w->after_events.push_back(other.event);
      w->after_held.push_back(a);
      ++other.waiters;
    }
    bool ok = !after_failed && (job.event = acquire_event()) != nullptr;
    if (ok && after_compute) ok = (job.ready = acquire_event()) != nullptr;
    for (std::size_t g = 0; ok && g < group_events; ++g) {
      job.group_events.push_back(acquire_event());
      ok = job.group_events.back() != nullptr;
    }
    if (!ok) {
      for (cudaEvent_t ev : job.group_events)
        if (ev != nullptr) free_events_.push_back(ev);
      for (cudaEvent_t ev : {job.event, job.ready})
        if (ev != nullptr) free_events_.push_back(ev);
      for (TicketId held : w->after_held) unhold(held);
      if (after_failed) {
        stats_.last_error = "submit: a ticket of TransferBatch.after failed; nothing enqueued";
        return settled_ticket(TransferState::kFailed);
      }
      return Status(ErrorCode::kTransferFailed, "submit: cudaEventCreate failed; nothing enqueued");
    }
    w->id = take_id();
    w->done = job.event;
    w->ready = job.ready;
    w->group_events = job.group_events;
    job.work = w;
    jobs_.emplace(w->id, std::move(job));
    ++stats_.batches;
    (dir == Direction::kDeviceToHost   ? stats_.bytes_d2h
     : dir == Direction::kHostToDevice ? stats_.bytes_h2d
                                       : stats_.bytes_d2d) += bytes;
  }
  // compute -> copy: the event the copy stream waits on before the first slice, recorded on
  // the batch's stream.
  if (w->ready != nullptr) {
    if (cudaError_t err = rt_.event_record(w->ready, order); err != cudaSuccess) w->err = err;
  }
  const TicketId id = w->id;
  if (options_.slices_in_flight == 0 || w->err != cudaSuccess) {
    feed_all(w);  // on this thread, now (or: nothing to enqueue but the events)
    std::lock_guard lock(mu_);
    if (classify(w->err) == ErrorClass::kFatal) {  // nothing runs any more: no ticket
      auto it = jobs_.find(id);
      if (it != jobs_.end()) {
        it->second.state = TransferState::kFailed;
        if (it->second.failed_flag != nullptr) *it->second.failed_flag = true;
        ++stats_.failed;
        recycle(it->second);
        jobs_.erase(it);
      }
      return fatal_;
    }
  } else {
    Lane& lane = lanes_[index(dir)];
    std::lock_guard lock(lane.mu);
    lane.queue.push_back(w);
    lane.cv.notify_one();
  }
  return Ticket(this, id);
}

cudaStream_t CudaTransferEngine::stream(Direction dir) const {
  if (dir != Direction::kDeviceToDevice) return streams_[index(dir)];
  std::lock_guard lock(d2d_mu_);  // opened by a submit() on another thread, maybe
  return streams_[index(dir)];
}

void CudaTransferEngine::recycle(Job& job) {
  if (job.state == TransferState::kPending || job.waiters > 0) return;
  for (cudaEvent_t* ev : {&job.event, &job.ready}) {
    if (*ev != nullptr) free_events_.push_back(*ev);
    *ev = nullptr;
  }
  for (cudaEvent_t ev : job.group_events) free_events_.push_back(ev);
  job.group_events.clear();
}

// Turns an event result into the job's final state; returns it (kPending while not ready).
TransferState CudaTransferEngine::settle(Job& job, cudaError_t query, const char* where) {
  if (job.state != TransferState::kPending) return job.state;
  switch (classify(query)) {
    case ErrorClass::kNotReady:
    case ErrorClass::kCapture:  // a capture forbade the query: the copy is still in flight
      return TransferState::kPending;
    case ErrorClass::kOk:
      // Done on the device, and so is every `after` ticket (this copy waited for them): one
      // that failed fails this one. Settle those nobody polled yet.
      for (auto& [other_id, flag] : job.after) {
        if (!*flag) {
          auto it = jobs_.find(other_id);
          if (it != jobs_.end() && it->second.state == TransferState::kPending) {
            Job& other = it->second;
            if (other.work == nullptr && other.event != nullptr)
              (void)settle(other, rt_.event_query(other.event), "cudaEventQuery");
            if (other.failed) *flag = true;
          }
        }
        if (*flag && !job.failed) {
          job.failed = true;
          stats_.last_error = "a ticket of TransferBatch.after failed (ticket " +
                              std::to_string(other_id.value()) + ")";
        }
      }
      break;
    case ErrorClass::kFatal:
      job.failed = true;
      (void)mark_fatal(query, where);
      break;
    case ErrorClass::kUnsupported:
    case ErrorClass::kFailed:
      job.failed = true;
      stats_.last_error = cuda_error(where, query);
      break;
  }
  job.state = job.failed ? TransferState::kFailed : TransferState::kDone;
  if (job.failed) ++stats_.failed;
  if (job.failed && job.failed_flag != nullptr) *job.failed_flag = true;
  recycle(job);
  return job.state;
}

TransferState CudaTransferEngine::poll(TicketId id) {
  detail::EntryScope scope(rt_, ctx_);
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return TransferState::kFailed;
  Job& job = it->second;
  if (job.state != TransferState::kPending) return job.state;
  // A lost context runs no copy any more: nothing of the batch can still be touched.
  if (!fatal_.is_ok()) return settle(job, cudaErrorContextIsDestroyed, "poll");
  if (job.work != nullptr) return TransferState::kPending;  // slices left to enqueue
  if (job.event == nullptr) return settle(job, cudaSuccess, "poll");
  return settle(job, rt_.event_query(job.event), "cudaEventQuery");
}

TransferState CudaTransferEngine::wait(TicketId id) {
  detail::EntryScope scope(rt_, ctx_);
  std::shared_ptr<Work> rest;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return TransferState::kFailed;
    if (it->second.state != TransferState::kPending) return it->second.state;
    rest = it->second.work;
  }
  if (rest != nullptr) {  // enqueue what the feeder has not yet, here and now
    feed_all(rest);
    std::lock_guard lock(mu_);
    ++stats_.urgent_feeds;
  }
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return TransferState::kFailed;
    Job& job = it->second;
    if (job.state != TransferState::kPending) return job.state;
    if (!fatal_.is_ok()) return settle(job, cudaErrorContextIsDestroyed, "wait");
    if (job.event == nullptr) return settle(job, cudaSuccess, "wait");
    ev = job.event;
    ++job.waiters;  // the event stays this job's until the last waiter is out
  }
  cudaError_t err = rt_.event_synchronize(ev);
  while (classify(err) == ErrorClass::kCapture) {  // relaxed mode should never see one
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    err = rt_.event_synchronize(ev);
  }
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  Job& job = it->second;  // waiters > 0: release() did not erase it
  --job.waiters;
  const TransferState state = settle(job, err, "cudaEventSynchronize");
  recycle(job);
  if (job.released && job.waiters == 0 && state != TransferState::kPending) jobs_.erase(it);
  return state;
}

void CudaTransferEngine::release(TicketId id) {
  if (poll(id) == TransferState::kPending) wait(id);  // never forget an in-flight copy
  std::lock_guard lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end() || it->second.state == TransferState::kPending) return;
  if (it->second.waiters > 0) {
    it->second.released = true;  // the last waiter erases it
  } else {
    jobs_.erase(it);
  }
}

Status CudaTransferEngine::wait_on(TicketId id, std::int64_t layer, cudaStream_t stream) {
  const char* what = layer < 0 ? "stream_wait" : "stream_wait_layer";
  if (Status s = stream_rule((std::string(what) + ": stream").c_str(), stream); !s) return s;
  if (layer >= 0 && layers_ > 0 && layer >= static_cast<std::int64_t>(layers_))
    return invalid_argument(std::string(what) + ": layer " + std::to_string(layer) +
                            ", but the KV layout has " + std::to_string(layers_) + " layers");
  const cudaStream_t target = detail::resolve_stream(stream);
  detail::EntryScope scope(rt_, ctx_);
  {
    std::lock_guard lock(mu_);
    if (!fatal_.is_ok()) return fatal_;
  }
  // A stream being captured into a CUDA graph must not wait on the copy's event: it was
  // recorded outside the capture, so the wait would make the graph depend on work outside it
  // (CUDA invalidates the capture: cudaErrorStreamCaptureIsolation). Refused before anything
  // is enqueued; the capture is untouched.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t cap_err = rt_.stream_is_capturing(target, &capture);
  if (cap_err != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    std::lock_guard lock(mu_);
    if (classify(cap_err) == ErrorClass::kFatal)
      return mark_fatal(cap_err, "cudaStreamIsCapturing");
    if (cap_err != cudaSuccess && classify(cap_err) != ErrorClass::kCapture)
      return invalid_argument(std::string(what) + ": stream: not a valid stream (" +
                              cuda_error("cudaStreamIsCapturing", cap_err) + ")");
    ++stats_.refused_stream_waits;
    return Status(
        ErrorCode::kFailedPrecondition,
        std::string(what) + ": the stream is " +
            (cap_err != cudaSuccess ? "the legacy stream while a blocking stream is captured"
             : capture == cudaStreamCaptureStatusActive ? "being captured"
                                                        : "in an invalidated capture") +
            " into a CUDA graph. A wait on the copy's event, recorded outside the capture, "
            "would invalidate the graph; nothing was enqueued and the capture is untouched. "
            "Wait on an eager (uncaptured) forward pass only: a captured decode step reads no "
            "promoted pages and needs no promotion");
  }
  std::shared_ptr<Work> rest;
  {
    std::lock_guard lock(mu_);
    if (!fatal_.is_ok()) return fatal_;
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return not_found(std::string(what) + ": unknown ticket");
    rest = it->second.work;
  }
  if (rest != nullptr) {  // the events must be recorded before a stream can wait on them
    feed_all(rest);
    std::lock_guard lock(mu_);
    ++stats_.urgent_feeds;
  }
  std::lock_guard lock(mu_);
  if (!fatal_.is_ok()) return fatal_;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return not_found(std::string(what) + ": unknown ticket");
  const Job& job = it->second;
  if (job.state == TransferState::kFailed || job.failed)
    return Status(ErrorCode::kTransferFailed, std::string(what) + ": the ticket failed");
  if (job.state == TransferState::kDone || job.event == nullptr) return Status::ok();
  cudaEvent_t ev = job.event;
  if (layer >= 0 && !job.group_events.empty()) {
    const std::size_t g = group_of_layer(static_cast<std::uint32_t>(layer));
    if (g < job.group_events.size()) ev = job.group_events[g];
  }
  if (cudaError_t err = rt_.stream_wait_event(target, ev, 0); err != cudaSuccess) {
    if (classify(err) == ErrorClass::kFatal) return mark_fatal(err, "cudaStreamWaitEvent");
    return Status(ErrorCode::kTransferFailed, cuda_error("cudaStreamWaitEvent", err));
  }
  return Status::ok();
}

Status CudaTransferEngine::stream_wait(TicketId id, StreamHandle stream,
                                       std::optional<std::uint32_t> layer) {
  // The interface's nullptr is the engine's default stream (TransferBatch::stream's rule).
  const cudaStream_t s = stream == nullptr ? compute_ : static_cast<cudaStream_t>(stream);
  return wait_on(id, layer.has_value() ? static_cast<std::int64_t>(*layer) : -1, s);
}

Status CudaTransferEngine::stream_wait(TicketId id, cudaStream_t stream) {
  return wait_on(id, -1, stream);
}

Status CudaTransferEngine::stream_wait_layer(TicketId id, std::uint32_t layer,
                                             cudaStream_t stream) {
  return wait_on(id, layer, stream);
}

Status CudaTransferEngine::health() const {
  std::lock_guard lock(mu_);
  return fatal_;
}

void CudaTransferEngine::inject_error_on_next_submit(std::size_t at_slice) {
  inject_slice_.store(static_cast<std::int64_t>(at_slice));
}

CudaEngineStats CudaTransferEngine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace radixtier::cuda
