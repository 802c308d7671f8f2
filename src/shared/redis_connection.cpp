#include "shared/redis_connection.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>

namespace radixtier::shared::detail {
namespace {

constexpr std::size_t kReferenceAbove = 4096;  // larger arguments are not copied
constexpr std::size_t kLineBuffer = std::size_t{256} << 10;
constexpr std::size_t kReadPerCall = std::size_t{8} << 20;   // fairness between connections
constexpr std::size_t kMaxLine = std::size_t{64} << 10;      // a longer header is an error
constexpr std::size_t kBulkGrowStep = std::size_t{8} << 20;  // a bulk's destination grows by

Status io_error(const std::string& what) {
  return {ErrorCode::kTransferFailed, "redis: " + what};
}

timespec remaining(Deadline deadline) {
  auto left = deadline - Clock::now();
  if (left < Clock::duration::zero()) left = Clock::duration::zero();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

// Waits for `events` on `fd` until `deadline`: true when ready.
bool wait_fd(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    timespec ts = remaining(deadline);
    const int n = ppoll(&p, 1, &ts, nullptr);
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

RedisConnection::~RedisConnection() {
  close();
}

void RedisConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  connecting_ = false;
  // Memory goes with the connection: a closed one keeps no capacity (a big reply's buffer
  // must not stay with an idle connection).
  std::string().swap(small_);
  std::vector<Segment>().swap(segs_);
  seg_index_ = 0;
  seg_done_ = 0;
  std::vector<char>().swap(in_);
  in_begin_ = in_end_ = 0;
  in_bulk_ = false;
  std::string().swap(bulk_);
  bulk_dst_ = nullptr;
  bulk_have_ = 0;
  bulk_size_ = 0;
}

Status RedisConnection::start_connect(const Endpoint& endpoint) {
  close();
  auto addresses = resolve_cached(endpoint);  // never blocks on DNS
  if (!addresses) return addresses.status();
  std::string last_error = "no address";
  for (const SocketAddress& a : *addresses) {
    const int fd = ::socket(a.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&a.addr), a.len);
    if (rc != 0 && errno != EINPROGRESS) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fd_ = fd;
    connecting_ = true;
    endpoint_ = endpoint.address();
    return Status::ok();
  }
  return io_error("cannot connect to " + endpoint.address() + ": " + last_error);
}

Status RedisConnection::finish_connect(const Credentials& credentials,
                                       const std::vector<Network>* auth_networks, bool queue_auth) {
  if (fd_ < 0 || !connecting_) return io_error("finish_connect without a connect");
  int err = 0;
  socklen_t len = sizeof(err);
  getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    const std::string address = endpoint_;
    close();
    return io_error("cannot connect to " + address + ": " + std::strerror(err));
  }
  connecting_ = false;
  if (!credentials.password.empty() && auth_networks != nullptr) {
    const std::string peer = peer_host();
    const bool inside = std::any_of(auth_networks->begin(), auth_networks->end(),
                                    [&](const Network& n) { return n.contains(peer); });
    if (!inside) {
      const std::string address = endpoint_;
      close();
      return {ErrorCode::kFailedPrecondition, "redis: " + address + " (" + peer +
                                                  ") is outside the cluster's networks: no "
                                                  "AUTH sent"};
    }
  }
  if (!credentials.password.empty() && queue_auth) {  // first in the pipeline
    if (credentials.user.empty()) {
      append({"AUTH", credentials.password});
    } else {
      append({"AUTH", credentials.user, credentials.password});
    }
  }
  return Status::ok();
}

Status RedisConnection::connect(const Endpoint& endpoint, const Credentials& credentials,
                                Deadline deadline, AuthMode auth,
                                const std::vector<Network>* auth_networks) {
  if (auto st = start_connect(endpoint); !st) return st;
  if (!wait_fd(fd_, POLLOUT, deadline)) {
    close();
    return io_error("cannot connect to " + endpoint.address() + ": connect timed out");
  }
  if (auto st = finish_connect(credentials, auth_networks, auth == AuthMode::kPipelined); !st) {
    return st;
  }
  if (auth == AuthMode::kPipelined) return Status::ok();  // AUTH queued first
  if (!credentials.password.empty()) {
    auto reply = credentials.user.empty()
                     ? command({"AUTH", credentials.password}, deadline)
                     : command({"AUTH", credentials.user, credentials.password}, deadline);
    if (!reply) {
      close();
      return io_error("AUTH at " + endpoint.address() + " got no reply (" +
                      reply.status().message() + ")");
    }
    if (reply->type != SetupReply::Type::kStatus) {
      const std::string message = reply_to_string(*reply);
      close();
      return {ErrorCode::kFailedPrecondition,
              "redis: AUTH refused by " + endpoint.address() + ": " + message};
    }
  }
  return Status::ok();
}

void RedisConnection::add_bytes(std::string_view bytes, bool may_reference) {
  if (may_reference && bytes.size() > kReferenceAbove) {
    segs_.push_back({bytes.data(), 0, bytes.size()});
    return;
  }
  if (!segs_.empty() && segs_.back().external == nullptr &&
      segs_.back().offset + segs_.back().size == small_.size()) {
    segs_.back().size += bytes.size();
  } else {
    segs_.push_back({nullptr, small_.size(), bytes.size()});
  }
  small_.append(bytes);
}

void RedisConnection::append(std::initializer_list<std::string_view> args) {
  // "*<argc>\r\n" then "$<len>\r\n<arg>\r\n" per argument (RESP).
  auto prefixed = [this](char mark, std::size_t number) {
    char buf[32];
    buf[0] = mark;
    auto end = std::to_chars(buf + 1, buf + sizeof(buf) - 2, number).ptr;
    *end++ = '\r';
    *end++ = '\n';
    add_bytes(std::string_view(buf, static_cast<std::size_t>(end - buf)), false);
  };
  prefixed('*', args.size());
  for (auto arg : args) {
    prefixed('$', arg.size());
    add_bytes(arg, true);
    add_bytes("\r\n", false);
  }
}

Status RedisConnection::write_some(std::size_t& bytes) {
  if (fd_ < 0) return io_error("write on a closed connection");
  while (seg_index_ < segs_.size()) {
    iovec iov[64];
    int n = 0;
    for (std::size_t i = seg_index_; i < segs_.size() && n < 64; ++i, ++n) {
      const Segment& s = segs_[i];
      const char* base = s.external != nullptr ? s.external : small_.data() + s.offset;
      const std::size_t skip = i == seg_index_ ? seg_done_ : 0;
      iov[n].iov_base = const_cast<char*>(base + skip);
      iov[n].iov_len = s.size - skip;
    }
    const ssize_t written = ::writev(fd_, iov, n);
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      return io_error(std::string("write failed: ") + std::strerror(errno));
    }
    bytes += static_cast<std::size_t>(written);
    std::size_t left = static_cast<std::size_t>(written);
    while (left > 0 && seg_index_ < segs_.size()) {
      const std::size_t in_seg = segs_[seg_index_].size - seg_done_;
      if (left >= in_seg) {
        left -= in_seg;
        ++seg_index_;
        seg_done_ = 0;
      } else {
        seg_done_ += left;
        left = 0;
      }
    }
  }
  small_.clear();
  segs_.clear();
  seg_index_ = 0;
  seg_done_ = 0;
  return Status::ok();
}

Status RedisConnection::read_some(std::size_t& bytes) {
  if (fd_ < 0) return io_error("read on a closed connection");
  std::size_t this_call = 0;
  while (this_call < kReadPerCall) {
    char* dst = nullptr;
    std::size_t room = 0;
    const bool direct = in_bulk_ && bulk_have_ < bulk_size_;
    if (direct) {
      // The destination grows with what arrives (zero-filled a step at a time, between
      // reads), so a huge value's zero-fill never runs past the caller's deadline at once.
      if (bulk_dst_->size() == bulk_have_) {
        bulk_dst_->resize(std::min(bulk_size_, bulk_have_ + kBulkGrowStep));
      }
      dst = bulk_dst_->data() + bulk_have_;
      room = bulk_dst_->size() - bulk_have_;
    } else {
      if (in_.size() < kLineBuffer) in_.resize(kLineBuffer);
      if (in_begin_ == in_end_) in_begin_ = in_end_ = 0;
      if (in_end_ == in_.size() && in_begin_ > 0) {  // compact
        std::memmove(in_.data(), in_.data() + in_begin_, in_end_ - in_begin_);
        in_end_ -= in_begin_;
        in_begin_ = 0;
      }
      if (in_end_ == in_.size()) return Status::ok();  // full: parse first
      dst = in_.data() + in_end_;
      room = in_.size() - in_end_;
    }
    const ssize_t got = ::read(fd_, dst, room);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      return io_error(std::string("read failed: ") + std::strerror(errno));
    }
    if (got == 0) return io_error("connection closed by the server");
    const auto n = static_cast<std::size_t>(got);
    bytes += n;
    this_call += n;
    if (direct) {
      bulk_have_ += n;
    } else {
      in_end_ += n;
      return Status::ok();  // let the caller parse: a bulk header may start a direct read
    }
  }
  return Status::ok();
}

bool RedisConnection::idle_input_pending() const {
  if (fd_ < 0) return false;
  char byte = 0;
  const ssize_t got = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (got > 0 || got == 0) return true;  // bytes nobody asked for, or EOF
  return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

std::string RedisConnection::peer_host() const {
  if (fd_ < 0) return {};
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  char host[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, host, sizeof(host));
  } else if (addr.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, host, sizeof(host));
  }
  return host;
}

Result<bool> RedisConnection::next_data_reply(DataReply& out, std::string* bulk_target,
                                              std::size_t max_bulk) {
  while (true) {
    if (in_bulk_) {
      if (bulk_have_ < bulk_size_) return false;
      if (in_end_ - in_begin_ < 2) return false;
      if (in_[in_begin_] != '\r' || in_[in_begin_ + 1] != '\n') {
        return io_error("protocol error: bulk value not ended by CRLF");
      }
      in_begin_ += 2;
      in_bulk_ = false;
      out.type = DataReply::Type::kBulk;
      out.integer = 0;
      out.in_target = bulk_dst_ != &bulk_;
      if (out.in_target) {
        out.text.clear();
      } else {
        out.text = std::move(bulk_);
        bulk_ = std::string();
      }
      bulk_dst_ = nullptr;
      bulk_have_ = 0;
      return true;
    }
    const char* begin = in_.data() + in_begin_;
    const char* end = in_.data() + in_end_;
    const char* cr = nullptr;
    for (const char* p = begin; p + 1 < end; ++p) {
      if (p[0] == '\r' && p[1] == '\n') {
        cr = p;
        break;
      }
    }
    if (cr == nullptr) {
      if (static_cast<std::size_t>(end - begin) > kMaxLine) {
        return io_error("protocol error: reply line too long");
      }
      return false;
    }
    if (cr == begin) return io_error("protocol error: a reply line without a type");
    const char type = *begin;
    const std::string_view line(begin + 1, static_cast<std::size_t>(cr - begin - 1));
    in_begin_ += static_cast<std::size_t>(cr - begin) + 2;
    long long number = 0;
    if (type == ':' || type == '$') {
      auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), number);
      if (ec != std::errc{} || ptr != line.data() + line.size()) {
        return io_error("protocol error: bad number in a reply");
      }
    }
    switch (type) {
      case '+':
      case '-':
        out.type = type == '+' ? DataReply::Type::kStatus : DataReply::Type::kError;
        out.text.assign(line);
        out.integer = 0;
        out.in_target = false;
        return true;
      case ':':
        out.type = DataReply::Type::kInteger;
        out.text.clear();
        out.integer = number;
        out.in_target = false;
        return true;
      case '$': {
        if (number < 0) {
          out.type = DataReply::Type::kNil;
          out.text.clear();
          out.integer = 0;
          out.in_target = false;
          return true;
        }
        if (static_cast<unsigned long long>(number) > max_bulk) {
          return io_error("protocol error: a bulk reply of " + std::to_string(number) +
                          " bytes where at most " + std::to_string(max_bulk) + " were expected");
        }
        const auto size = static_cast<std::size_t>(number);
        bulk_dst_ = bulk_target != nullptr ? bulk_target : &bulk_;
        bulk_size_ = size;
        const std::size_t have = std::min(size, in_end_ - in_begin_);
        // Within its capacity: no allocation, no fresh pages; the rest grows as it arrives.
        bulk_dst_->resize(std::max(have, std::min(size, kBulkGrowStep)));
        std::memcpy(bulk_dst_->data(), in_.data() + in_begin_, have);
        in_begin_ += have;
        bulk_have_ = have;
        in_bulk_ = true;
        continue;  // complete already when the buffer held it all
      }
      default:
        return io_error(std::string("protocol error: unexpected reply type '") + type + "'");
    }
  }
}

namespace {

Status setup_error(const std::string& what) {
  return io_error("setup reply: " + what);
}

// One element at bytes[pos...] (depth: arrays above it); `elements` counts every element
// parsed so far. true: complete; false: more bytes needed.
Result<bool> parse_element(std::string_view bytes, std::size_t& pos, SetupReply& out,
                           const SetupLimits& limits, std::size_t depth, std::size_t& elements) {
  if (++elements > limits.max_elements) return setup_error("too many elements");
  const auto crlf = bytes.find("\r\n", pos);
  if (crlf == std::string_view::npos) {
    if (bytes.size() - pos > kMaxLine) return setup_error("line too long");
    return false;
  }
  if (crlf == pos) return setup_error("a line without a type");
  const char type = bytes[pos];
  const std::string_view line = bytes.substr(pos + 1, crlf - pos - 1);
  std::size_t at = crlf + 2;
  long long number = 0;
  if (type == ':' || type == '$' || type == '*') {
    auto [ptr, ec] = std::from_chars(line.data(), line.data() + line.size(), number);
    if (ec != std::errc{} || ptr != line.data() + line.size()) {
      return setup_error("bad number");
    }
  }
  switch (type) {
    case '+':
    case '-':
      out.type = type == '+' ? SetupReply::Type::kStatus : SetupReply::Type::kError;
      out.text.assign(line);
      break;
    case ':':
      out.type = SetupReply::Type::kInteger;
      out.integer = number;
      break;
    case '$':
      if (number < 0) {
        out.type = SetupReply::Type::kNil;
        break;
      }
      if (static_cast<unsigned long long>(number) > limits.max_bytes) {
        return setup_error("bulk longer than the reply may be");
      }
      if (bytes.size() - at < static_cast<std::size_t>(number) + 2) return false;
      if (bytes.substr(at + static_cast<std::size_t>(number), 2) != "\r\n") {
        return setup_error("bulk not ended by CRLF");
      }
      out.type = SetupReply::Type::kBulk;
      out.text.assign(bytes.substr(at, static_cast<std::size_t>(number)));
      at += static_cast<std::size_t>(number) + 2;
      break;
    case '*': {
      if (number < 0) {
        out.type = SetupReply::Type::kNil;
        break;
      }
      if (depth >= limits.max_depth) return setup_error("arrays nested too deep");
      // Each element takes at least 3 bytes ("+\r\n"): a count the bytes cannot hold is
      // refused before anything is allocated for it.
      if (static_cast<unsigned long long>(number) >
          std::min(limits.max_elements, limits.max_bytes / 3)) {
        return setup_error("array of " + std::to_string(number) + " elements");
      }
      out.type = SetupReply::Type::kArray;
      out.elements.clear();
      for (long long i = 0; i < number; ++i) {
        out.elements.emplace_back();
        auto done = parse_element(bytes, at, out.elements.back(), limits, depth + 1, elements);
        if (!done) return done.status();
        if (!*done) return false;
      }
      break;
    }
    default:
      return setup_error(std::string("unexpected reply type '") + type + "'");
  }
  pos = at;
  return true;
}

}  // namespace

Result<bool> parse_setup_reply(std::string_view bytes, std::size_t& pos, SetupReply& out,
                               const SetupLimits& limits) {
  std::size_t elements = 0;
  std::size_t at = pos;
  auto done = parse_element(bytes, at, out, limits, 0, elements);
  if (done.is_ok() && *done) pos = at;
  return done;
}

Result<SetupReply> RedisConnection::command(std::initializer_list<std::string_view> args,
                                            Deadline deadline, const SetupLimits& limits) {
  if (fd_ < 0) return io_error("command on a closed connection");
  append(args);
  std::size_t ignored = 0;
  while (want_write()) {
    if (auto st = write_some(ignored); !st) return st;
    if (want_write() && !wait_fd(fd_, POLLOUT, deadline)) return io_error("write timed out");
  }
  // The reply is parsed from the start each time bytes arrive (linear in what arrived; the
  // deadline and max_bytes bound how often and how much).
  std::string received;
  char buffer[16384];
  while (true) {
    if (!wait_fd(fd_, POLLIN, deadline)) return io_error("reply timed out");
    const ssize_t got = ::read(fd_, buffer, sizeof(buffer));
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got < 0) return io_error(std::string("read failed: ") + std::strerror(errno));
    if (got == 0) return io_error("connection closed by the server");
    if (received.size() + static_cast<std::size_t>(got) > limits.max_bytes) {
      return setup_error("longer than " + std::to_string(limits.max_bytes) + " bytes");
    }
    received.append(buffer, static_cast<std::size_t>(got));
    SetupReply reply;
    std::size_t pos = 0;
    auto done = parse_setup_reply(received, pos, reply, limits);
    if (!done) return done.status();
    if (!*done) continue;
    if (pos != received.size() || idle_input_pending()) {
      return setup_error("bytes after the reply");
    }
    return reply;
  }
}

std::string reply_to_string(const SetupReply& reply, std::size_t max_chars) {
  std::string out;
  switch (reply.type) {
    case SetupReply::Type::kBulk:
    case SetupReply::Type::kStatus:
    case SetupReply::Type::kError:
      out = reply.text;
      break;
    case SetupReply::Type::kInteger:
      out = std::to_string(reply.integer);
      break;
    case SetupReply::Type::kNil:
      out = "(nil)";
      break;
    case SetupReply::Type::kArray:
      for (std::size_t i = 0; i < reply.elements.size() && out.size() < max_chars; ++i) {
        if (i) out += "\n";
        out += reply_to_string(reply.elements[i], max_chars - out.size());
      }
      break;
  }
  if (out.size() > max_chars) out.resize(max_chars);
  return out;
}

}  // namespace radixtier::shared::detail
