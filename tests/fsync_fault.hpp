// A failed fsync on demand: the test binary defines fdatasync() itself (the disk store's calls
// bind to it), passes every call to the kernel, and fails the next armed ones with EIO, as a
// device that lost a write reports it. Disarmed (the default) it changes nothing.
#pragma once

namespace radixtier::testing {

/// The next `n` fdatasync() calls of this process fail with EIO (0: none).
void fail_next_fdatasyncs(int n);
/// fdatasync() calls failed so far.
int failed_fdatasyncs();

}  // namespace radixtier::testing
