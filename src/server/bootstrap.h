#ifndef SV_SERVER_BOOTSTRAP_H_
#define SV_SERVER_BOOTSTRAP_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "store/store.h"

namespace sv::server {

// Reads an API key from `path`, or generates one and writes it there (0600).
// Then makes sure the key is registered for `email` in tenant `tenant_name`.
absl::StatusOr<std::string> EnsureKeyFromFile(store::Store& store, const Clock& clock,
                                              const std::string& path,
                                              const std::string& tenant_name,
                                              const std::string& email, store::Role role);

// Registers `count` simulated 8-GPU RTX 4090 nodes named sim-node-NNN,
// spread evenly over `leaves` leaf switches and `pods` pods.
absl::Status RegisterSimulatedFleet(store::Store& store, const Clock& clock, int count,
                                    int leaves, int pods);

// Writes svctl's config with the endpoint and the keys, unless a config not
// written by svd --dev is already there (then it is left alone and a
// warning says so).
absl::Status WriteSvctlConfig(const std::string& path, const std::string& endpoint,
                              const std::string& token, const std::string& admin_token);

std::string DefaultSvctlConfigPath();

}  // namespace sv::server

#endif  // SV_SERVER_BOOTSTRAP_H_
