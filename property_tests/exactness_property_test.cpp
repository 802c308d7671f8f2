// Exactness as a property: for random workloads (shared prefixes, divergent tails, side
// requests that are prefixes of earlier prompts, truncated replays, continuations of earlier
// answers, GPU and host pools small enough to force demotion, promotion, tombstones and host
// drops, injected transfer failures, several requests in flight, every snapshot policy), the
// output tokens and the logits of every request served through the scheduler and the
// PrefixCache are bit-identical to the same request computed from scratch, and the cache's
// invariants hold after every scheduler step.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <algorithm>

#include "demo/scenarios.hpp"

namespace radixtier {
namespace {

model::TinyModelConfig tiny() {
  model::TinyModelConfig m;
  m.vocab = 31;
  m.d_model = 8;
  m.layers = "GA";
  m.heads = 2;
  m.head_dim = 4;
  m.kv_heads = 1;
  m.mlp_dim = 16;
  m.page_size = 4;
  return m;
}

std::vector<Token> random_tokens(std::size_t n) {
  return *rc::gen::container<std::vector<Token>>(n, rc::gen::inRange<Token>(0, 31));
}

RC_GTEST_PROP(Exactness, ReuseIsBitIdenticalToRecompute, ()) {
  static const model::TinyHybridModel model(tiny());
  demo::Workload w;
  w.name = "property";
  w.model = tiny();
  const std::size_t ps = 4;
  const std::size_t n_requests = *rc::gen::inRange<std::size_t>(3, 12);
  std::size_t largest_pages = 0;
  for (std::size_t i = 0; i < n_requests; ++i) {
    std::vector<Token> prompt;
    const int kind = w.requests.empty() ? 0 : *rc::gen::element(0, 1, 1, 2, 2, 3, 3, 4);
    const auto& earlier = w.requests.empty()
                              ? w.requests.emplace_back()  // placeholder, replaced below
                              : w.requests[*rc::gen::inRange<std::size_t>(0, w.requests.size())];
    if (w.requests.size() == 1 && w.requests[0].prompt.empty()) w.requests.clear();
    switch (kind) {
      case 0:  // a new prompt
        prompt = random_tokens(*rc::gen::inRange<std::size_t>(1, 48));
        break;
      case 1:    // shared prefix, divergent tail
      case 2: {  // truncated replay / side request: an exact prefix of an earlier prompt
        const std::size_t keep = *rc::gen::inRange<std::size_t>(1, earlier.prompt.size() + 1);
        prompt.assign(earlier.prompt.begin(),
                      earlier.prompt.begin() + static_cast<std::ptrdiff_t>(keep));
        if (kind == 1) {
          auto tail = random_tokens(*rc::gen::inRange<std::size_t>(1, 16));
          prompt.insert(prompt.end(), tail.begin(), tail.end());
        }
        break;
      }
      case 3: {  // the next turn: an earlier prompt + its answer + a new message
        prompt = earlier.prompt;
        const auto ref = demo::reference_run(model, earlier);
        prompt.insert(prompt.end(), ref.output.begin(), ref.output.end());
        auto msg = random_tokens(*rc::gen::inRange<std::size_t>(1, 10));
        prompt.insert(prompt.end(), msg.begin(), msg.end());
        break;
      }
      default:  // the same prompt again
        prompt = earlier.prompt;
        break;
    }
    const std::size_t out = *rc::gen::inRange<std::size_t>(0, 6);
    // Mostly one after another (the demo clock: 0.1 ms per token), sometimes in a burst.
    const double at =
        *rc::gen::element(0.0, 0.01 * static_cast<double>(i), 0.01 * static_cast<double>(i));
    largest_pages = std::max(largest_pages, (prompt.size() + out + ps - 1) / ps);
    w.requests.push_back(sched::Request{i + 1, std::move(prompt), out, at});
  }
  // Pools: the GPU holds the largest request and a cached snapshot (the pool holds both;
  // validate() refuses one that cannot hold a page and a snapshot) plus a little; host may
  // be absent or tiny.
  w.cache.page_size = ps;
  const std::size_t snapshot_pages =
      (model.state_bytes() + model.page_bytes() - 1) / model.page_bytes();
  w.cache.gpu_pages =
      static_cast<std::uint32_t>(largest_pages + snapshot_pages + *rc::gen::inRange(0, 10));
  w.cache.host_pages = *rc::gen::element(0u, 4u, 64u, 64u, 64u);
  w.cache.gpu_snapshot_slots = *rc::gen::inRange(1u, 3u);
  w.cache.host_snapshot_slots = *rc::gen::element(0u, 1u, 16u, 16u, 16u);
  w.cache.slice_pages = *rc::gen::inRange(1u, 5u);
  if (w.cache.host_pages > 0) {
    w.cache.write_policy = *rc::gen::element(WritePolicy::kWriteBack, WritePolicy::kWriteThrough);
  }
  w.engine_mode =
      *rc::gen::element(HostTransferEngine::Mode::kManual, HostTransferEngine::Mode::kThreaded);
  if (*rc::gen::inRange(0, 3) == 0) {
    const std::uint64_t every = *rc::gen::inRange<std::uint64_t>(1, 6);
    for (std::uint64_t n = *rc::gen::inRange<std::uint64_t>(0, 4); n < 60; n += every) {
      w.failing_submissions.push_back(n);
    }
  }
  w.sched.chunk_tokens = ps * *rc::gen::inRange<std::size_t>(1, 5);
  w.sched.max_running = *rc::gen::inRange<std::size_t>(1, 4);
  w.sched.max_admissions = 1000;
  w.sched.check_invariants = true;
  w.sched.policy =
      *rc::gen::element(sched::SnapshotPolicy::end_only(), sched::SnapshotPolicy::every_chunk(),
                        sched::SnapshotPolicy::interval(8), sched::SnapshotPolicy::interval(12),
                        sched::SnapshotPolicy::budgeted(), sched::SnapshotPolicy::budgeted(1000));

  const demo::RunOutcome run = demo::run_workload(w, model, true);
  if (!run.status) RC_FAIL(run.status.to_string());
  RC_TAG(run.cache.kv_pages_promoted > 0 ? "promoted" : "no promotion");
  RC_TAG(run.cache.transfers_failed > 0 ? "transfer failed" : "no failure");
  RC_TAG(run.cache.kv_pages_dropped_host + run.cache.kv_pages_dropped_gpu > 0 ? "dropped"
                                                                              : "no drop");
  std::size_t reused = 0;
  for (const auto& req : w.requests) {
    auto it = run.results.find(req.id);
    RC_ASSERT(it != run.results.end());
    const auto& got = it->second;
    if (!got.status) RC_FAIL("request " + std::to_string(req.id) + ": " + got.status.to_string());
    RC_ASSERT(got.cached_tokens % ps == 0);
    RC_ASSERT(got.cached_tokens < req.prompt.size());
    RC_ASSERT(demo::same_answer(got, demo::reference_run(model, req)));
    reused += got.cached_tokens;
  }
  RC_TAG(reused > 0 ? "reuse" : "no reuse");
}

// The promotion path on purpose: a conversation, fillers that push it to host, then requests
// that resume from it (promoted KV and snapshots, some of the copies failing).
RC_GTEST_PROP(Exactness, PromotedPrefixesAreBitIdentical, ()) {
  static const model::TinyHybridModel model(tiny());
  demo::Workload w;
  w.model = tiny();
  const auto conv = random_tokens(*rc::gen::inRange<std::size_t>(16, 48));
  w.requests.push_back(sched::Request{1, conv, *rc::gen::inRange<std::size_t>(0, 6), 0});
  const std::size_t fillers = *rc::gen::inRange<std::size_t>(1, 4);
  for (std::size_t i = 0; i < fillers; ++i) {
    w.requests.push_back(sched::Request{w.requests.size() + 1, random_tokens(40), 1, 0});
  }
  const std::size_t cut = *rc::gen::inRange<std::size_t>(1, conv.size() + 1);
  auto replay = std::vector<Token>(conv.begin(), conv.begin() + static_cast<std::ptrdiff_t>(cut));
  const auto tail = random_tokens(*rc::gen::inRange<std::size_t>(0, 8));
  replay.insert(replay.end(), tail.begin(), tail.end());
  if (replay.empty()) replay.push_back(0);
  w.requests.push_back(sched::Request{w.requests.size() + 1, replay, 2, 0});
  w.requests.push_back(sched::Request{w.requests.size() + 1, conv, 2, 0});
  w.cache.page_size = 4;
  w.cache.gpu_pages = 16 + *rc::gen::inRange(0u, 6u);
  w.cache.host_pages = *rc::gen::element(8u, 64u);
  w.cache.gpu_snapshot_slots = *rc::gen::inRange(1u, 3u);
  w.cache.host_snapshot_slots = *rc::gen::element(2u, 16u);
  w.cache.slice_pages = *rc::gen::inRange(1u, 4u);
  w.engine_mode =
      *rc::gen::element(HostTransferEngine::Mode::kManual, HostTransferEngine::Mode::kThreaded);
  if (*rc::gen::inRange(0, 2) == 0) {
    for (std::uint64_t n = *rc::gen::inRange<std::uint64_t>(0, 8); n < 60; n += 7) {
      w.failing_submissions.push_back(n);
    }
  }
  w.sched.chunk_tokens = 4 * *rc::gen::inRange<std::size_t>(1, 4);
  w.sched.max_running = 1;
  w.sched.max_admissions = 1000;
  w.sched.check_invariants = true;
  w.sched.policy =
      *rc::gen::element(sched::SnapshotPolicy::every_chunk(), sched::SnapshotPolicy::interval(8),
                        sched::SnapshotPolicy::budgeted(1u << 20));
  const demo::RunOutcome run = demo::run_workload(w, model, true);
  if (!run.status) RC_FAIL(run.status.to_string());
  RC_TAG(run.cache.kv_pages_promoted > 0 ? "promoted" : "no promotion");
  RC_TAG(run.cache.transfers_failed > 0 ? "transfer failed" : "no failure");
  for (const auto& req : w.requests) {
    auto it = run.results.find(req.id);
    RC_ASSERT(it != run.results.end());
    if (!it->second.status) RC_FAIL(it->second.status.to_string());
    RC_ASSERT(demo::same_answer(it->second, demo::reference_run(model, req)));
  }
}

}  // namespace
}  // namespace radixtier
