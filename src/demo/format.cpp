// Text tables and JSON for scenario reports.
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "demo/scenarios.hpp"

namespace radixtier::demo {

namespace {

std::string bytes(std::uint64_t b) {
  char buf[32];
  if (b < 1024)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else if (b < (1u << 20))
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

std::string row_line(const Row& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-16s %7zu %5zu %8zu %7zu %10zu %9zu %11s %11s %6u  %s",
                r.label.c_str(), r.prompt_tokens, r.output_tokens, r.cached_tokens,
                r.host_cached_tokens, r.recomputed_tokens, r.baseline_recomputed,
                bytes(r.bytes_promoted).c_str(), bytes(r.bytes_demoted).c_str(), r.snapshots_kept,
                r.identical ? "identical" : ("DIFFERENT " + r.error).c_str());
  return buf;
}

nlohmann::ordered_json json_row(const Row& r) {
  nlohmann::ordered_json o;
  o["label"] = r.label;
  o["id"] = r.id;
  o["prompt_tokens"] = r.prompt_tokens;
  o["output_tokens"] = r.output_tokens;
  o["cached_tokens"] = r.cached_tokens;
  o["host_cached_tokens"] = r.host_cached_tokens;
  o["shared_tokens"] = r.shared_tokens;
  o["recomputed_tokens"] = r.recomputed_tokens;
  o["baseline_recomputed_tokens"] = r.baseline_recomputed;
  o["bytes_promoted"] = r.bytes_promoted;
  o["bytes_demoted"] = r.bytes_demoted;
  o["snapshots_kept"] = r.snapshots_kept;
  o["identical"] = r.identical;
  o["error"] = r.error;
  return o;
}

/// Six significant digits, as the JSON always carried the wall-clock seconds.
double six_digits(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::strtod(buf, nullptr);
}

}  // namespace

std::string format_table(const ScenarioReport& rep) {
  std::ostringstream os;
  os << "== " << rep.name << " (policy " << rep.policy << ") ==\n" << rep.description << "\n";
  if (!rep.status) os << "ERROR: " << rep.status.to_string() << "\n";
  char head[256];
  std::snprintf(head, sizeof head, "%-16s %7s %5s %8s %7s %10s %9s %11s %11s %6s  %s", "request",
                "prompt", "out", "cached", "(host)", "recomputed", "baseline", "promoted",
                "demoted", "snaps", "vs no-reuse");
  os << head << "\n" << std::string(std::string(head).size(), '-') << "\n";
  for (const Row& r : rep.rows) os << row_line(r) << "\n";
  os << std::string(std::string(head).size(), '-') << "\n" << row_line(rep.total) << "\n";
  const auto& c = rep.cache;
  const double saved = rep.total.baseline_recomputed == 0
                           ? 0.0
                           : 100.0 * (1.0 - static_cast<double>(rep.total.recomputed_tokens) /
                                                static_cast<double>(rep.total.baseline_recomputed));
  char tail[512];
  std::snprintf(tail, sizeof tail,
                "prefill recompute saved: %.1f%%; KV pages demoted %llu, promoted %llu, dropped "
                "GPU %llu / host %llu; snapshots demoted %llu, promoted %llu, dropped %llu; "
                "preemptions %llu; wall %.2f s (cache) / %.2f s (no reuse)\n",
                saved, static_cast<unsigned long long>(c.kv_pages_demoted),
                static_cast<unsigned long long>(c.kv_pages_promoted),
                static_cast<unsigned long long>(c.kv_pages_dropped_gpu),
                static_cast<unsigned long long>(c.kv_pages_dropped_host),
                static_cast<unsigned long long>(c.snapshots_demoted),
                static_cast<unsigned long long>(c.snapshots_promoted),
                static_cast<unsigned long long>(c.snapshots_dropped),
                static_cast<unsigned long long>(rep.sched.preemptions), rep.cache_wall_s,
                rep.baseline_wall_s);
  os << tail;
  if (rep.restarted) {
    const auto& b = rep.before_restart;
    char line[512];
    std::snprintf(
        line, sizeof line,
        "restart: persist() gave the disk %llu KV pages + %llu snapshots (%s); the "
        "reopened cache rebuilt %llu KV pages + %llu snapshots from it; %llu prompt "
        "tokens came from disk (%s read, %llu records lost)\n",
        static_cast<unsigned long long>(b.kv_pages_stored),
        static_cast<unsigned long long>(b.snapshots_stored), bytes(b.bytes_to_store).c_str(),
        static_cast<unsigned long long>(c.restored_kv_pages),
        static_cast<unsigned long long>(c.restored_snapshots),
        static_cast<unsigned long long>(c.hit_tokens_store), bytes(c.bytes_from_store).c_str(),
        static_cast<unsigned long long>(c.store_records_lost));
    os << line;
  }
  if (rep.shared.ran) {
    const auto& sh = rep.shared;
    char line[512];
    std::snprintf(line, sizeof line,
                  "shared tier: process 1 published %llu keys (%s); process 2 fetched %llu "
                  "times (%s), entered %llu into its cache reaching %llu tokens, %llu values "
                  "rejected\n",
                  static_cast<unsigned long long>(sh.published_keys),
                  bytes(sh.published_bytes).c_str(), static_cast<unsigned long long>(sh.fetches),
                  bytes(sh.bytes_fetched).c_str(), static_cast<unsigned long long>(sh.imports),
                  static_cast<unsigned long long>(sh.imported_tokens),
                  static_cast<unsigned long long>(sh.values_rejected));
    os << line;
  }
  return os.str();
}

std::string format_json(const std::vector<ScenarioReport>& reports) {
  nlohmann::ordered_json out;
  nlohmann::ordered_json& list = out["scenarios"] = nlohmann::ordered_json::array();
  for (const auto& r : reports) {
    const auto& c = r.cache;
    nlohmann::ordered_json& o = list.emplace_back();
    o["name"] = r.name;
    o["description"] = r.description;
    o["policy"] = r.policy;
    o["status"] = r.status.is_ok() ? "ok" : r.status.to_string();
    o["all_identical"] = r.all_identical;
    o["page_bytes"] = r.page_bytes;
    o["snapshot_bytes"] = r.snapshot_bytes;
    o["cache_wall_s"] = six_digits(r.cache_wall_s);
    o["baseline_wall_s"] = six_digits(r.baseline_wall_s);
    nlohmann::ordered_json& st = o["cache_stats"];
    st["kv_pages_demoted"] = c.kv_pages_demoted;
    st["kv_pages_promoted"] = c.kv_pages_promoted;
    st["kv_pages_dropped_gpu"] = c.kv_pages_dropped_gpu;
    st["kv_pages_dropped_host"] = c.kv_pages_dropped_host;
    st["snapshots_demoted"] = c.snapshots_demoted;
    st["snapshots_promoted"] = c.snapshots_promoted;
    st["snapshots_dropped"] = c.snapshots_dropped;
    st["snapshots_inserted"] = c.snapshots_inserted;
    st["bytes_d2h"] = c.bytes_d2h;
    st["bytes_h2d"] = c.bytes_h2d;
    st["transfers_failed"] = c.transfers_failed;
    if (r.restarted) {
      nlohmann::ordered_json& rs = o["restart"];
      rs["kv_pages_stored"] = r.before_restart.kv_pages_stored;
      rs["snapshots_stored"] = r.before_restart.snapshots_stored;
      rs["bytes_to_store"] = r.before_restart.bytes_to_store;
      rs["restored_kv_pages"] = c.restored_kv_pages;
      rs["restored_snapshots"] = c.restored_snapshots;
      rs["hit_tokens_store"] = c.hit_tokens_store;
      rs["bytes_from_store"] = c.bytes_from_store;
      rs["store_records_lost"] = c.store_records_lost;
    }
    if (r.shared.ran) {
      nlohmann::ordered_json& sh = o["shared"];
      sh["published_keys"] = r.shared.published_keys;
      sh["published_bytes"] = r.shared.published_bytes;
      sh["fetches"] = r.shared.fetches;
      sh["imports"] = r.shared.imports;
      sh["imported_tokens"] = r.shared.imported_tokens;
      sh["bytes_fetched"] = r.shared.bytes_fetched;
      sh["values_rejected"] = r.shared.values_rejected;
    }
    o["preemptions"] = r.sched.preemptions;
    nlohmann::ordered_json& rows = o["rows"] = nlohmann::ordered_json::array();
    for (const Row& row : r.rows) rows.push_back(json_row(row));
    o["total"] = json_row(r.total);
  }
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace radixtier::demo
