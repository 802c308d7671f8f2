// key_slot against the Redis Cluster specification's values and a real node's CLUSTER KEYSLOT.
#include "radixtier/shared/key_slot.hpp"

#include <gtest/gtest.h>

#include "shared_test_util.hpp"

namespace radixtier::shared {
namespace {

TEST(KeySlot, Crc16XmodemCheckValue) {
  EXPECT_EQ(crc16("123456789"), 0x31C3);
  EXPECT_EQ(crc16(""), 0);
  EXPECT_EQ(key_slot("123456789"), 0x31C3 % kClusterSlots);
}

TEST(KeySlot, HashTagsAsTheSpecDefinesThem) {
  EXPECT_EQ(hash_part("{user1000}.following"), "user1000");
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
  EXPECT_EQ(hash_part("foo{}{bar}"), "foo{}{bar}");
  EXPECT_EQ(key_slot("foo{}{bar}"), crc16("foo{}{bar}") % kClusterSlots);
  EXPECT_EQ(hash_part("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(hash_part("foo{bar}{zap}"), "bar");
  EXPECT_EQ(hash_part("foo{bar"), "foo{bar");
  EXPECT_EQ(hash_part("no tag"), "no tag");
  EXPECT_EQ(key_slot("foo"), 12182);  // CLUSTER KEYSLOT foo
  EXPECT_EQ(key_slot("hello"), 866);  // CLUSTER KEYSLOT hello
}

TEST(KeySlot, MatchesARealNodesClusterKeyslot) {
  auto cluster = testing::start_cluster(1, 0);
  ASSERT_TRUE(cluster);
  const std::vector<std::string> keys = {"a",
                                         "foo{}{bar}",
                                         "foo{{bar}}zap",
                                         "foo{bar}{zap}",
                                         "{user1000}.x",
                                         "kv:0123456789abcdef",
                                         std::string("bin\0key\xff", 8)};
  for (const std::string& key : keys) {
    auto slot = cluster->command(0, {"CLUSTER", "KEYSLOT", key});
    ASSERT_TRUE(slot.is_ok()) << slot.status().to_string();
    EXPECT_EQ(*slot, std::to_string(key_slot(key))) << key;
  }
}

}  // namespace
}  // namespace radixtier::shared
