#include "fsync_fault.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

namespace {
std::atomic<int> armed{0};
std::atomic<int> failed{0};
}  // namespace

namespace radixtier::testing {
void fail_next_fdatasyncs(int n) {
  armed.store(n);
}
int failed_fdatasyncs() {
  return failed.load();
}
}  // namespace radixtier::testing

extern "C" int fdatasync(int fd) {
  int left = armed.load();
  while (left > 0 && !armed.compare_exchange_weak(left, left - 1)) {
  }
  if (left > 0) {
    failed.fetch_add(1);
    errno = EIO;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_fdatasync, fd));
}
