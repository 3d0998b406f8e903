#include "sim/fleet.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace sv::sim {

SimulatedFleet::SimulatedFleet(FleetOptions options, CredentialSource credentials,
                               const Clock& clock)
    : options_(std::move(options)), credentials_(std::move(credentials)), clock_(clock) {}

SimulatedFleet::~SimulatedFleet() { Stop(); }

absl::Status SimulatedFleet::Start() {
  const absl::Time epoch = clock_.Now();
  uint32_t seed = 1;
  for (const SimNode& node : options_.nodes) {
    auto credential = credentials_(node.name);
    if (!credential.ok()) return credential.status();
    agent::AgentOptions o;
    o.endpoint = options_.endpoint;
    o.credential = *credential;
    o.node_name = node.name;
    o.zone = node.zone;
    o.pod = node.pod;
    o.leaf_switch = node.leaf_switch;
    o.gpu_count = node.gpu_count;
    o.simulated = true;
    o.reconnect_backoff_max = options_.reconnect_backoff_max;
    o.faults = options_.faults;
    o.fault_epoch = epoch;
    agents_.push_back(std::make_unique<agent::Agent>(
        o, agent::NewSimulatedDriver(),
        std::make_unique<agent::SimulatedTelemetry>(node.gpu_count, seed++), clock_));
  }
  for (auto& a : agents_) threads_.emplace_back([agent = a.get()] { agent->Run(); });
  spdlog::info("sim: {} simulated agent(s) connecting to {} ({} scripted fault(s))",
               agents_.size(), options_.endpoint, options_.faults.size());
  return absl::OkStatus();
}

void SimulatedFleet::Stop() {
  for (auto& a : agents_) a->Stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

std::vector<SimNode> StandardFleet(int count, int leaves, int pods) {
  leaves = std::max(1, leaves);
  pods = std::max(1, std::min(pods, leaves));
  const int per_leaf = std::max(1, (count + leaves - 1) / leaves);
  const int leaves_per_pod = (leaves + pods - 1) / pods;
  std::vector<SimNode> nodes;
  for (int i = 0; i < count; ++i) {
    const int leaf = i / per_leaf;
    nodes.push_back({absl::StrFormat("sim-node-%03d", i), "sim-zone-a",
                     absl::StrCat("pod-", leaf / leaves_per_pod), absl::StrCat("leaf-", leaf),
                     8});
  }
  return nodes;
}

}  // namespace sv::sim
