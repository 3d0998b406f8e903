// The `docker` runtime driver: each instance is a container named
// sv-<instance id>, driven through the docker CLI.
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/authorized_keys.h"
#include "agent/host_mounts.h"
#include "agent/runtime_driver.h"
#include "agent/subprocess.h"
#include "common/status.h"

namespace sv::agent {
namespace {

constexpr absl::Duration kDockerTimeout = absl::Seconds(120);
constexpr char kLabel[] = "sv.instance";

std::string ContainerName(const std::string& id) { return "sv-" + id; }

// Volumes under /mnt go through HostMounts (hot-pluggable); the others are
// `-v` binds fixed at start.
void SplitVolumes(const std::vector<VolumeMap>& all, std::vector<VolumeMap>* hot,
                  std::vector<VolumeMap>* cold) {
  for (const VolumeMap& v : all) {
    (HostMounts::HotPath(v.target) ? hot : cold)->push_back(v);
  }
}

class DockerDriver final : public RuntimeDriver {
 public:
  DockerDriver(std::string docker, std::string mounts_root, std::string keys_root)
      : docker_(std::move(docker)), keys_(std::move(keys_root)) {
    if (!mounts_root.empty()) hot_ = std::make_unique<HostMounts>(std::move(mounts_root));
  }

  std::string Name() const override { return "docker"; }

  absl::Status Start(const RuntimeInstance& instance) override {
    RuntimeInstance run = instance;
    std::string hot_dir;
    if (hot_) {
      std::vector<VolumeMap> hot;
      run.volumes.clear();
      SplitVolumes(instance.volumes, &hot, &run.volumes);
      SV_ASSIGN_OR_RETURN(hot_dir, hot_->Prepare(instance.instance_id));
      SV_RETURN_IF_ERROR(hot_->Apply(instance.instance_id, hot));
      std::lock_guard<std::mutex> lock(mutex_);
      cold_[instance.instance_id] = run.volumes;
    }
    // An instance started without keys gets no file: the image's own
    // authorized_keys, if any, stay visible.
    if (!instance.authorized_keys.empty()) {
      SV_ASSIGN_OR_RETURN(run.authorized_keys_file,
                          keys_.Write(instance.instance_id, instance.authorized_keys));
    }
    std::vector<std::string> argv = {docker_};
    for (auto& a : DockerRunArgs(run, hot_dir)) argv.push_back(std::move(a));
    absl::Status started = Run(argv, "docker run");
    if (!started.ok() && hot_) (void)hot_->Release(instance.instance_id);
    if (!started.ok()) keys_.Remove(instance.instance_id);
    return started;
  }

  absl::Status SetAuthorizedKeys(const std::string& instance_id,
                                 const std::vector<std::string>& keys) override {
    return keys_.Update(instance_id, keys);
  }

  absl::Status Stop(const std::string& instance_id) override {
    SV_RETURN_IF_ERROR(Run({docker_, "rm", "-f", ContainerName(instance_id)}, "docker rm"));
    keys_.Remove(instance_id);
    if (hot_) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        cold_.erase(instance_id);
      }
      SV_RETURN_IF_ERROR(hot_->Release(instance_id));
    }
    return absl::OkStatus();
  }

  // Volumes under /mnt attach and detach while the container runs (mount
  // propagation, see host_mounts.h). A change to a volume elsewhere needs a
  // restart: then nothing changes and the error says so.
  absl::Status SetVolumes(const std::string& instance_id,
                          const std::vector<VolumeMap>& volumes) override {
    if (!hot_) return RuntimeDriver::SetVolumes(instance_id, volumes);
    std::vector<VolumeMap> hot, cold;
    SplitVolumes(volumes, &hot, &cold);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // After an agent restart the start set is unknown; like the agent,
      // take the running container to have what svd asks for.
      auto [it, unknown] = cold_.try_emplace(instance_id, cold);
      if (!unknown && it->second != cold) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the docker runtime attaches and detaches volumes while an instance runs only "
            "under ", kHotMountTarget, "/; a change to a mount elsewhere applies at the "
            "instance's next start"));
      }
    }
    return hot_->Apply(instance_id, hot);
  }

  absl::StatusOr<std::vector<RuntimeStatus>> List() override {
    auto result = RunCommand({docker_, "ps", "-a", "--filter", absl::StrCat("label=", kLabel),
                              "--format", "{{.Names}}\t{{.State}}\t{{.Status}}"},
                             kDockerTimeout);
    if (!result.ok()) return result.status();
    if (result->exit_code != 0) {
      return Error(absl::StatusCode::kUnavailable, "DOCKER_FAILED",
                   absl::StrCat("docker ps exited with code ", result->exit_code));
    }
    std::vector<RuntimeStatus> list;
    for (absl::string_view line : absl::StrSplit(result->out, '\n', absl::SkipEmpty())) {
      std::vector<std::string> f = absl::StrSplit(line, '\t');
      if (f.size() < 3 || f[0].rfind("sv-", 0) != 0) continue;
      // A paused or restarting container still holds its mounts and will
      // run again: it counts as running (a heartbeat that left it out
      // ended the fences of its volumes, docs/storage.md).
      RuntimeStatus s{f[0].substr(3),
                      f[1] == "running" || f[1] == "paused" || f[1] == "restarting" ||
                          f[1] == "removing",
                      -1, f[2]};
      // "Exited (3) 2 minutes ago" carries the exit code.
      auto open = f[2].find('(');
      auto close = f[2].find(')');
      if (!s.running && open != std::string::npos && close > open) {
        int code = -1;
        if (absl::SimpleAtoi(f[2].substr(open + 1, close - open - 1), &code)) s.exit_code = code;
      }
      list.push_back(std::move(s));
    }
    return list;
  }

 private:
  absl::Status Run(const std::vector<std::string>& argv, const char* what) {
    auto result = RunCommand(argv, kDockerTimeout);
    if (!result.ok()) return result.status();
    if (result->exit_code != 0) {
      return Error(absl::StatusCode::kUnavailable, "DOCKER_FAILED",
                   absl::StrCat(what, " exited with code ", result->exit_code));
    }
    return absl::OkStatus();
  }

  const std::string docker_;
  const AuthorizedKeysFiles keys_;
  std::unique_ptr<HostMounts> hot_;
  std::mutex mutex_;
  std::map<std::string, std::vector<VolumeMap>> cold_;  // `-v` volumes at start
};

class SimulatedDriver final : public RuntimeDriver {
 public:
  std::string Name() const override { return "simulated"; }
  absl::Status Start(const RuntimeInstance& instance) override {
    std::lock_guard<std::mutex> lock(mutex_);
    running_[instance.instance_id] = true;
    volumes_[instance.instance_id] = instance.volumes;
    return absl::OkStatus();
  }
  absl::Status Stop(const std::string& instance_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    running_.erase(instance_id);
    volumes_.erase(instance_id);
    return absl::OkStatus();
  }
  // Records the mounts, as a real runtime would apply them.
  absl::Status SetVolumes(const std::string& instance_id,
                          const std::vector<VolumeMap>& volumes) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!running_.count(instance_id)) {
      return absl::NotFoundError("instance " + instance_id + " does not run here");
    }
    volumes_[instance_id] = volumes;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<RuntimeStatus>> List() override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<RuntimeStatus> list;
    for (const auto& [id, running] : running_) list.push_back({id, running, 0, ""});
    return list;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, bool> running_;
  std::map<std::string, std::vector<VolumeMap>> volumes_;
};

}  // namespace

std::vector<std::string> DockerRunArgs(const RuntimeInstance& instance) {
  return DockerRunArgs(instance, "");
}

std::vector<std::string> DockerRunArgs(const RuntimeInstance& instance,
                                       const std::string& hot_mount_dir) {
  std::vector<std::string> args = {"run", "-d", "--name", ContainerName(instance.instance_id),
                                   "--label", absl::StrCat(kLabel, "=", instance.instance_id)};
  if (!instance.gpu_indices.empty()) {
    // The inner quotes keep docker from splitting the device list at commas.
    args.push_back("--gpus");
    args.push_back(absl::StrCat("\"device=", absl::StrJoin(instance.gpu_indices, ","), "\""));
  }
  for (const PortMap& p : instance.ports) {
    args.push_back("-p");
    args.push_back(absl::StrCat(p.host_port, ":", p.container_port, "/",
                                p.protocol.empty() ? "tcp" : p.protocol));
  }
  if (!hot_mount_dir.empty()) {
    // rslave: mounts made later under the host directory show up inside.
    args.push_back("--mount");
    args.push_back(absl::StrCat("type=bind,source=", hot_mount_dir, ",target=", kHotMountTarget,
                                ",bind-propagation=rslave"));
  }
  for (const VolumeMap& v : instance.volumes) {
    args.push_back("-v");
    args.push_back(absl::StrCat(v.source, ":", v.target, v.read_only ? ":ro" : ""));
  }
  if (!instance.authorized_keys_file.empty()) {
    args.push_back("-v");
    args.push_back(absl::StrCat(instance.authorized_keys_file, ":", kAuthorizedKeysTarget, ":ro"));
  }
  args.push_back(instance.image);
  return args;
}

std::unique_ptr<RuntimeDriver> NewDockerDriver(const std::string& docker_path,
                                               const std::string& hot_mounts_root,
                                               const std::string& ssh_keys_root) {
  return std::make_unique<DockerDriver>(docker_path, hot_mounts_root, ssh_keys_root);
}

std::unique_ptr<RuntimeDriver> NewSimulatedDriver() {
  return std::make_unique<SimulatedDriver>();
}

}  // namespace sv::agent
