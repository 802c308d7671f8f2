// Strong id types: a GPU page id cannot be passed where a host page id is expected.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>

namespace radixtier {

template <class Tag>
class StrongId {
 public:
  using value_type = std::uint32_t;
  static constexpr value_type kInvalid = std::numeric_limits<value_type>::max();

  constexpr StrongId() = default;
  constexpr explicit StrongId(value_type v) : v_(v) {}

  constexpr value_type value() const { return v_; }
  constexpr bool valid() const { return v_ != kInvalid; }
  constexpr explicit operator bool() const { return valid(); }
  constexpr auto operator<=>(const StrongId&) const = default;

  friend std::ostream& operator<<(std::ostream& os, StrongId id) {
    return id.valid() ? os << Tag::kName << '#' << id.v_ : os << Tag::kName << "#none";
  }

 private:
  value_type v_ = kInvalid;
};

struct GpuPageTag {
  static constexpr const char* kName = "gpu_page";
};
struct HostPageTag {
  static constexpr const char* kName = "host_page";
};
struct GpuSlotTag {
  static constexpr const char* kName = "gpu_snapshot_slot";
};
struct HostSlotTag {
  static constexpr const char* kName = "host_snapshot_slot";
};
struct LockTag {
  static constexpr const char* kName = "lock";
};
struct TicketTag {
  static constexpr const char* kName = "ticket";
};
struct NamespaceTag {
  static constexpr const char* kName = "namespace";
};
struct PinTag {
  static constexpr const char* kName = "pin";
};

using GpuPageId = StrongId<GpuPageTag>;    ///< a page of the GPU KV pool
using HostPageId = StrongId<HostPageTag>;  ///< a page of the pinned host KV pool
using GpuSlotId = StrongId<GpuSlotTag>;    ///< a GPU snapshot slot
using HostSlotId = StrongId<HostSlotTag>;  ///< a host snapshot slot
using LockId = StrongId<LockTag>;          ///< a running request's lock on its path
using TicketId = StrongId<TicketTag>;      ///< an async transfer (or a set of them)
/// A key namespace (LoRA adapter, cache salt, tenant): requests of two namespaces never share
/// KV or snapshots, whatever their tokens (docs/architecture.md, "Key namespaces").
using NamespaceId = StrongId<NamespaceTag>;
using PinId = StrongId<PinTag>;  ///< an operator's host-only pin of a prefix

/// The namespace of every request that names none (existing callers).
inline constexpr NamespaceId kDefaultNamespace{0};

using Token = std::int32_t;

}  // namespace radixtier

template <class Tag>
struct std::hash<radixtier::StrongId<Tag>> {
  std::size_t operator()(radixtier::StrongId<Tag> id) const noexcept {
    return std::hash<std::uint32_t>{}(id.value());
  }
};
