// A transfer engine for benchmarks: completes every copy at submission, moves no bytes.
#pragma once

#include <string>

#include "radixtier/transfer/transfer_engine.hpp"

namespace radixtier::bench {

class InstantEngine final : public TransferEngine {
 public:
  Result<Ticket> submit(TransferBatch batch) override {
    if (const char* why = batch_shape_error(batch))
      return invalid_argument(std::string("transfer batch rejected: ") + why);
    return Ticket(this, TicketId(next_++));
  }
  TransferState poll(TicketId) override { return TransferState::kDone; }
  TransferState wait(TicketId) override { return TransferState::kDone; }
  void release(TicketId) override {}
  std::size_t slice_pages() const override { return 128; }
  EngineCapacity capacity() const override { return {}; }  // moves no bytes: any pool

 private:
  std::uint32_t next_ = 0;
};

}  // namespace radixtier::bench
