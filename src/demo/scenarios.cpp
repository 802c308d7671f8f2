// The scenarios of workloads.md scaled down to the tiny model (page 16 tokens instead of 64).
//
//   churn       token counts / 16: a 1,500-token conversation turn, ten distinct 94-token
//               auxiliary calls, then turn 2 = turn 1 + its output + 19 tokens. 4 GPU snapshot
//               slots, GPU KV 2,048 tokens, max running 1.
//   flush       churn's turn 1, then two distinct 4,096-token prompts through a 6,144-token GPU
//               pool (the seed's ~130k prompts in a 200k pool: every conversation page leaves
//               the GPU), then turn 2.
//   compaction  a 3,850-token prompt (985,577 / 256), an unrelated 3,000-token session that
//               pushes most of it to host, then a replay of its first 2,971 tokens (760,534 /
//               256) plus a 16-token instruction. The GPU pool must hold one running prompt
//               (a running request pins its path), so it is 4,096 tokens, not 1/256 of 262k.
//   agent       four turns; each sends the conversation 2-3 times with different tails (3 in
//               flight at once); the next turn diverges 44-148 tokens before the previous end;
//               side requests are shorter exact prefixes of earlier, longer prompts.
//   restart     churn's turn 1, then a graceful restart (persist(), the cache, its disk store
//               and the engine destroyed, the store reopened), then turn 2: its prefix comes
//               from disk.
//   shared      (not in the default set: it needs redis-server) two processes on one Redis
//               Cluster: the first serves churn's turn 1 and a document and publishes them to
//               the shared tier; the second starts empty and serves turn 2 and a question on
//               the document from it (shared_run.hpp).
#include <algorithm>

#include "demo/scenarios.hpp"

#include "workload/shapes.hpp"

namespace radixtier::demo {

namespace {

using workload::cat;
using workload::mix;

/// n deterministic tokens of stream `seed`.
std::vector<Token> synth(std::uint64_t seed, std::size_t n, std::uint32_t vocab) {
  std::vector<Token> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<Token>(mix(seed * 1000003 + i) % vocab);
  return out;
}

struct Builder {
  Workload w;
  void add(const std::string& label, std::vector<Token> prompt, std::size_t out, double at = 0) {
    sched::Request r;
    r.id = w.requests.size() + 1;
    r.prompt = std::move(prompt);
    r.max_new_tokens = out;
    r.arrival_s = at;
    w.requests.push_back(std::move(r));
    w.labels.push_back(label);
  }
};

Builder base(const std::string& name, const std::string& description,
             const sched::SnapshotPolicy& policy) {
  Builder b;
  b.w.name = name;
  b.w.description = description;
  b.w.model = model::TinyModelConfig{};
  b.w.cache.page_size = b.w.model.page_size;
  b.w.cache.gpu_pages = 2048 / 16;
  b.w.cache.host_pages = 16384 / 16;  // "16 GiB of host KV": room for everything here
  b.w.cache.gpu_snapshot_slots = 4;
  b.w.cache.host_snapshot_slots = 32;
  b.w.cache.slice_pages = 32;
  b.w.sched.chunk_tokens = 128;  // 2,048 / 16
  b.w.sched.max_running = 1;
  b.w.sched.policy = policy;
  return b;
}

/// Turn 2 of a conversation: turn 1's prompt, the output turn 1 produces and a new message.
/// The output is the model's own greedy continuation, computed once here without a cache.
std::vector<Token> continuation(const model::TinyModelConfig& mc, const std::vector<Token>& prompt,
                                std::size_t out, std::vector<Token> message) {
  const model::TinyHybridModel m(mc);
  CacheConfig c;
  c.page_size = mc.page_size;
  c.page_bytes = m.page_bytes();
  c.snapshot_bytes = m.state_bytes();
  c.gpu_pages = static_cast<std::uint32_t>(m.pages_for(prompt.size() + out));
  c.gpu_snapshot_slots = 1;
  HostArenas mem(c);
  std::vector<GpuPageId> table;
  for (std::uint32_t i = 0; i < c.gpu_pages; ++i) table.emplace_back(i);
  std::vector<std::byte> state(m.state_bytes());
  m.reset_state(state);
  std::vector<float> logits(m.vocab());
  std::vector<Token> seq = prompt;
  (void)m.forward(prompt, 0, table, mem, state, logits);
  for (std::size_t i = 0; i < out; ++i) {
    const Token t = m.greedy(logits);
    seq.push_back(t);
    if (i + 1 < out)
      (void)m.forward(std::span<const Token>(&t, 1), seq.size() - 1, table, mem, state, logits);
  }
  return cat(std::move(seq), message);
}

Workload churn(const sched::SnapshotPolicy& policy, bool flush) {
  Builder b = flush ? base("flush",
                           "turn 1 (1,500 tokens), two distinct 4,096-token prompts through a "
                           "6,144-token GPU pool, then turn 2",
                           policy)
                    : base("churn",
                           "turn 1 (1,500 tokens), 10 distinct 94-token auxiliary calls, then "
                           "turn 2 = turn 1 + output + 19 tokens",
                           policy);
  const auto vocab = b.w.model.vocab;
  const auto turn1 = synth(1, 1500, vocab);
  b.add("turn 1", turn1, 12);
  if (flush) {
    b.w.cache.gpu_pages = 6144 / 16;
    b.add("flush A", synth(100, 4096, vocab), 2);
    b.add("flush B", synth(101, 4096, vocab), 2);
  } else {
    for (int i = 0; i < 10; ++i) b.add("aux " + std::to_string(i + 1), synth(10 + i, 94, vocab), 2);
  }
  b.add("turn 2", continuation(b.w.model, turn1, 12, synth(2, 19, vocab)), 12);
  return b.w;
}

Workload compaction(const sched::SnapshotPolicy& policy) {
  Builder b = base("compaction",
                   "a 3,850-token prompt, an unrelated 3,000-token session, then a replay of "
                   "its first 2,971 tokens + a 16-token instruction",
                   policy);
  b.w.cache.gpu_pages = 4096 / 16;
  b.w.cache.host_pages = 4096 / 16;
  const auto vocab = b.w.model.vocab;
  const auto prompt = synth(3, 3850, vocab);
  b.add("long prompt", prompt, 4);
  b.add("other session", synth(4, 3000, vocab), 4);
  b.add("replay", cat({prompt.begin(), prompt.begin() + 2971}, synth(5, 16, vocab)), 4);
  return b.w;
}

Workload agent(const sched::SnapshotPolicy& policy) {
  Builder b = base("agent",
                   "4 turns x 2-3 sends of one prefix with different tails (3 in flight), "
                   "turns diverge 44-148 tokens before the previous end, side requests replay "
                   "shorter prefixes of earlier prompts",
                   policy);
  b.w.cache.gpu_pages = 4096 / 16;
  b.w.cache.host_pages = 8192 / 16;
  b.w.cache.gpu_snapshot_slots = 8;
  b.w.cache.host_snapshot_slots = 16;
  b.w.sched.max_running = 3;
  b.w.sched.chunk_tokens = 64;
  const auto vocab = b.w.model.vocab;
  workload::AgentShape shape;
  shape.system_tokens = 400;  // system prompt
  shape.first_message_tokens = 200;
  shape.turns = 4;
  shape.turn_interval_s = 10.0;
  shape.tail_tokens = 20;
  shape.tail_step_tokens = 13;
  shape.send_output = 6;
  shape.side_output = 4;
  shape.grow_min = 150;
  shape.grow_max = 249;
  const auto stream = [vocab](std::uint64_t seed, std::size_t n) { return synth(seed, n, vocab); };
  for (auto& r : workload::agent_requests(shape, stream))
    b.add(r.label, std::move(r.prompt), r.output, r.arrival_s);
  return b.w;
}

Workload restart(const sched::SnapshotPolicy& policy) {
  Builder b = base("restart",
                   "turn 1 (1,500 tokens), persist() and a process restart on the same disk "
                   "store, then turn 2 = turn 1 + output + 19 tokens",
                   policy);
  const auto vocab = b.w.model.vocab;
  const auto turn1 = synth(1, 1500, vocab);
  b.add("turn 1", turn1, 12);
  b.add("turn 2 (restart)", continuation(b.w.model, turn1, 12, synth(2, 19, vocab)), 12);
  b.w.restart_before = 1;
  return b.w;
}

Workload shared(const sched::SnapshotPolicy& policy) {
  Builder b = base("shared",
                   "two processes on one Redis Cluster: the first serves turn 1 (1,500 tokens) "
                   "and a 1,000-token document and publishes them; the second, with an empty "
                   "cache, serves turn 2 and a question on the document from the shared tier",
                   policy);
  b.w.cache.write_policy = WritePolicy::kWriteThrough;  // host copies to publish from
  const auto vocab = b.w.model.vocab;
  const auto turn1 = synth(1, 1500, vocab);
  const auto doc = synth(6, 1000, vocab);
  b.add("turn 1", turn1, 12);
  b.add("document", cat(doc, synth(7, 20, vocab)), 4);
  b.add("turn 2 (proc 2)", continuation(b.w.model, turn1, 12, synth(2, 19, vocab)), 12);
  b.add("doc question (2)", cat(doc, synth(8, 30, vocab)), 4);
  b.add("unrelated (2)", synth(9, 300, vocab), 4);
  b.w.shared_before = 2;
  return b.w;
}

}  // namespace

std::vector<std::string> optional_scenario_names() {
  return {"shared"};
}

std::vector<std::string> scenario_names() {
  return {"churn", "flush", "compaction", "agent", "restart"};
}

Result<Workload> make_scenario(const std::string& name, const sched::SnapshotPolicy& policy) {
  if (name == "churn") return churn(policy, false);
  if (name == "flush") return churn(policy, true);
  if (name == "compaction") return compaction(policy);
  if (name == "agent") return agent(policy);
  if (name == "restart") return restart(policy);
  if (name == "shared") return shared(policy);
  return not_found("unknown scenario '" + name +
                   "' (known: churn, flush, compaction, agent, restart, shared)");
}

}  // namespace radixtier::demo
