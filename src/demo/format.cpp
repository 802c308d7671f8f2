// Text tables and JSON for scenario reports.
#include <cstdio>
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

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out;
}

void json_row(std::ostringstream& os, const Row& r) {
  os << "{\"label\":\"" << json_escape(r.label) << "\",\"id\":" << r.id
     << ",\"prompt_tokens\":" << r.prompt_tokens << ",\"output_tokens\":" << r.output_tokens
     << ",\"cached_tokens\":" << r.cached_tokens
     << ",\"host_cached_tokens\":" << r.host_cached_tokens
     << ",\"recomputed_tokens\":" << r.recomputed_tokens
     << ",\"baseline_recomputed_tokens\":" << r.baseline_recomputed
     << ",\"bytes_promoted\":" << r.bytes_promoted << ",\"bytes_demoted\":" << r.bytes_demoted
     << ",\"snapshots_kept\":" << r.snapshots_kept
     << ",\"identical\":" << (r.identical ? "true" : "false") << ",\"error\":\""
     << json_escape(r.error) << "\"}";
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
  return os.str();
}

std::string format_json(const std::vector<ScenarioReport>& reports) {
  std::ostringstream os;
  os << "{\"scenarios\":[";
  for (std::size_t i = 0; i < reports.size(); ++i) {
    const auto& r = reports[i];
    const auto& c = r.cache;
    if (i) os << ",";
    os << "\n{\"name\":\"" << json_escape(r.name) << "\",\"description\":\""
       << json_escape(r.description) << "\",\"policy\":\"" << json_escape(r.policy)
       << "\",\"status\":\"" << json_escape(r.status.is_ok() ? "ok" : r.status.to_string())
       << "\",\"all_identical\":" << (r.all_identical ? "true" : "false")
       << ",\"page_bytes\":" << r.page_bytes << ",\"snapshot_bytes\":" << r.snapshot_bytes
       << ",\"cache_wall_s\":" << r.cache_wall_s << ",\"baseline_wall_s\":" << r.baseline_wall_s
       << ",\"cache_stats\":{\"kv_pages_demoted\":" << c.kv_pages_demoted
       << ",\"kv_pages_promoted\":" << c.kv_pages_promoted
       << ",\"kv_pages_dropped_gpu\":" << c.kv_pages_dropped_gpu
       << ",\"kv_pages_dropped_host\":" << c.kv_pages_dropped_host
       << ",\"snapshots_demoted\":" << c.snapshots_demoted
       << ",\"snapshots_promoted\":" << c.snapshots_promoted
       << ",\"snapshots_dropped\":" << c.snapshots_dropped
       << ",\"snapshots_inserted\":" << c.snapshots_inserted << ",\"bytes_d2h\":" << c.bytes_d2h
       << ",\"bytes_h2d\":" << c.bytes_h2d << ",\"transfers_failed\":" << c.transfers_failed
       << "},\"preemptions\":" << r.sched.preemptions << ",\"rows\":[";
    for (std::size_t j = 0; j < r.rows.size(); ++j) {
      if (j) os << ",";
      os << "\n  ";
      json_row(os, r.rows[j]);
    }
    os << "],\"total\":";
    json_row(os, r.total);
    os << "}";
  }
  os << "\n]}\n";
  return os.str();
}

}  // namespace radixtier::demo
