#ifndef SV_AGENT_HOST_MOUNTS_H_
#define SV_AGENT_HOST_MOUNTS_H_

// Hot attach and detach for container runtimes, through mount propagation.
//
// A container's mounts are fixed when it starts, so a volume cannot be added
// to a running container directly. Instead each instance gets a host
// directory <root>/<instance id>, made a shared mount point, which the
// container binds at /mnt with rslave propagation. A volume whose target is
// /mnt/<path> is bind-mounted on the host at <root>/<instance id>/<path>;
// the mount propagates into the container, where it appears (and, after an
// unmount on the host, disappears) while the container runs.
//
//   host                                     container
//   /var/lib/sv/volumes/<vol> --bind--> <root>/<id>/data  ==rslave==>  /mnt/data
//
// Targets outside /mnt still work, but only from the container's start.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/runtime_driver.h"

namespace sv::agent {

inline constexpr char kHotMountTarget[] = "/mnt";

class HostMounts {
 public:
  explicit HostMounts(std::string root) : root_(std::move(root)) {}

  // "/mnt/data/x" -> "data/x"; nullopt for a target not strictly under /mnt
  // or with "." or ".." components.
  static std::optional<std::string> HotPath(const std::string& target);

  // The instance's directory, created and made a shared mount point.
  absl::StatusOr<std::string> Prepare(const std::string& instance_id);

  // Makes the mounts under the instance's directory exactly `hot` (volumes
  // whose targets HotPath accepts; others are an InvalidArgument error and
  // nothing changes). Unmounts what is no longer wanted first, deepest
  // first; on a failed mount, undoes the mounts it made in this call.
  absl::Status Apply(const std::string& instance_id, const std::vector<VolumeMap>& hot);

  // Unmounts everything under the instance's directory and removes it.
  absl::Status Release(const std::string& instance_id);

  // Mount points under the instance's directory, from /proc/self/mountinfo,
  // relative to it ("" is the directory itself).
  std::vector<std::string> MountedPaths(const std::string& instance_id) const;

  std::string DirOf(const std::string& instance_id) const { return root_ + "/" + instance_id; }

 private:
  // Binds the volume on `path` (a /proc/self/fd path of the opened
  // target; `shown` names it in errors).
  absl::Status BindInto(const VolumeMap& v, const std::string& path, const std::string& shown);

  const std::string root_;
  std::mutex mutex_;
  uint64_t staging_seq_ = 0;
  // What this process mounted, per instance: relative path -> volume.
  std::map<std::string, std::map<std::string, VolumeMap>> mounted_;
};

}  // namespace sv::agent

#endif  // SV_AGENT_HOST_MOUNTS_H_
