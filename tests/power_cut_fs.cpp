#include "power_cut_fs.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "radixtier/disk/io_engine.hpp"

namespace radixtier::disk::testing {

namespace {

constexpr std::size_t kSector = 512;

/// The store's I/O engine as the model sees it: each write is recorded when it is submitted
/// (the store syncs only after its writes completed, so the moment inside that window does
/// not change which images are possible).
class ObservedEngine final : public DiskIoEngine {
 public:
  ObservedEngine(std::unique_ptr<DiskIoEngine> inner, PowerCutFs& fs)
      : inner_(std::move(inner)), fs_(fs) {}
  Result<IoTicket> submit(std::vector<IoOp> ops) override {
    std::vector<IoOp> writes;
    for (const IoOp& op : ops) {
      if (op.kind == IoOp::Kind::kWrite) writes.push_back(op);
    }
    auto ticket = inner_->submit(std::move(ops));
    if (!ticket) return ticket;
    for (const IoOp& w : writes) fs_.note_write(w.fd, w.buffer, w.length, w.offset);
    // The ticket names the inner engine: poll/wait/release go to it directly.
    return ticket;
  }
  IoState poll(std::uint64_t t) override { return inner_->poll(t); }
  Status wait(std::uint64_t t) override { return inner_->wait(t); }
  void release(std::uint64_t t) override { inner_->release(t); }
  IoEngineKind kind() const override { return inner_->kind(); }
  const char* name() const override { return inner_->name(); }
  IoEngineStats stats() const override { return inner_->stats(); }

 private:
  std::unique_ptr<DiskIoEngine> inner_;
  PowerCutFs& fs_;
};

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  if (!raw.empty()) std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

void write_file(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write the crash image file " + path);
}

class UnsyncedFs final : public FileSystem {
 public:
  int open(const char* path, int flags, mode_t mode) override {
    return posix().open(path, flags, mode);
  }
  int close(int fd) override { return posix().close(fd); }
  ssize_t pwrite(int fd, const void* src, std::size_t n, off_t offset) override {
    return posix().pwrite(fd, src, n, offset);
  }
  ssize_t pread(int fd, void* dst, std::size_t n, off_t offset) override {
    return posix().pread(fd, dst, n, offset);
  }
  int fdatasync(int) override { return 0; }
  int fsync(int) override { return 0; }
  int ftruncate(int fd, off_t size) override { return posix().ftruncate(fd, size); }
  int fstat(int fd, struct stat* st) override { return posix().fstat(fd, st); }
  int stat(const char* path, struct stat* st) override { return posix().stat(path, st); }
  int rename(const char* from, const char* to) override { return posix().rename(from, to); }
  int unlink(const char* path) override { return posix().unlink(path); }
  int mkdir(const char* path, mode_t mode) override { return posix().mkdir(path, mode); }
  int flock(int fd, int operation) override { return posix().flock(fd, operation); }
  std::unique_ptr<DiskIoEngine> observe(std::unique_ptr<DiskIoEngine> engine) override {
    return engine;
  }

 private:
  static FileSystem& posix() { return posix_file_system(); }
};

}  // namespace

std::shared_ptr<FileSystem> unsynced_file_system() {
  static const auto fs = std::make_shared<UnsyncedFs>();
  return fs;
}

// ---------------------------------------------------------------------------------------
// recording

PowerCutFs::PowerCutFs(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  add_node(true);
  scan(0, root_);
}

PowerCutFs::Ino PowerCutFs::add_node(bool dir) {
  initial_.emplace_back();
  initial_.back().dir = dir;
  is_dir_.push_back(dir);
  name_of_.emplace_back();
  live_entries_.emplace_back();
  return static_cast<Ino>(initial_.size() - 1);
}

void PowerCutFs::scan(Ino dir, const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) throw std::runtime_error("PowerCutFs: cannot list " + path);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  for (const std::string& name : names) {
    const std::string child = path + "/" + name;
    struct stat st {};
    if (::lstat(child.c_str(), &st) != 0) continue;
    const bool is_dir = S_ISDIR(st.st_mode);
    const Ino ino = add_node(is_dir);
    initial_[dir].entries[name] = ino;
    name_of_[ino] = name;
    live_entries_[dir][name] = ino;
    if (is_dir) {
      scan(ino, child);
    } else {
      initial_[ino].content = read_file(child);
    }
  }
}

PowerCutFs::Where PowerCutFs::resolve(const char* path) const {
  Where w;
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (p == root_) {
    w.inside = true;
    w.exists = true;
    w.ino = 0;
    return w;
  }
  if (p.size() <= root_.size() || p.compare(0, root_.size(), root_) != 0 ||
      p[root_.size()] != '/') {
    return w;
  }
  Ino dir = 0;
  std::size_t at = root_.size() + 1;
  for (;;) {
    const std::size_t slash = p.find('/', at);
    const std::string part = p.substr(at, slash == std::string::npos ? slash : slash - at);
    if (slash == std::string::npos) {
      w.inside = true;
      w.dir = dir;
      w.leaf = part;
      auto it = live_entries_[dir].find(part);
      w.exists = it != live_entries_[dir].end();
      if (w.exists) w.ino = it->second;
      return w;
    }
    auto it = live_entries_[dir].find(part);
    if (it == live_entries_[dir].end() || !is_dir_[it->second]) return Where{};  // not modelled
    dir = it->second;
    at = slash + 1;
  }
}

void PowerCutFs::record(Op op) {
  log_.push_back(std::move(op));
}

int PowerCutFs::open(const char* path, int flags, mode_t mode) {
  std::lock_guard lock(mu_);
  const Where w = resolve(path);
  const int fd = ::open(path, flags, mode);
  if (fd < 0 || !w.inside) return fd;
  Ino ino = w.ino;
  if (!w.exists) {  // O_CREAT made it
    ino = add_node(false);
    live_entries_[w.dir][w.leaf] = ino;
    name_of_[ino] = w.leaf;
    Op op;
    op.kind = Op::Kind::kCreate;
    op.ino = ino;
    op.dir = w.dir;
    op.name = w.leaf;
    record(std::move(op));
  } else if ((flags & O_TRUNC) != 0 && !is_dir_[ino]) {
    Op op;
    op.kind = Op::Kind::kTruncate;
    op.ino = ino;
    op.offset = 0;
    record(std::move(op));
  }
  fds_[fd] = ino;
  return fd;
}

int PowerCutFs::close(int fd) {
  std::lock_guard lock(mu_);
  fds_.erase(fd);
  return ::close(fd);
}

void PowerCutFs::note_write(int fd, const void* src, std::size_t n, std::uint64_t offset) {
  std::lock_guard lock(mu_);
  auto it = fds_.find(fd);
  if (it == fds_.end() || n == 0) return;
  Op op;
  op.kind = Op::Kind::kWrite;
  op.ino = it->second;
  op.offset = offset;
  const auto* p = static_cast<const std::byte*>(src);
  op.bytes.assign(p, p + n);
  record(std::move(op));
}

ssize_t PowerCutFs::pwrite(int fd, const void* src, std::size_t n, off_t offset) {
  const ssize_t w = ::pwrite(fd, src, n, offset);
  if (w > 0) note_write(fd, src, static_cast<std::size_t>(w), static_cast<std::uint64_t>(offset));
  return w;
}

ssize_t PowerCutFs::pread(int fd, void* dst, std::size_t n, off_t offset) {
  return ::pread(fd, dst, n, offset);
}

int PowerCutFs::fdatasync(int fd) {
  return fsync(fd);
}

int PowerCutFs::fsync(int fd) {
  std::lock_guard lock(mu_);
  // The model decides what is durable; the kernel's fsync would only slow the test down.
  auto it = fds_.find(fd);
  const int r = it != fds_.end() ? 0 : ::fsync(fd);
  if (r == 0 && it != fds_.end()) {
    Op op;
    op.kind = Op::Kind::kSync;
    op.ino = it->second;
    record(std::move(op));
  }
  return r;
}

int PowerCutFs::ftruncate(int fd, off_t size) {
  std::lock_guard lock(mu_);
  const int r = ::ftruncate(fd, size);
  auto it = fds_.find(fd);
  if (r == 0 && it != fds_.end()) {
    Op op;
    op.kind = Op::Kind::kTruncate;
    op.ino = it->second;
    op.offset = static_cast<std::uint64_t>(size);
    record(std::move(op));
  }
  return r;
}

int PowerCutFs::fstat(int fd, struct stat* st) {
  return ::fstat(fd, st);
}

int PowerCutFs::stat(const char* path, struct stat* st) {
  return ::stat(path, st);
}

int PowerCutFs::rename(const char* from, const char* to) {
  std::lock_guard lock(mu_);
  const Where a = resolve(from), b = resolve(to);
  const int r = ::rename(from, to);
  if (r != 0 || !a.inside || !a.exists || !b.inside) return r;
  live_entries_[a.dir].erase(a.leaf);
  live_entries_[b.dir][b.leaf] = a.ino;
  name_of_[a.ino] = b.leaf;
  Op op;
  op.kind = Op::Kind::kRename;
  op.ino = a.ino;
  op.dir = a.dir;
  op.name = a.leaf;
  op.to_dir = b.dir;
  op.to_name = b.leaf;
  record(std::move(op));
  return r;
}

int PowerCutFs::unlink(const char* path) {
  std::lock_guard lock(mu_);
  const Where w = resolve(path);
  const int r = ::unlink(path);
  if (r != 0 || !w.inside || !w.exists) return r;
  live_entries_[w.dir].erase(w.leaf);
  Op op;
  op.kind = Op::Kind::kUnlink;
  op.dir = w.dir;
  op.name = w.leaf;
  record(std::move(op));
  return r;
}

int PowerCutFs::mkdir(const char* path, mode_t mode) {
  std::lock_guard lock(mu_);
  const Where w = resolve(path);
  const int r = ::mkdir(path, mode);
  if (r != 0 || !w.inside) return r;
  const Ino ino = add_node(true);
  live_entries_[w.dir][w.leaf] = ino;
  Op op;
  op.kind = Op::Kind::kCreate;
  op.ino = ino;
  op.dir = w.dir;
  op.name = w.leaf;
  op.is_dir = true;
  record(std::move(op));
  return r;
}

int PowerCutFs::flock(int fd, int operation) {
  return ::flock(fd, operation);
}

std::unique_ptr<DiskIoEngine> PowerCutFs::observe(std::unique_ptr<DiskIoEngine> engine) {
  return std::make_unique<ObservedEngine>(std::move(engine), *this);
}

std::size_t PowerCutFs::operations() const {
  std::lock_guard lock(mu_);
  return log_.size();
}

std::vector<std::size_t> PowerCutFs::cuts_after_writes_to(const std::string& name) const {
  std::lock_guard lock(mu_);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < log_.size(); ++i) {
    if (log_[i].kind == Op::Kind::kWrite && name_of_[log_[i].ino] == name) out.push_back(i + 1);
  }
  return out;
}

std::string PowerCutFs::describe(std::size_t i) const {
  std::lock_guard lock(mu_);
  if (i >= log_.size()) return "(end)";
  const Op& op = log_[i];
  std::string out;
  auto put = [&](std::initializer_list<std::string> parts) {
    for (const std::string& p : parts) out += p;
    return out;
  };
  const std::string ino = std::to_string(op.ino);
  switch (op.kind) {
    case Op::Kind::kCreate:
      return put({op.is_dir ? "mkdir " : "create ", op.name, " #", ino});
    case Op::Kind::kWrite:
      return put(
          {"write #", ino, " @", std::to_string(op.offset), " +", std::to_string(op.bytes.size())});
    case Op::Kind::kTruncate:
      return put({"truncate #", ino, " to ", std::to_string(op.offset)});
    case Op::Kind::kSync:
      return put({"fsync #", ino});
    case Op::Kind::kRename:
      return put({"rename ", op.name, " -> ", op.to_name});
    case Op::Kind::kUnlink:
      return put({"unlink ", op.name});
  }
  return "?";
}

// ---------------------------------------------------------------------------------------
// crash images

/// The state after a prefix of the log: per node its current and durable contents and
/// what came after its last (honoured) fsync.
struct PowerCutFs::Replay {
  struct Node {
    bool dir = false;
    std::vector<std::byte> durable;
    std::vector<const Op*> pending;  ///< file: writes and truncations; dir: entry changes
    std::map<std::string, Ino> entries, durable_entries;
    std::uint64_t size = 0;  ///< current size (files)
  };
  std::vector<Node> nodes;
};

namespace {

void apply_to(std::vector<std::byte>& content, std::uint64_t kind_truncate, std::uint64_t offset,
              const std::vector<std::byte>& bytes) {
  if (kind_truncate != 0) {
    content.resize(offset);
    return;
  }
  if (content.size() < offset + bytes.size()) content.resize(offset + bytes.size());
  std::copy(bytes.begin(), bytes.end(), content.begin() + static_cast<std::ptrdiff_t>(offset));
}

}  // namespace

void PowerCutFs::write_image(std::size_t cut, const CutOptions& options, std::mt19937_64& rng,
                             const std::string& image_root) const {
  std::lock_guard lock(mu_);
  Replay r;
  r.nodes.resize(initial_.size());
  for (Ino i = 0; i < initial_.size(); ++i) {
    Replay::Node& n = r.nodes[i];
    n.dir = initial_[i].dir;
    n.durable = initial_[i].content;
    n.size = n.durable.size();
    n.entries = n.durable_entries = initial_[i].entries;
  }
  cut = std::min(cut, log_.size());
  for (std::size_t i = 0; i < cut; ++i) {
    const Op& op = log_[i];
    switch (op.kind) {
      case Op::Kind::kCreate:
        r.nodes[op.dir].entries[op.name] = op.ino;
        r.nodes[op.dir].pending.push_back(&op);
        break;
      case Op::Kind::kWrite:
        r.nodes[op.ino].size = std::max(r.nodes[op.ino].size, op.offset + op.bytes.size());
        r.nodes[op.ino].pending.push_back(&op);
        break;
      case Op::Kind::kTruncate:
        r.nodes[op.ino].size = op.offset;
        r.nodes[op.ino].pending.push_back(&op);
        break;
      case Op::Kind::kRename:
        r.nodes[op.dir].entries.erase(op.name);
        r.nodes[op.to_dir].entries[op.to_name] = op.ino;
        r.nodes[op.dir].pending.push_back(&op);
        if (op.to_dir != op.dir) r.nodes[op.to_dir].pending.push_back(&op);
        break;
      case Op::Kind::kUnlink:
        r.nodes[op.dir].entries.erase(op.name);
        r.nodes[op.dir].pending.push_back(&op);
        break;
      case Op::Kind::kSync: {
        if (options.lying_disk && rng() % 2 == 0) break;  // the disk said yes and did not
        Replay::Node& n = r.nodes[op.ino];
        if (n.dir) {
          n.durable_entries = n.entries;
        } else {
          for (const Op* p : n.pending) {
            apply_to(n.durable, p->kind == Op::Kind::kTruncate, p->offset, p->bytes);
          }
        }
        n.pending.clear();
        break;
      }
    }
  }
  auto draw = [&](std::size_t n) -> std::size_t {
    if (options.mode == CutMode::kDurableOnly || n == 0) return 0;
    return static_cast<std::size_t>(rng() % (n + 1));
  };
  auto file_image = [&](const Replay::Node& n) {
    std::vector<std::byte> out = n.durable;
    const std::size_t k = draw(n.pending.size());
    if (options.mode != CutMode::kSectors) {
      for (std::size_t i = 0; i < k; ++i) {
        const Op* p = n.pending[i];
        apply_to(out, p->kind == Op::Kind::kTruncate, p->offset, p->bytes);
      }
      return out;
    }
    // The size after a random prefix; each sector's bytes after its own random prefix.
    std::uint64_t size = out.size();
    for (std::size_t i = 0; i < k; ++i) {
      const Op* p = n.pending[i];
      size = p->kind == Op::Kind::kTruncate
                 ? p->offset
                 : std::max<std::uint64_t>(size, p->offset + p->bytes.size());
    }
    std::vector<std::byte> img(size);
    for (std::uint64_t s = 0; s < size; s += kSector) {
      const std::uint64_t end = std::min<std::uint64_t>(size, s + kSector);
      std::vector<std::byte> sector(end - s);
      std::uint64_t valid = out.size() > s ? std::min<std::uint64_t>(out.size(), end) - s : 0;
      std::copy_n(out.begin() + static_cast<std::ptrdiff_t>(s), valid, sector.begin());
      const std::size_t j = draw(n.pending.size());
      for (std::size_t i = 0; i < j; ++i) {
        const Op* p = n.pending[i];
        if (p->kind == Op::Kind::kTruncate) {
          if (p->offset < end) {
            const std::uint64_t from = p->offset > s ? p->offset - s : 0;
            std::fill(sector.begin() + static_cast<std::ptrdiff_t>(from), sector.end(),
                      std::byte{0});
          }
          continue;
        }
        const std::uint64_t lo = std::max<std::uint64_t>(s, p->offset);
        const std::uint64_t hi = std::min<std::uint64_t>(end, p->offset + p->bytes.size());
        if (lo < hi)
          std::memcpy(sector.data() + (lo - s), p->bytes.data() + (lo - p->offset), hi - lo);
      }
      std::copy(sector.begin(), sector.end(), img.begin() + static_cast<std::ptrdiff_t>(s));
    }
    return img;
  };
  // Directories: the durable entries, then a prefix of the changes since.
  std::vector<std::pair<Ino, std::string>> stack{{0, image_root}};
  while (!stack.empty()) {
    const auto [ino, path] = stack.back();
    stack.pop_back();
    const Replay::Node& d = r.nodes[ino];
    std::map<std::string, Ino> entries = d.durable_entries;
    const std::size_t k = draw(d.pending.size());
    for (std::size_t i = 0; i < k; ++i) {
      const Op* p = d.pending[i];
      if (p->kind == Op::Kind::kCreate) {
        entries[p->name] = p->ino;
      } else if (p->kind == Op::Kind::kUnlink) {
        entries.erase(p->name);
      } else if (p->kind == Op::Kind::kRename) {
        if (p->dir == ino) entries.erase(p->name);
        if (p->to_dir == ino) entries[p->to_name] = p->ino;
      }
    }
    for (const auto& [name, child] : entries) {
      const std::string child_path = path + "/" + name;
      if (r.nodes[child].dir) {
        if (::mkdir(child_path.c_str(), 0755) != 0) {
          throw std::runtime_error("cannot make the crash image directory " + child_path);
        }
        stack.push_back({child, child_path});
      } else {
        write_file(child_path, file_image(r.nodes[child]));
      }
    }
  }
}

}  // namespace radixtier::disk::testing
