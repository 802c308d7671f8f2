// The simulator's scenarios at full scale (see scenarios.hpp and docs/simulator.md).
#include "sim/scenarios.hpp"

#include <algorithm>
#include <utility>

#include "sim/cost_executor.hpp"
#include "workload/shapes.hpp"

namespace radixtier::sim {

namespace {

using workload::cat;
using workload::mix;

struct Builder {
  Scenario s;
  void add(const std::string& label, std::vector<Token> prompt, std::size_t out, double at = 0) {
    ScenarioRequest r;
    r.request.id = s.requests.size() + 1;
    r.request.prompt = std::move(prompt);
    r.request.max_new_tokens = out;
    r.request.arrival_s = at;
    r.label = label;
    s.requests.push_back(std::move(r));
  }
};

Builder base(std::string name, std::string description) {
  Builder b;
  b.s.name = std::move(name);
  b.s.description = std::move(description);
  return b;
}

// churn: turn 1 (24,000 + 200 out), 10 distinct 1,500-token aux calls (30 out), turn 2 =
// turn 1 + its output + 300. GPU KV 32,768 tokens, 4 GPU snapshot slots, max running 1.
// flush: two distinct ~130,000-token prompts (30 out) through a 200,000-token GPU pool instead.
Scenario churn(bool flush) {
  Builder b = flush ? base("flush",
                           "turn 1 (24,000 tokens + 200 out), two distinct ~130,000-token prompts "
                           "through a 200,000-token GPU KV pool, then turn 2 = turn 1 + output "
                           "+ 300 tokens")
                    : base("churn",
                           "turn 1 (24,000 tokens + 200 out), 10 distinct 1,500-token auxiliary "
                           "calls (30 out), then turn 2 = turn 1 + output + 300 tokens");
  b.s.budget.gpu_kv_tokens = flush ? 200'000 : 32'768;
  b.s.budget.gpu_snapshot_slots = 4;
  const auto turn1 = synth_tokens(1, 24'000);
  b.add("turn 1", turn1, 200);
  if (flush) {
    b.add("flush A", synth_tokens(100, 130'000), 30);
    b.add("flush B", synth_tokens(101, 131'000), 30);
  } else {
    for (int i = 0; i < 10; ++i) {
      b.add("aux " + std::to_string(i + 1), synth_tokens(10 + i, 1'500), 30);
    }
  }
  b.add("turn 2", cat(CostExecutor::continuation(turn1, 200), synth_tokens(2, 300)), 200);
  return std::move(b.s);
}

// restart: churn's turn 1 and its aux calls, a process restart, then turn 2 (issue 13): what
// survives is what the cache persisted to its store.
Scenario restart() {
  Scenario s = churn(false);
  s.name = "restart";
  s.description =
      "turn 1 (24,000 tokens + 200 out), 10 distinct 1,500-token auxiliary calls (30 out), a "
      "process restart (persist, then a new cache on the same store), then turn 2 = turn 1 + "
      "output + 300 tokens";
  s.restart_before = s.requests.size() - 1;
  return s;
}

// Both compaction scenarios: GPU and host pools of 1,048,576 tokens (see compaction below),
// one running request's GPU snapshot slots, host snapshots as the options say.
void compaction_budget(Budget& budget, const ScenarioOptions& o) {
  budget.gpu_kv_tokens = 1'048'576;
  budget.gpu_snapshot_slots = gpu_snapshot_slots_for(1);
  budget.host_kv_tokens = 1'048'576;
  budget.host_snapshot_bytes = o.compaction_host_snapshot_bytes;
}

// compaction: a cached 985,577-token prompt, then a replay of its first 760,534 tokens + a
// 600-token instruction. A running request pins its whole path on the GPU, so the GPU pool
// must hold the prompt: 1,048,576 tokens (not workloads.md's 262,144). An unrelated
// 768,000-token generation (a 32-token prompt: no prompt snapshot, one at its finish) then
// needs GPU room, so ~705k tokens of the cached prompt leave the GPU for the 1,048,576-token
// host pool and ~280k stay (about workloads.md's 262,144). Host snapshots: 32 slots (or a
// byte budget), 4 x 1 + 1 + 1 GPU slots.
Scenario compaction(const ScenarioOptions& o) {
  Builder b = base("compaction",
                   "a cached 985,577-token prompt, an unrelated 768,000-token generation that "
                   "pushes most of its KV to host, then a replay of its first 760,534 tokens + "
                   "a 600-token instruction");
  compaction_budget(b.s.budget, o);
  const auto prompt = synth_tokens(3, 985'577);
  b.add("long prompt", prompt, 100);
  b.add("generation", synth_tokens(4, 32), 768'000);
  b.add("replay", cat({prompt.begin(), prompt.begin() + 760'534}, synth_tokens(5, 600)), 100);
  return std::move(b.s);
}

// compaction-turns: the 985,577 tokens are built turn by turn (first message 20,000 tokens,
// then each turn adds 500 output tokens and a 15,000-25,000-token message); one turn's prompt
// is exactly 760,534 tokens; the replay cuts there (+ 600 tokens). Budgets as compaction.
Scenario compaction_turns(const ScenarioOptions& o) {
  Builder b = base("compaction-turns",
                   "a conversation built turn by turn to 985,577 tokens (500 output tokens and "
                   "15-25k new tokens per turn), then a replay that cuts at the boundary of "
                   "the turn whose prompt was 760,534 tokens, + 600 tokens");
  compaction_budget(b.s.budget, o);
  constexpr std::size_t kOut = 500, kCut = 760'534, kEnd = 985'577;
  std::uint64_t seed = 200;
  std::vector<Token> conv = synth_tokens(seed++, 20'000);
  for (int turn = 1;; ++turn) {
    const std::size_t len = conv.size();
    b.add("turn " + std::to_string(turn), conv, kOut);
    if (len == kEnd) break;
    conv = CostExecutor::continuation(std::move(conv), kOut);
    std::size_t msg = 15'000 + mix(seed) % 10'001;
    // Land exactly on the cut and on the end: stretch the message that would cross them.
    for (std::size_t target : {kCut, kEnd}) {
      if (conv.size() < target && conv.size() + msg + 15'000 + kOut > target) {
        msg = target - conv.size();
      }
    }
    conv = cat(std::move(conv), synth_tokens(seed++, msg));
  }
  b.add("replay", cat({conv.begin(), conv.begin() + kCut}, synth_tokens(seed, 600)), 100);
  return std::move(b.s);
}

// agent: 8 turns; each sends the conversation 2-3 times with different tails (3 in flight);
// the next turn diverges 44-148 tokens before the previous end and grows 2,400-4,000 tokens;
// from turn 2 a side request replays a shorter exact prefix of an earlier, longer prompt.
Scenario agent(const ScenarioOptions& o) {
  Builder b = base("agent",
                   "8 turns x 2-3 sends of one prefix with different tails (3 in flight), "
                   "turns diverge 44-148 tokens before the previous end, side requests replay "
                   "shorter prefixes of earlier prompts");
  b.s.max_running = 3;
  b.s.include_queue = true;
  b.s.budget.gpu_kv_tokens = 65'536;
  b.s.budget.gpu_snapshot_slots = gpu_snapshot_slots_for(3);
  workload::AgentShape shape;
  shape.system_tokens = 6'400;
  shape.first_message_tokens = 3'200;
  shape.turns = 8;
  shape.turn_interval_s = 60.0;
  shape.tail_tokens = 320;
  shape.tail_step_tokens = 208;
  shape.send_output = 100;
  shape.side_output = 64;
  shape.grow_min = 2'400;
  shape.grow_max = 4'000;
  for (auto& r : workload::agent_requests(shape, synth_tokens)) {
    b.add(r.label, std::move(r.prompt), r.output, r.arrival_s);
    // The conversation's sends keep the default retention priority; side requests run at
    // o.agent_side_priority (lower by default), so their own KV and snapshots leave first.
    if (r.side) b.s.requests.back().request.priority = o.agent_side_priority;
  }
  return std::move(b.s);
}

// admission-128k: the cost of the cache itself: a 131,072-token prompt, then the same prompt +
// 64 tokens, which admits the cached 128k prefix (run under callgrind, docs/results.md).
Scenario admission_128k() {
  Builder b = base("admission-128k",
                   "a 131,072-token prompt, then the same prompt + 64 tokens (admits a cached "
                   "128k prefix)");
  b.s.budget.gpu_kv_tokens = 262'144;
  b.s.budget.gpu_snapshot_slots = gpu_snapshot_slots_for(1);
  const auto prompt = synth_tokens(7, 131'072);
  b.add("prefix", prompt, 1);
  b.add("admit 128k", cat(prompt, synth_tokens(8, 64)), 1);
  return std::move(b.s);
}

}  // namespace

std::uint32_t gpu_snapshot_slots_for(std::size_t max_running) {
  return static_cast<std::uint32_t>(4 * max_running + std::max<std::size_t>(1, max_running) + 1);
}

std::uint32_t live_slots_for(std::size_t max_running) {
  return static_cast<std::uint32_t>(2 * std::max<std::size_t>(1, max_running) + 1);
}

CacheConfig cache_config(const Budget& budget, const ModelGeometry& model,
                         std::uint32_t page_size) {
  CacheConfig c;
  c.page_size = page_size;
  c.page_bytes = model.page_bytes(page_size);
  c.snapshot_bytes = model.snapshot_bytes();
  // Counts beyond 32 bits saturate (CacheConfig::validate then names the field) rather than
  // wrap into a small pool.
  auto u32 = [](std::uint64_t v) {
    return static_cast<std::uint32_t>(std::min<std::uint64_t>(v, UINT32_MAX));
  };
  c.gpu_pages = u32(budget.gpu_kv_tokens / page_size);
  c.gpu_snapshot_slots = budget.gpu_snapshot_slots;
  c.host_pages = u32(budget.host_kv_tokens > 0 ? budget.host_kv_tokens / page_size
                                               : budget.host_kv_bytes / c.page_bytes);
  c.host_snapshot_slots = budget.host_snapshot_bytes > 0
                              ? u32(budget.host_snapshot_bytes / c.snapshot_bytes)
                              : budget.host_snapshot_slots;
  return c;
}

std::vector<Token> synth_tokens(std::uint64_t seed, std::size_t n) {
  std::vector<Token> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<Token>(mix(seed * 0x100000001B3ull + i) % CostExecutor::kVocabulary);
  }
  return out;
}

void compute_reusable(Scenario& s) {
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    const auto& p = s.requests[i].request.prompt;
    std::size_t best = 0;
    for (std::size_t j = 0; j < i; ++j) {
      const auto& q = s.requests[j].request.prompt;
      std::size_t l = static_cast<std::size_t>(
          std::mismatch(p.begin(), p.end(), q.begin(), q.end()).first - p.begin());
      if (l == q.size() && !q.empty()) {
        // Walk on through the output the executor generates for q.
        Token prev = q.back();
        for (std::size_t k = 0; k < s.requests[j].request.max_new_tokens && l < p.size(); ++k) {
          const Token t = CostExecutor::synth_token(prev, q.size() + k);
          if (p[l] != t) break;
          prev = t;
          ++l;
        }
      }
      best = std::max(best, l);
    }
    const std::size_t usable = p.empty() ? 0 : std::min(best, p.size() - 1);
    s.requests[i].reusable_tokens = usable / s.page_size * s.page_size;
  }
}

sched::Request trace_request(const Scenario& s, std::size_t i, std::vector<Token> prompt) {
  const TraceRequest& t = s.trace.at(i);
  sched::Request r;
  r.id = i + 1;
  r.prompt = std::move(prompt);
  r.max_new_tokens = t.output_length;
  r.arrival_s = static_cast<double>(t.timestamp_ms) / 1000.0;
  return r;
}

sched::Request trace_request(const Scenario& s, std::size_t i) {
  return trace_request(s, i,
                       s.trace_parents ? faithful_prompt(s.trace, *s.trace_parents, i)
                                       : synthesize_tokens(s.trace.at(i)));
}

HitCeiling trace_token_ceiling(const Scenario& s) {
  HitCeiling c;
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    c.input_tokens += s.trace[i].input_length;
    c.hit_tokens += i < s.trace_reusable.size() ? s.trace_reusable[i] : 0;
  }
  return c;
}

namespace {

// The trace's split of one host byte budget: `share` of it for snapshots (whole slots, from
// the bytes: cache_config(); the simulator rounds them as PrefixCache keeps them), the rest
// for KV.
void split_host_bytes(Budget& b, std::uint64_t bytes, double share) {
  const auto snap_bytes = static_cast<std::uint64_t>(static_cast<double>(bytes) * share);
  b.host_kv_bytes = bytes - snap_bytes;
  b.host_kv_tokens = 0;
  b.host_snapshot_bytes = snap_bytes;
  b.host_snapshot_slots = 0;  // what cache_config() takes when snap_bytes is 0
}

}  // namespace

Scenario trace_scenario(std::vector<TraceRequest> trace, const ModelGeometry& /*model*/,
                        const ScenarioOptions& o) {
  Scenario s;
  s.name = "trace";
  s.description = "Mooncake-format trace replay (" + std::to_string(trace.size()) +
                  " requests), arrival times honoured";
  s.max_running = o.trace_max_running;
  s.include_queue = true;
  s.budget.gpu_kv_tokens = o.trace_gpu_kv_tokens;
  s.budget.gpu_snapshot_slots = gpu_snapshot_slots_for(o.trace_max_running);
  split_host_bytes(s.budget, o.trace_host_bytes, o.trace_snapshot_share);
  s.trace = std::move(trace);
  if (!o.trace_hash_only) {
    s.trace_parents = std::make_shared<const TraceParents>(find_trace_parents(s.trace));
    s.description += ", token-faithful (" + std::to_string(s.trace_parents->with_parent) +
                     " requests continue an earlier one)";
  } else {
    s.description += ", prompts from hash ids alone";
  }
  TracePrompts prompts(s.trace, s.trace_parents.get());
  s.trace_reusable = token_reuse(s.trace, prompts, s.page_size);
  return s;
}

std::vector<std::string> scenario_names() {
  return {"churn", "flush", "restart",       "compaction", "compaction-turns",
          "agent", "trace", "admission-128k"};
}

Result<Scenario> make_scenario(const std::string& name, const ModelGeometry& model,
                               const ScenarioOptions& options) {
  Scenario s;
  if (name == "churn") {
    s = churn(false);
  } else if (name == "flush") {
    s = churn(true);
  } else if (name == "restart") {
    s = restart();
  } else if (name == "compaction") {
    s = compaction(options);
  } else if (name == "compaction-turns") {
    s = compaction_turns(options);
  } else if (name == "agent") {
    s = agent(options);
  } else if (name == "admission-128k") {
    s = admission_128k();
  } else if (name == "trace") {
    auto reqs = load_trace(options.trace_path);
    if (!reqs) return reqs.status();
    if (options.trace_limit > 0 && reqs->size() > options.trace_limit) {
      reqs->resize(options.trace_limit);
    }
    return trace_scenario(std::move(*reqs), model, options);
  } else {
    std::string known;
    for (const auto& n : scenario_names()) known += (known.empty() ? "" : ", ") + n;
    return not_found("unknown scenario '" + name + "' (known: " + known + ")");
  }
  if (options.host_bytes) {
    split_host_bytes(s.budget, *options.host_bytes, options.trace_snapshot_share);
  }
  compute_reusable(s);
  return s;
}

}  // namespace radixtier::sim
