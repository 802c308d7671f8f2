// RedisConnection: one TCP connection to one Redis node, non-blocking, with a RESP writer of
// its own (large arguments are sent from the caller's memory, never copied). Two readers:
// the data path (pipelined EXISTS / GET / SET: next_data_reply()) parses the flat replies
// those commands get and reads a bulk value straight from the socket into its destination
// (one copy, kernel to caller): a string the caller names (its capacity reused: GET into a
// caller's buffers) or the string handed back; command() (setup: AUTH, CLUSTER SLOTS) uses
// hiredis's reader, which handles nested arrays.
//
// State machine: closed --connect()--> open --close() / any I/O or protocol error--> closed.
// While open, append() queues commands; write_some() / read_some() move bytes without
// blocking (the caller polls fd()); next_reply() hands complete replies back in order.
// close() discards everything queued or half-read, so a late reply can never be matched to a
// later command: the caller closes a connection whose replies it stops waiting for.
// Not thread-safe: its owner serializes (one mutex per connection).
#pragma once

#include <hiredis/hiredis.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "radixtier/shared/shared_store.hpp"
#include "radixtier/status.hpp"
#include "shared/endpoint.hpp"

namespace radixtier::shared::detail {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

/// A flat reply of the data path.
struct DataReply {
  enum class Type : std::uint8_t { kStatus, kError, kInteger, kBulk, kNil };
  Type type = Type::kNil;
  std::string text;  ///< status / error text, or the bulk's bytes (unless in_target)
  long long integer = 0;
  bool in_target = false;  ///< kBulk: the bytes are in the caller's target, `text` is empty
};

struct Credentials {
  std::string user;
  std::string password;  ///< "" = no AUTH; never put in a message
};

class RedisConnection {
 public:
  RedisConnection() = default;
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;
  ~RedisConnection();

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  enum class AuthMode : std::uint8_t {
    kWait,       ///< connect() sends AUTH and waits for its reply
    kPipelined,  ///< connect() queues AUTH: its reply is the first data-path reply
  };
  /// Opens a TCP connection (by `deadline`) and authenticates when a password is set.
  Status connect(const Endpoint& endpoint, const Credentials& credentials, Deadline deadline,
                 AuthMode auth = AuthMode::kWait);
  void close();

  /// Queues one command; views must stay valid until everything queued is written.
  void append(std::initializer_list<std::string_view> args);
  bool want_write() const { return seg_index_ < segs_.size(); }
  /// Writes what the socket takes now; `bytes` grows by what was written.
  Status write_some(std::size_t& bytes);
  /// Reads what the socket has now (into the bulk value being received, else the line
  /// buffer); `bytes` grows by what was read. Error on EOF or a socket error.
  Status read_some(std::size_t& bytes);
  /// The next complete data-path reply, false when none is complete yet; error on a
  /// protocol error (or an array: no data-path command gets one). When this call parses a
  /// bulk header and `bulk_target` is set, the value is received into *bulk_target (resized
  /// to the value's length, its capacity reused) and the reply comes back with in_target;
  /// the target must stay valid until that reply is complete or the connection is closed
  /// (a bulk already started keeps the target it started with: pass the same one for the
  /// same reply). Without a target the bytes come back in DataReply::text.
  Result<bool> next_data_reply(DataReply& out, std::string* bulk_target = nullptr);
  /// True while a bulk value is half received (its target still in use).
  bool mid_bulk() const { return in_bulk_; }

  /// Blocking helper for setup paths: one command, its reply, by `deadline`.
  Result<ReplyPtr> command(std::initializer_list<std::string_view> args, Deadline deadline);

 private:
  struct Segment {
    const char* external = nullptr;  ///< caller memory; null: `small_` at `offset`
    std::size_t offset = 0;
    std::size_t size = 0;
  };
  void add_bytes(std::string_view bytes, bool may_reference);

  int fd_ = -1;
  redisReader* reader_ = nullptr;  // command() only
  std::vector<char> in_;           // received bytes not parsed yet: [in_begin_, in_end_)
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  bool in_bulk_ = false;  // receiving *bulk_dst_ (then its CRLF from in_)
  std::string bulk_;      // the destination when the caller named none
  std::string* bulk_dst_ = nullptr;
  std::size_t bulk_have_ = 0;
  std::string small_;
  std::vector<Segment> segs_;
  std::size_t seg_index_ = 0;
  std::size_t seg_done_ = 0;  ///< bytes of segs_[seg_index_] already written
};

/// A reply as text for messages and tests: strings as they are, integers in decimal, nil as
/// "(nil)", arrays one element a line.
std::string reply_to_string(const redisReply* reply);

}  // namespace radixtier::shared::detail
