#ifndef SV_STORE_LEADER_LOOP_H_
#define SV_STORE_LEADER_LOOP_H_

// The shape of svd's leader-only loops (billing, SLA judgement, tenant
// stops, webhooks): a PeriodicLoop whose every turn runs inside a
// LeaderTurn, so only while this replica leads and fenced with its epoch.

#include <functional>
#include <string>

#include "absl/time/time.h"
#include "common/periodic_loop.h"
#include "store/database.h"

namespace sv::store {

class LeaderLoop {
 public:
  LeaderLoop(std::string name, absl::Duration interval, std::function<void()> turn);
  // Without a gate every turn runs (tools, library tests). Before Start().
  void SetLeaderGate(const LeaderGate* gate) { gate_ = gate; }
  void Start() { loop_.Start(); }
  void Stop() { loop_.Stop(); }

 private:
  const LeaderGate* gate_ = nullptr;
  std::function<void()> turn_;
  PeriodicLoop loop_;
};

}  // namespace sv::store

#endif  // SV_STORE_LEADER_LOOP_H_
