// ReplyPool (SharedTier's pooled fetch buffers): the vector given back last is taken first
// with its strings' memory, and the pool keeps at most its vectors and bytes.
#include "shared/reply_pool.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace radixtier::shared::detail {
namespace {

std::vector<GetReply> vector_of(std::size_t n, std::size_t bytes_each) {
  std::vector<GetReply> v(n);
  for (auto& r : v) r.value.assign(bytes_each, 'x');
  return v;
}

TEST(SharedReplyPool, HandsBackTheLastVectorWithItsMemory) {
  ReplyPool pool(4, 1u << 20);
  EXPECT_TRUE(pool.take().empty());
  auto v = vector_of(3, 1000);
  const char* data = v[1].value.data();
  pool.give(std::move(v));
  EXPECT_EQ(pool.held_vectors(), 1u);
  EXPECT_GE(pool.held_bytes(), 3000u);
  auto again = pool.take();
  ASSERT_EQ(again.size(), 3u);
  EXPECT_EQ(again[1].value.data(), data);
  EXPECT_EQ(pool.held_vectors(), 0u);
  EXPECT_EQ(pool.held_bytes(), 0u);
}

TEST(SharedReplyPool, KeepsAtMostItsVectorsAndBytes) {
  ReplyPool pool(2, 10000);
  pool.give(vector_of(1, 4000));
  pool.give(vector_of(1, 4000));
  pool.give(vector_of(1, 100));  // a third vector: freed
  EXPECT_EQ(pool.held_vectors(), 2u);
  (void)pool.take();
  pool.give(vector_of(1, 20000));  // over the bytes: freed
  EXPECT_EQ(pool.held_vectors(), 1u);
  EXPECT_LE(pool.held_bytes(), 10000u);
  ReplyPool none(4, 0);
  none.give(vector_of(1, 10));
  EXPECT_EQ(none.held_vectors(), 0u);
}

TEST(SharedReplyPool, LeasesFromManyThreads) {
  ReplyPool pool(4, 1u << 30);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&pool, t] {
      for (int i = 0; i < 200; ++i) {
        ReplyPool::Lease lease(pool);
        lease->resize(2);
        (*lease)[0].value.assign(64, static_cast<char>('a' + t));
        EXPECT_EQ((*lease)[0].value, std::string(64, static_cast<char>('a' + t)));
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(pool.held_vectors(), 4u);
}

}  // namespace
}  // namespace radixtier::shared::detail
