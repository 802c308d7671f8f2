// An engine's view of the disk component: only the installed headers of radixtier::disk.
// Writes a KV page record, reopens the store, and reads the page back byte-exact; the store
// engine (the cache's store tier) lists it.
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "radixtier/disk/disk_store.hpp"
#include "radixtier/disk/disk_store_engine.hpp"

int main() {
  using namespace radixtier;
  using namespace radixtier::disk;
  std::string dir = (std::filesystem::temp_directory_path() / "radixtier-consumer-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return std::fprintf(stderr, "mkdtemp\n"), 1;
  DiskStoreConfig config;
  config.directory = dir + "/store";
  config.budget_bytes = 16 * 4096;
  config.fingerprint = {4, 4096, 8192, "consumer-model", "w1"};
  const std::vector<Token> tokens = {1, 2, 3, 4};
  std::vector<std::byte> page(4096);
  for (std::size_t i = 0; i < page.size(); ++i) page[i] = static_cast<std::byte>(i * 7);
  RecordId id;
  {
    auto store = DiskStore::open(config);
    if (!store) return std::fprintf(stderr, "open: %s\n", store.status().to_string().c_str()), 1;
    auto put = (*store)->put(RecordDesc::kv_page(PathHash::root(), 4, tokens), page);
    if (!put || !(*store)->sync()) return std::fprintf(stderr, "put\n"), 1;
    id = *put;
  }
  auto store = DiskStore::open(config);
  if (!store) return std::fprintf(stderr, "reopen: %s\n", store.status().to_string().c_str()), 1;
  std::vector<std::byte> back(4096);
  Status got = (*store)->get(id, back);
  CacheConfig host;
  host.page_size = 4;
  host.gpu_pages = 1;
  host.host_pages = 1;
  host.gpu_snapshot_slots = 1;
  host.page_bytes = 4096;
  host.snapshot_bytes = 8192;
  HostArenas arenas(host);
  DiskStoreEngine engine(**store, arenas);
  const bool listed = engine.records().size() == 1 && engine.records()[0].id == id &&
                      engine.geometry().page_bytes == 4096 &&
                      engine.geometry().capacity_slots == 16;
  std::filesystem::remove_all(dir);
  if (!got || back != page) return std::fprintf(stderr, "get: %s\n", got.to_string().c_str()), 1;
  if (!listed) return std::fprintf(stderr, "DiskStoreEngine: records or geometry wrong\n"), 1;
  std::printf("consumer disk: record %llu came back after a reopen\n",
              static_cast<unsigned long long>(id.value()));
  return 0;
}
