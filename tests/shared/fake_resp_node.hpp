// A fake Redis Cluster node on loopback for the tests a real redis-server cannot drive: it
// speaks just enough RESP to be a cluster of one (CLUSTER SLOTS: every slot on itself; AUTH,
// ECHO), and hands every other command (and, when it wants, those too) to the test's handler,
// which answers with any bytes at all: a hostile length, a reply too many, garbage.
//
// One thread serves every connection in turn (poll), until the node is destroyed. A handler
// runs on that thread; what it returns is sent at once (blocking, MSG_NOSIGNAL: a client that
// closed ends the send). Every command received is recorded (commands()).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace radixtier::shared::testing {

inline std::string bulk(std::string_view s) {
  return "$" + std::to_string(s.size()) + "\r\n" + std::string(s) + "\r\n";
}

class FakeRespNode {
 public:
  using Command = std::vector<std::string>;
  /// The raw reply to `cmd`, or nullopt for the default (cluster of one, +OK, ECHO, nil).
  using Handler = std::function<std::optional<std::string>(const Command& cmd)>;

  explicit FakeRespNode(Handler handler = {}, std::string host = "127.0.0.1")
      : host_(std::move(host)), handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, host_.c_str(), &addr.sin_addr);
    addr.sin_port = 0;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(listen_fd_, 64) != 0) {
      throw std::runtime_error("fake node: cannot listen on " + host_);
    }
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (::pipe2(stop_pipe_, O_CLOEXEC) != 0) throw std::runtime_error("fake node: pipe");
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeRespNode() {
    char b = 1;
    (void)!::write(stop_pipe_[1], &b, 1);
    thread_.join();
    ::close(listen_fd_);
    ::close(stop_pipe_[0]);
    ::close(stop_pipe_[1]);
  }
  FakeRespNode(const FakeRespNode&) = delete;
  FakeRespNode& operator=(const FakeRespNode&) = delete;

  /// From a handler: after the answer being built is sent, wait `delay`, then send `bytes`
  /// on the same connection (a reply nobody asked for, arriving late).
  void then_after(std::chrono::milliseconds delay, std::string bytes) {
    later_.push_back({delay, std::move(bytes), nullptr});
  }
  /// From a handler: after the answer, send *bytes (not copied: it must outlive the node).
  void then_send(const std::string* bytes) { later_.push_back({{}, {}, bytes}); }

  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  /// Connections accepted so far.
  int accepted() const { return accepted_.load(); }
  std::vector<Command> commands() const {
    std::lock_guard lock(mu_);
    return commands_;
  }
  /// How many commands received start with `name`.
  std::size_t count(const std::string& name) const {
    std::lock_guard lock(mu_);
    std::size_t n = 0;
    for (const auto& c : commands_) n += !c.empty() && c[0] == name;
    return n;
  }
  /// The CLUSTER SLOTS reply of a cluster of one: every slot at `host` (bulk, or "$-1" for
  /// nil: unknown-endpoint) and this node's port.
  std::string slots_reply(std::optional<std::string> host) const {
    std::string node = "*2\r\n" + (host ? bulk(*host) : std::string("$-1\r\n")) + ":" +
                       std::to_string(port_) + "\r\n";
    return "*1\r\n*3\r\n:0\r\n:16383\r\n" + node;
  }

 private:
  struct Client {
    int fd;
    std::string in;
  };

  // One complete command (an array of bulk strings) from c.in, if there is one.
  static std::optional<Command> parse(std::string& in) {
    std::size_t pos = 0;
    auto line = [&](long long& n, char type) {
      const auto crlf = in.find("\r\n", pos);
      if (crlf == std::string::npos || in[pos] != type) return false;
      std::from_chars(in.data() + pos + 1, in.data() + crlf, n);
      pos = crlf + 2;
      return true;
    };
    long long argc = 0;
    if (in.empty() || !line(argc, '*')) return std::nullopt;
    Command cmd;
    for (long long i = 0; i < argc; ++i) {
      long long len = 0;
      if (pos >= in.size() || !line(len, '$')) return std::nullopt;
      if (in.size() < pos + static_cast<std::size_t>(len) + 2) return std::nullopt;
      cmd.emplace_back(in.substr(pos, static_cast<std::size_t>(len)));
      pos += static_cast<std::size_t>(len) + 2;
    }
    in.erase(0, pos);
    return cmd;
  }

  std::string answer(const Command& cmd) {
    if (handler_) {
      if (auto r = handler_(cmd)) return *r;
    }
    if (cmd.size() >= 2 && cmd[0] == "CLUSTER" && cmd[1] == "SLOTS") return slots_reply(host_);
    if (!cmd.empty() && cmd[0] == "ECHO" && cmd.size() == 2) return bulk(cmd[1]);
    if (!cmd.empty() && (cmd[0] == "AUTH" || cmd[0] == "ASKING" || cmd[0] == "SET")) {
      return "+OK\r\n";
    }
    if (!cmd.empty() && cmd[0] == "EXISTS") return ":0\r\n";
    return "$-1\r\n";
  }

  static void send_all(int fd, const std::string& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;  // the client went away
      done += static_cast<std::size_t>(n);
    }
  }

  void serve() {
    std::vector<Client> clients;
    while (true) {
      std::vector<pollfd> fds{{stop_pipe_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (const auto& c : clients) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;
      if (fds[0].revents) break;
      if (fds[1].revents & POLLIN) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          timeval tv{2, 0};  // a client that stops reading never holds the node for long
          setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
          int one = 1;  // replies go out at once, as redis-server's do
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          clients.push_back({fd, {}});
          ++accepted_;
        }
      }
      for (std::size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Client& c = clients[i - 2];
        char buf[65536];
        const ssize_t n = ::read(c.fd, buf, sizeof(buf));
        if (n <= 0) {
          ::close(c.fd);
          c.fd = -1;
          continue;
        }
        c.in.append(buf, static_cast<std::size_t>(n));
        while (auto cmd = parse(c.in)) {
          {
            std::lock_guard lock(mu_);
            commands_.push_back(*cmd);
          }
          send_all(c.fd, answer(*cmd));
          for (auto& l : later_) {
            std::this_thread::sleep_for(l.delay);
            send_all(c.fd, l.ref != nullptr ? *l.ref : l.bytes);
          }
          later_.clear();
        }
      }
      std::erase_if(clients, [](const Client& c) { return c.fd < 0; });
    }
    for (const auto& c : clients) ::close(c.fd);
  }

  std::string host_;
  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  int stop_pipe_[2] = {-1, -1};
  std::atomic<int> accepted_{0};
  struct Later {
    std::chrono::milliseconds delay{};
    std::string bytes;
    const std::string* ref = nullptr;
  };
  std::vector<Later> later_;  // server thread only
  mutable std::mutex mu_;
  std::vector<Command> commands_;
  std::thread thread_;
};

}  // namespace radixtier::shared::testing
