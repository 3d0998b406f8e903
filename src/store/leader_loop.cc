#include "store/leader_loop.h"

#include <utility>

namespace sv::store {

LeaderLoop::LeaderLoop(std::string name, absl::Duration interval, std::function<void()> turn)
    : turn_(std::move(turn)), loop_(std::move(name), interval, [this] {
        LeaderTurn leading(gate_);
        if (leading.ok()) turn_();
      }) {}

}  // namespace sv::store
