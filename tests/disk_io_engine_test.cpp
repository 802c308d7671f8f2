// The disk I/O engines: byte-exact sliced reads and writes, errors mapped to clear statuses.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "disk_harness.hpp"
#include "radixtier/disk/io_engine.hpp"

namespace radixtier::disk {
namespace {

using testing::TempDir;

class DiskIoEngineTest : public ::testing::TestWithParam<IoEngineKind> {
 protected:
  void SetUp() override {
    IoEngineConfig c;
    c.kind = GetParam();
    c.slice_bytes = 8192;
    c.queue_depth = 4;  // fewer ring entries than slices: the backlog is exercised
    c.io_threads = 3;
    auto e = make_io_engine(c);
    if (!e.is_ok() && GetParam() == IoEngineKind::kIoUring) {
      GTEST_SKIP() << e.status().to_string();
    }
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    engine_ = std::move(e).value();
    fd_ = ::open((dir_.path() + "/f").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    engine_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  TempDir dir_;
  std::unique_ptr<DiskIoEngine> engine_;
  int fd_ = -1;
};

TEST_P(DiskIoEngineTest, SlicedWritesAndReadsAreByteExact) {
  EXPECT_EQ(engine_->kind(), GetParam());
  std::vector<std::byte> src(200000);
  std::uint64_t x = 42;
  for (auto& b : src) b = static_cast<std::byte>(testing::splitmix(x));
  // Three ops of odd sizes at odd offsets, 25 slices in all.
  std::vector<IoOp> w = {IoOp::write(fd_, 0, src.data(), 70001),
                         IoOp::write(fd_, 70001, src.data() + 70001, 99),
                         IoOp::write(fd_, 70100, src.data() + 70100, src.size() - 70100)};
  auto t = engine_->submit(w);
  ASSERT_TRUE(t.is_ok());
  ASSERT_TRUE(t->wait().is_ok());
  EXPECT_EQ(t->poll(), IoState::kDone);
  std::vector<std::byte> dst(src.size());
  auto r1 = engine_->submit({IoOp::read(fd_, 100000, dst.data() + 100000, 100000)});
  auto r2 = engine_->submit({IoOp::read(fd_, 0, dst.data(), 100000)});
  ASSERT_TRUE(r1.is_ok() && r2.is_ok());
  EXPECT_TRUE(r2->wait().is_ok());
  EXPECT_TRUE(r1->wait().is_ok());
  EXPECT_EQ(dst, src);
  const IoEngineStats s = engine_->stats();
  EXPECT_EQ(s.bytes_written, src.size());
  EXPECT_EQ(s.bytes_read, src.size());
  EXPECT_EQ(s.batches, 3u);
}

TEST_P(DiskIoEngineTest, AReadPastTheEndIsDataLoss) {
  std::vector<std::byte> buf(10000);
  auto w = engine_->submit({IoOp::write(fd_, 0, buf.data(), 5000)});
  ASSERT_TRUE(w.is_ok() && w->wait().is_ok());
  auto r = engine_->submit({IoOp::read(fd_, 0, buf.data(), 10000)});
  ASSERT_TRUE(r.is_ok());
  Status s = r->wait();
  EXPECT_EQ(s.code(), ErrorCode::kDataLoss);
  EXPECT_NE(s.message().find("short read"), std::string::npos);
  EXPECT_EQ(r->poll(), IoState::kFailed);
  EXPECT_EQ(engine_->stats().failed_batches, 1u);
}

TEST_P(DiskIoEngineTest, AnErrnoBecomesAClearStatus) {
  const int ro = ::open((dir_.path() + "/f").c_str(), O_RDONLY);
  ASSERT_GE(ro, 0);
  std::vector<std::byte> buf(4096);
  auto w = engine_->submit({IoOp::write(ro, 0, buf.data(), buf.size())});
  ASSERT_TRUE(w.is_ok());
  Status s = w->wait();
  EXPECT_EQ(s.code(), ErrorCode::kTransferFailed);
  EXPECT_NE(s.message().find("Bad file descriptor"), std::string::npos) << s.message();
  w->reset();
  ::close(ro);
}

TEST_P(DiskIoEngineTest, MalformedBatchesAreRefusedWhole) {
  std::vector<std::byte> buf(16);
  EXPECT_EQ(engine_->submit({}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->submit({IoOp::read(-1, 0, buf.data(), 16)}).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->submit({IoOp::read(fd_, 0, nullptr, 16)}).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->submit({IoOp::read(fd_, 0, buf.data(), 0)}).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine_->stats().batches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Engines, DiskIoEngineTest,
                         ::testing::Values(IoEngineKind::kThreadPool, IoEngineKind::kIoUring),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(DiskIoEngine, ErrnoMapping) {
  EXPECT_EQ(io_error(ENOSPC, "x").code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(io_error(EDQUOT, "x").code(), ErrorCode::kOutOfMemory);
  EXPECT_EQ(io_error(EIO, "x").code(), ErrorCode::kTransferFailed);
}

TEST(DiskIoEngine, AutoFallsBackOrUsesIoUring) {
  IoEngineConfig c;
  EXPECT_EQ(c.kind, IoEngineKind::kAuto);  // the default (docs/performance.md)
  std::string reason;
  auto e = make_io_engine(c, &reason);
  ASSERT_TRUE(e.is_ok());
  if ((*e)->kind() == IoEngineKind::kThreadPool) {
    EXPECT_NE(reason.find("io_uring unavailable"), std::string::npos);
  } else {
    EXPECT_EQ(reason, "");
  }
  c.queue_depth = 0;
  EXPECT_EQ(make_io_engine(c).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace radixtier::disk
