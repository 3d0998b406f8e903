// The `process` runtime driver: each instance is a local process group.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/authorized_keys.h"
#include "agent/runtime_driver.h"
#include "common/status.h"

namespace sv::agent {
namespace {

namespace fs = std::filesystem;
constexpr absl::Duration kStopGrace = absl::Seconds(5);

class ProcessDriver final : public RuntimeDriver {
 public:
  ProcessDriver(std::string state_dir, std::string command)
      : dir_(std::move(state_dir)), command_(std::move(command)), keys_(dir_ + "/ssh-keys") {
    std::error_code ignored;
    fs::create_directories(dir_, ignored);
  }

  std::string Name() const override { return "process"; }

  absl::Status Start(const RuntimeInstance& instance) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (ReadPid(instance.instance_id) > 0 && Alive(instance.instance_id)) {
      return absl::OkStatus();
    }
    exited_.erase(instance.instance_id);
    const std::string gpus = absl::StrJoin(instance.gpu_indices, ",");
    std::vector<std::string> env = {
        "SV_INSTANCE_ID=" + instance.instance_id, "SV_GPU_INDICES=" + gpus,
        "CUDA_VISIBLE_DEVICES=" + gpus, "SV_IMAGE=" + instance.image,
        "PATH=/usr/local/bin:/usr/bin:/bin"};
    if (!instance.authorized_keys.empty()) {
      SV_ASSIGN_OR_RETURN(std::string keys,
                          keys_.Write(instance.instance_id, instance.authorized_keys));
      env.push_back("SV_SSH_AUTHORIZED_KEYS_FILE=" + keys);
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string log = PathOf(instance.instance_id, ".log");
    pid_t pid = fork();
    if (pid < 0) return Error(absl::StatusCode::kUnavailable, "FORK_FAILED", "cannot fork");
    if (pid == 0) {
      // Its own session, so it outlives an agent crash and stops as a group;
      // and none of the agent's blocked signals (SIGTERM is, for sigwait).
      setsid();
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      FILE* out = fopen(log.c_str(), "a");
      if (out != nullptr) {
        dup2(fileno(out), STDOUT_FILENO);
        dup2(fileno(out), STDERR_FILENO);
      }
      execle("/bin/sh", "sh", "-c", command_.c_str(), nullptr, envp.data());
      _exit(127);
    }
    std::ofstream(PathOf(instance.instance_id, ".pid")) << pid << "\n";
    return absl::OkStatus();
  }

  absl::Status Stop(const std::string& instance_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const pid_t pid = ReadPid(instance_id);
    if (pid > 0 && Alive(instance_id)) {
      kill(-pid, SIGTERM);
      const absl::Time deadline = absl::Now() + kStopGrace;
      while (Alive(instance_id) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
      if (Alive(instance_id)) kill(-pid, SIGKILL);
      while (Alive(instance_id)) absl::SleepFor(absl::Milliseconds(10));
    }
    std::error_code ignored;
    fs::remove(PathOf(instance_id, ".pid"), ignored);
    keys_.Remove(instance_id);
    exited_.erase(instance_id);
    return absl::OkStatus();
  }

  absl::Status SetAuthorizedKeys(const std::string& instance_id,
                                 const std::vector<std::string>& keys) override {
    return keys_.Update(instance_id, keys);
  }

  absl::StatusOr<std::vector<RuntimeStatus>> List() override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<RuntimeStatus> result;
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(dir_, error)) {
      if (entry.path().extension() != ".pid") continue;
      const std::string id = entry.path().stem().string();
      RuntimeStatus s{id, Alive(id), 0, ""};
      if (!s.running) {
        auto it = exited_.find(id);
        s.exit_code = it == exited_.end() ? -1 : it->second;
        s.detail = s.exit_code >= 0 ? absl::StrCat("process exited with code ", s.exit_code)
                                    : "process ended while the agent was away";
      }
      result.push_back(std::move(s));
    }
    return result;
  }

 private:
  std::string PathOf(const std::string& id, const char* ext) const {
    return (fs::path(dir_) / (id + ext)).string();
  }

  pid_t ReadPid(const std::string& id) const {
    pid_t pid = -1;
    std::ifstream(PathOf(id, ".pid")) >> pid;
    return pid;
  }

  // Reaps our own children (keeping their exit codes); processes adopted
  // from an earlier agent are probed with signal 0.
  bool Alive(const std::string& id) {
    if (exited_.count(id)) return false;
    const pid_t pid = ReadPid(id);
    if (pid <= 0) return false;
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      exited_[id] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    if (r == 0) return true;
    return kill(pid, 0) == 0;
  }

  const std::string dir_;
  const std::string command_;
  const AuthorizedKeysFiles keys_;
  std::mutex mutex_;
  std::map<std::string, int> exited_;
};

}  // namespace

std::unique_ptr<RuntimeDriver> NewProcessDriver(const std::string& state_dir,
                                                const std::string& command) {
  return std::make_unique<ProcessDriver>(state_dir, command);
}

}  // namespace sv::agent
