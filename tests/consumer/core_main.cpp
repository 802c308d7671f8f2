// An engine's view of the package: only the installed headers of radixtier::radixtier.
// Serves a prompt, inserts its KV and a snapshot, and checks that a second admission of the
// same prompt resumes from the cache.
#include <cstdio>
#include <vector>

#include "tiny_cache.hpp"

int main() {
  using namespace radixtier;
  TinyCache tiny(16, 16);
  if (!tiny.cache) return 1;

  const std::vector<Token> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  auto first = tiny.cache->admit(prompt);
  if (!first || first->cached_tokens != 0) return std::fprintf(stderr, "first admit\n"), 1;
  auto pages = tiny.cache->alloc_pages(first->lock, 2);
  auto slot = tiny.cache->alloc_snapshot_slot(first->lock);
  if (!pages || !slot) return std::fprintf(stderr, "alloc\n"), 1;
  auto ins = tiny.cache->insert(first->lock, std::span(prompt).first(8), *pages, *slot);
  if (!ins || !ins->snapshot_taken) return std::fprintf(stderr, "insert\n"), 1;
  if (!tiny.cache->release(first->lock).is_ok()) return std::fprintf(stderr, "release\n"), 1;

  auto second = tiny.cache->admit(prompt);
  if (!second || second->cached_tokens != 8) return std::fprintf(stderr, "second admit\n"), 1;
  (void)tiny.cache->release(second->lock);
  const std::string bad = tiny.cache->check_invariants();
  if (!bad.empty()) return std::fprintf(stderr, "invariants: %s\n", bad.c_str()), 1;
  std::puts("consumer: core ok (8 tokens resumed)");
  return 0;
}
