// Host memory limits and NUMA lookup for the pinned pool (see host_memory.hpp).
#include "host_memory.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

namespace radixtier::cuda::detail {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<std::size_t> to_size(std::string_view s) {
  s = trim(s);
  std::size_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || s.empty()) return std::nullopt;
  (void)end;
  return v;
}

// Calls f(line) for every line of `text`.
template <class F>
void for_each_line(std::string_view text, F&& f) {
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    f(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

std::string gib(std::size_t bytes) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(bytes) / static_cast<double>(std::size_t{1} << 30) << " GiB";
  return os.str();
}

}  // namespace

std::optional<std::size_t> parse_meminfo_available(std::string_view meminfo) {
  std::optional<std::size_t> out;
  for_each_line(meminfo, [&](std::string_view line) {
    constexpr std::string_view kKey = "MemAvailable:";
    if (line.substr(0, kKey.size()) != kKey) return;
    line.remove_prefix(kKey.size());
    line = trim(line);
    std::size_t unit = 1;
    if (line.size() >= 2 && line.substr(line.size() - 2) == "kB") {
      unit = 1024;
      line.remove_suffix(2);
    }
    if (auto v = to_size(line)) out = *v * unit;
  });
  return out;
}

std::optional<std::size_t> parse_cgroup_bytes(std::string_view text) {
  text = trim(text);
  if (text == "max") return std::nullopt;
  auto v = to_size(text);
  if (!v || *v >= (std::size_t{1} << 62)) return std::nullopt;  // v1 "unlimited" is ~2^63
  return v;
}

std::size_t parse_cgroup_inactive_file(std::string_view memory_stat) {
  std::size_t out = 0;
  for_each_line(memory_stat, [&](std::string_view line) {
    constexpr std::string_view kKey = "inactive_file ";
    if (line.substr(0, kKey.size()) != kKey) return;
    if (auto v = to_size(line.substr(kKey.size()))) out = *v;
  });
  return out;
}

std::optional<CgroupPath> parse_memory_cgroup(std::string_view proc_self_cgroup) {
  std::optional<CgroupPath> v1, v2;
  for_each_line(proc_self_cgroup, [&](std::string_view line) {
    // hierarchy-id:controller-list:path
    const std::size_t a = line.find(':');
    if (a == std::string_view::npos) return;
    const std::size_t b = line.find(':', a + 1);
    if (b == std::string_view::npos) return;
    const std::string_view id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path(trim(line.substr(b + 1)));
    if (id == "0" && controllers.empty()) {
      v2 = CgroupPath{path, false};
      return;
    }
    std::string_view rest = controllers;
    while (!rest.empty()) {
      const std::size_t comma = rest.find(',');
      if (rest.substr(0, comma) == "memory") v1 = CgroupPath{path, true};
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  });
  return v1 ? v1 : v2;
}

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

HostMemoryLimits read_host_memory_limits(const std::string& cgroup_root) {
  HostMemoryLimits out;
  if (auto meminfo = read_text_file("/proc/meminfo"))
    out.mem_available = parse_meminfo_available(*meminfo);
  const auto self = read_text_file("/proc/self/cgroup");
  const auto cg = self ? parse_memory_cgroup(*self) : std::nullopt;
  if (!cg) return out;
  const std::string base = cgroup_root + (cg->v1 ? "/memory" : "");
  const char* limit_file = cg->v1 ? "/memory.limit_in_bytes" : "/memory.max";
  const char* usage_file = cg->v1 ? "/memory.usage_in_bytes" : "/memory.current";
  // The effective limit is the tightest of the cgroup and its ancestors.
  std::string path = cg->path;
  while (true) {
    const std::string dir = base + (path == "/" ? "" : path);
    const auto limit_text = read_text_file(dir + limit_file);
    const auto limit = limit_text ? parse_cgroup_bytes(*limit_text) : std::nullopt;
    if (limit) {
      const auto usage_text = read_text_file(dir + usage_file);
      const std::size_t usage =
          usage_text ? parse_cgroup_bytes(*usage_text).value_or(0) : std::size_t{0};
      const auto stat = read_text_file(dir + "/memory.stat");
      const std::size_t reclaimable = stat ? parse_cgroup_inactive_file(*stat) : 0;
      const std::size_t used = usage > reclaimable ? usage - reclaimable : 0;
      const std::size_t headroom = *limit > used ? *limit - used : 0;
      if (!out.cgroup_headroom || headroom < *out.cgroup_headroom) {
        out.cgroup_headroom = headroom;
        out.cgroup = dir;
        out.cgroup_limit = *limit;
      }
    }
    if (path.empty() || path == "/") break;
    const std::size_t slash = path.find_last_of('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return out;
}

Status check_host_memory(std::size_t bytes, const HostMemoryLimits& limits) {
  if (limits.mem_available && bytes > *limits.mem_available)
    return out_of_memory("PinnedHostPool: " + gib(bytes) + " requested but MemAvailable is " +
                         gib(*limits.mem_available) +
                         " (/proc/meminfo); pinning it would wake the OOM killer. Use a smaller "
                         "host pool or free host RAM (PinnedHostPool::Options::check_memory "
                         "= false skips this check)");
  if (limits.cgroup_headroom && bytes > *limits.cgroup_headroom)
    return out_of_memory("PinnedHostPool: " + gib(bytes) + " requested but the cgroup " +
                         limits.cgroup + " has " + gib(*limits.cgroup_headroom) + " left of its " +
                         gib(limits.cgroup_limit) +
                         " limit; pinning it would get the process OOM-killed. Raise the "
                         "container's memory limit or use a smaller host pool "
                         "(PinnedHostPool::Options::check_memory = false skips this check)");
  return Status::ok();
}

std::string pci_numa_node_path(std::string_view pci_bus_id) {
  std::string id(trim(pci_bus_id));
  std::transform(id.begin(), id.end(), id.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return "/sys/bus/pci/devices/" + id + "/numa_node";
}

int parse_numa_node(std::string_view text) {
  text = trim(text);
  int v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < -1) return -1;
  return v;
}

}  // namespace radixtier::cuda::detail
