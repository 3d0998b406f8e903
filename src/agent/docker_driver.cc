// The `docker` runtime driver: each instance is a container named
// sv-<instance id>, driven through the docker CLI.
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/runtime_driver.h"
#include "agent/subprocess.h"
#include "common/status.h"

namespace sv::agent {
namespace {

constexpr absl::Duration kDockerTimeout = absl::Seconds(120);
constexpr char kLabel[] = "sv.instance";

std::string ContainerName(const std::string& id) { return "sv-" + id; }

class DockerDriver final : public RuntimeDriver {
 public:
  explicit DockerDriver(std::string docker) : docker_(std::move(docker)) {}

  std::string Name() const override { return "docker"; }

  absl::Status Start(const RuntimeInstance& instance) override {
    std::vector<std::string> argv = {docker_};
    for (auto& a : DockerRunArgs(instance)) argv.push_back(std::move(a));
    return Run(argv, "docker run");
  }

  absl::Status Stop(const std::string& instance_id) override {
    return Run({docker_, "rm", "-f", ContainerName(instance_id)}, "docker rm");
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
      RuntimeStatus s{f[0].substr(3), f[1] == "running", -1, f[2]};
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
  for (const VolumeMap& v : instance.volumes) {
    args.push_back("-v");
    args.push_back(absl::StrCat(v.source, ":", v.target, v.read_only ? ":ro" : ""));
  }
  args.push_back(instance.image);
  return args;
}

std::unique_ptr<RuntimeDriver> NewDockerDriver(const std::string& docker_path) {
  return std::make_unique<DockerDriver>(docker_path);
}

std::unique_ptr<RuntimeDriver> NewSimulatedDriver() {
  return std::make_unique<SimulatedDriver>();
}

}  // namespace sv::agent
