// RedisConnection: one TCP connection to one Redis node, non-blocking, with a RESP writer of
// its own (large arguments are sent from the caller's memory, never copied). Two readers:
// the data path (pipelined EXISTS / GET / SET: next_data_reply()) parses the flat replies
// those commands get and reads a bulk value straight from the socket into its destination
// (one copy, kernel to caller): a string the caller names (its capacity reused: GET into a
// caller's buffers) or the string handed back, never longer than the call's bound (a longer
// bulk is a protocol error: nothing is allocated for it); command() (setup: AUTH, CLUSTER
// SLOTS) parses nested replies with a reader of its own, bounded in bytes, elements and depth
// and by the deadline (hiredis's reader allocates what a header announces and has no clock).
//
// State machine: closed --connect()--> open --close() / any I/O or protocol error--> closed.
// While open, append() queues commands; write_some() / read_some() move bytes without
// blocking (the caller polls fd()); next_reply() hands complete replies back in order.
// close() discards everything queued or half-read, so a late reply can never be matched to a
// later command: the caller closes a connection whose replies it stops waiting for.
// Not thread-safe: its owner serializes (one mutex per connection).
#pragma once

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

/// A reply of a setup command (command()): nested arrays allowed.
struct SetupReply {
  enum class Type : std::uint8_t { kStatus, kError, kInteger, kBulk, kNil, kArray };
  Type type = Type::kNil;
  std::string text;  ///< status / error text or bulk bytes
  long long integer = 0;
  std::vector<SetupReply> elements;  ///< kArray
};

/// Bounds of one setup reply: a reply past any of them is a protocol error.
struct SetupLimits {
  std::size_t max_bytes = std::size_t{1} << 20;
  std::size_t max_elements = std::size_t{1} << 16;
  std::size_t max_depth = 4;
};

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
  /// Opens a TCP connection (by `deadline`) and authenticates when a password is set; with
  /// `auth_networks`, only to a peer inside one of them (else kFailedPrecondition, closed,
  /// nothing sent: credentials never go to a node outside the configured cluster).
  Status connect(const Endpoint& endpoint, const Credentials& credentials, Deadline deadline,
                 AuthMode auth = AuthMode::kWait,
                 const std::vector<Network>* auth_networks = nullptr);
  void close();
  /// Non-blocking connect: starts it (DNS from the cache only: resolve_cached) and returns;
  /// the caller polls fd() for POLLOUT, then calls finish_connect(), which checks the result
  /// and the peer against `auth_networks` (as connect()) and, with queue_auth, queues AUTH
  /// first in the pipeline (its reply is the first data-path reply).
  Status start_connect(const Endpoint& endpoint);
  bool connecting() const { return connecting_; }
  Status finish_connect(const Credentials& credentials, const std::vector<Network>* auth_networks,
                        bool queue_auth = true);

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
  /// same reply). Without a target the bytes come back in DataReply::text. A bulk longer
  /// than `max_bulk` (0: no bulk expected) is a protocol error before anything is allocated;
  /// so is an array, a line that starts with CRLF or a type byte RESP does not have.
  Result<bool> next_data_reply(DataReply& out, std::string* bulk_target, std::size_t max_bulk);
  /// True while a bulk value is half received (its target still in use).
  bool mid_bulk() const { return in_bulk_; }
  /// True when bytes were received that no reply parsed so far accounts for (or a bulk is
  /// half received): after the last expected reply, the server sent something unrequested.
  bool has_unparsed() const { return in_bulk_ || in_begin_ != in_end_; }
  /// True when the socket has bytes waiting or the server closed it: an idle connection
  /// must have neither before a call writes to it (peeks, never consumes).
  bool idle_input_pending() const;

  /// Blocking helper for setup paths: one command, its reply, by `deadline`, within
  /// `limits`; bytes after the reply are a protocol error.
  Result<SetupReply> command(std::initializer_list<std::string_view> args, Deadline deadline,
                             const SetupLimits& limits = {});
  /// The peer's numeric address ("" when closed): what a reply came from.
  std::string peer_host() const;

 private:
  struct Segment {
    const char* external = nullptr;  ///< caller memory; null: `small_` at `offset`
    std::size_t offset = 0;
    std::size_t size = 0;
  };
  void add_bytes(std::string_view bytes, bool may_reference);

  int fd_ = -1;
  bool connecting_ = false;
  std::string endpoint_;  // what start_connect() was given, for messages
  std::vector<char> in_;  // received bytes not parsed yet: [in_begin_, in_end_)
  std::size_t in_begin_ = 0;
  std::size_t in_end_ = 0;
  bool in_bulk_ = false;  // receiving *bulk_dst_ (then its CRLF from in_)
  std::string bulk_;      // the destination when the caller named none
  std::string* bulk_dst_ = nullptr;
  std::size_t bulk_have_ = 0;
  std::size_t bulk_size_ = 0;  // the bulk's length (its destination grows toward it)
  std::string small_;
  std::vector<Segment> segs_;
  std::size_t seg_index_ = 0;
  std::size_t seg_done_ = 0;  ///< bytes of segs_[seg_index_] already written
};

/// A reply as text for messages and tests: strings as they are, integers in decimal, nil as
/// "(nil)", arrays one element a line; at most `max_chars` characters.
std::string reply_to_string(const SetupReply& reply, std::size_t max_chars = 200);

/// Parses one setup reply from bytes[pos...]: true and `pos` past it when complete, false
/// when more bytes are needed (`pos` unchanged), error past `limits` or on a protocol error.
Result<bool> parse_setup_reply(std::string_view bytes, std::size_t& pos, SetupReply& out,
                               const SetupLimits& limits);

}  // namespace radixtier::shared::detail
