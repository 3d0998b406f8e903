#ifndef SV_SIM_FLEET_H_
#define SV_SIM_FLEET_H_

// A fleet of simulated node agents in one process. Each speaks the real
// agent protocol to svd over gRPC, with the simulated runtime driver and
// simulated GPUs, and suffers the faults of a script (agent/fault_script.h).

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/agent.h"
#include "agent/fault_script.h"
#include "common/clock.h"

namespace sv::sim {

struct SimNode {
  std::string name;
  std::string zone;
  std::string pod;
  std::string leaf_switch;
  int gpu_count = 8;
};

struct FleetOptions {
  std::string endpoint;
  std::vector<SimNode> nodes;
  std::vector<agent::Fault> faults;
  absl::Duration reconnect_backoff_max = absl::Seconds(2);
};

// Gives the credential a node's agent should use, e.g. by minting one.
using CredentialSource = std::function<absl::StatusOr<std::string>(const std::string& node)>;

class SimulatedFleet {
 public:
  SimulatedFleet(FleetOptions options, CredentialSource credentials, const Clock& clock);
  ~SimulatedFleet();

  // Mints the credentials and starts one agent thread per node.
  absl::Status Start();
  void Stop();

 private:
  FleetOptions options_;
  CredentialSource credentials_;
  const Clock& clock_;
  std::vector<std::unique_ptr<agent::Agent>> agents_;
  std::vector<std::thread> threads_;
};

// sim-node-000, sim-node-001, ... spread over leaves and pods as svd --dev
// registers them.
std::vector<SimNode> StandardFleet(int count, int leaves, int pods);

}  // namespace sv::sim

#endif  // SV_SIM_FLEET_H_
