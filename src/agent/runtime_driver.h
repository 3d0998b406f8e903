#ifndef SV_AGENT_RUNTIME_DRIVER_H_
#define SV_AGENT_RUNTIME_DRIVER_H_

// How svagent runs instances on its node. One driver per agent; see
// docs/agent.md for adding a containerd or VM driver.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sv::agent {

struct PortMap {
  int host_port = 0;
  int container_port = 0;
  std::string protocol = "tcp";
};

struct VolumeMap {
  std::string source;
  std::string target;
  bool read_only = false;
  std::string volume_id;  // Empty for a public library mount.
  bool operator==(const VolumeMap&) const = default;
};

// Everything a driver needs to start one instance on this node.
struct RuntimeInstance {
  std::string instance_id;
  std::vector<int> gpu_indices;
  std::string image;
  std::vector<VolumeMap> volumes;
  std::vector<PortMap> ports;
  int64_t run = 0;  // svd's start number; a new one means restart.
  // svd's, not the runtime's: svd needs no more start confirmations of it.
  bool confirmed = false;
  // The tenant's SSH public keys (agent/authorized_keys.h); and, set by the
  // driver that wrote them, the file to bind at /root/.ssh/authorized_keys.
  std::vector<std::string> authorized_keys;
  std::string authorized_keys_file;
};

// What the runtime says about an instance it knows.
struct RuntimeStatus {
  std::string instance_id;
  bool running = false;
  int exit_code = 0;   // Meaningful when !running; -1 when unknown.
  std::string detail;  // e.g. "exited with code 3".
};

class RuntimeDriver {
 public:
  virtual ~RuntimeDriver() = default;
  virtual std::string Name() const = 0;
  // Starts the instance; starting one that already runs is a no-op.
  virtual absl::Status Start(const RuntimeInstance& instance) = 0;
  // Stops and forgets the instance; stopping an unknown one is a no-op.
  virtual absl::Status Stop(const std::string& instance_id) = 0;
  // Every instance the runtime knows, including ones that ended by
  // themselves and were not yet stopped (forgotten) through Stop().
  virtual absl::StatusOr<std::vector<RuntimeStatus>> List() = 0;
  // Makes the running instance's authorized_keys exactly `keys`. A driver
  // with no such file says why (FAILED_PRECONDITION); the keys then apply
  // at the instance's next start.
  virtual absl::Status SetAuthorizedKeys(const std::string& instance_id,
                                         const std::vector<std::string>& keys) {
    (void)instance_id;
    (void)keys;
    return absl::OkStatus();
  }
  // Hot attach/detach: makes the running instance's mounts exactly
  // `volumes`. A runtime that cannot change the mounts of a running
  // instance says so (FAILED_PRECONDITION); svd then shows the reason and
  // the change applies at the instance's next start.
  virtual absl::Status SetVolumes(const std::string& instance_id,
                                  const std::vector<VolumeMap>& volumes) {
    (void)instance_id;
    (void)volumes;
    return absl::FailedPreconditionError(
        "the " + Name() + " runtime cannot change the mounts of a running instance; "
        "stop and start it to apply");
  }
};

// Runs each instance as a local process group: `/bin/sh -c command` with
// SV_INSTANCE_ID, SV_GPU_INDICES, SV_IMAGE and CUDA_VISIBLE_DEVICES set (and
// SV_SSH_AUTHORIZED_KEYS_FILE when it has SSH keys). Pid files under
// `state_dir` let a restarted agent find what still runs.
std::unique_ptr<RuntimeDriver> NewProcessDriver(const std::string& state_dir,
                                                const std::string& command);

// Runs each instance as a container through the docker CLI at `docker_path`.
// With `hot_mounts_root` (e.g. /var/lib/sv/instance-mounts), volumes under
// /mnt attach and detach while the container runs (agent/host_mounts.h);
// empty: every volume is bound at start only.
// Instances started with SSH keys get their authorized_keys file from
// under `ssh_keys_root` (agent/authorized_keys.h).
std::unique_ptr<RuntimeDriver> NewDockerDriver(const std::string& docker_path,
                                               const std::string& hot_mounts_root = "",
                                               const std::string& ssh_keys_root =
                                                   "/var/lib/sv/ssh-keys");

// Keeps instances in memory only; used by simulated agents.
std::unique_ptr<RuntimeDriver> NewSimulatedDriver();

// The argv of `docker run` for an instance (without the program name).
std::vector<std::string> DockerRunArgs(const RuntimeInstance& instance);
// The same, with `hot_mount_dir` bound at /mnt with rslave propagation
// (HostMounts); the instance's volumes are then only the `-v` ones.
std::vector<std::string> DockerRunArgs(const RuntimeInstance& instance,
                                       const std::string& hot_mount_dir);

}  // namespace sv::agent

#endif  // SV_AGENT_RUNTIME_DRIVER_H_
