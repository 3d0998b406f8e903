// The janitor program (see janitor.h). Started by the test harness with the
// test process's start time as its argument and its socket as fd 3; reads
// what to watch until end-of-file, then cleans up whatever the test process
// left behind.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/janitor_proc.h"

namespace {

namespace fs = std::filesystem;
using sv::testing::janitor::StartTicks;

constexpr int kSocketFd = 3;
constexpr auto kTermGrace = std::chrono::seconds(10);

struct Watched {
  std::set<pid_t> pids;
  std::map<std::string, bool> dirs;  // folder -> remove it
};

void Apply(const std::string& line, Watched& watched) {
  if (line.size() < 3 || line[1] != ' ') return;
  const std::string rest = line.substr(2);
  switch (line[0]) {
    case 'W':
      watched.pids.insert(static_cast<pid_t>(std::atol(rest.c_str())));
      break;
    case 'F':
      watched.pids.erase(static_cast<pid_t>(std::atol(rest.c_str())));
      break;
    case 'D':
      if (rest.size() > 2) watched.dirs[rest.substr(2)] = rest[0] == '1';
      break;
    case 'U':
      watched.dirs.erase(rest);
      break;
    default:
      break;
  }
}

// Ours: started no earlier than the test process, so not a reused pid.
bool Ours(pid_t pid, long long test_start_ticks) {
  if (pid <= 1) return false;
  const long long ticks = StartTicks(pid);
  return ticks >= 0 && ticks >= test_start_ticks;
}

// Sends `signal` to each of `pids` that is ours, waits up to kTermGrace for
// them to go, and SIGKILLs the rest. Returns how many it signalled.
size_t Stop(const std::vector<pid_t>& pids, int signal, long long test_start_ticks) {
  std::vector<pid_t> signalled;
  for (pid_t pid : pids) {
    if (Ours(pid, test_start_ticks) && kill(pid, signal) == 0) signalled.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + kTermGrace;
  for (pid_t pid : signalled) {
    while (Ours(pid, test_start_ticks) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (Ours(pid, test_start_ticks)) {
      kill(pid, SIGKILL);
      fprintf(stderr, "sv test janitor: pid %d ignored signal %d; killed\n", pid, signal);
    }
  }
  return signalled.size();
}

pid_t PidInFile(const fs::path& path) {
  std::ifstream in(path);
  long pid = -1;
  in >> pid;
  return in ? static_cast<pid_t>(pid) : -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const long long test_start_ticks = std::atoll(argv[1]);
  close_range(kSocketFd + 1, ~0U, 0);

  Watched watched;
  std::string buffer;
  char chunk[4096];
  for (;;) {
    ssize_t n = read(kSocketFd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the test process is gone
    buffer.append(chunk, static_cast<size_t>(n));
    for (size_t end; (end = buffer.find('\n')) != std::string::npos;) {
      Apply(buffer.substr(0, end), watched);
      buffer.erase(0, end + 1);
    }
  }
  if (watched.pids.empty() && watched.dirs.empty()) return 0;

  fprintf(stderr, "sv test janitor: the test process ended without cleaning up %zu processes "
          "and %zu folders\n", watched.pids.size(), watched.dirs.size());
  // svd first, with SIGTERM: `svd --dev` then stops its own PostgreSQL.
  const size_t processes = Stop(
      std::vector<pid_t>(watched.pids.begin(), watched.pids.end()), SIGTERM, test_start_ticks);

  // Then whatever runs from the folders: PostgreSQL clusters (SIGQUIT is
  // their immediate shutdown) and processes with pid files, such as the
  // instances of a killed agent.
  std::vector<pid_t> postmasters;
  std::vector<pid_t> others;
  for (const auto& [dir, remove] : watched.dirs) {
    std::error_code ec;
    fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec);
    for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      const fs::path& path = it->path();
      if (path.filename() == "postmaster.pid") {
        postmasters.push_back(PidInFile(path));
      } else if (path.extension() == ".pid") {
        others.push_back(PidInFile(path));
      }
    }
  }
  const size_t strays = Stop(others, SIGKILL, test_start_ticks);
  const size_t clusters = Stop(postmasters, SIGQUIT, test_start_ticks);

  for (const auto& [dir, remove] : watched.dirs) {
    if (!remove) continue;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fprintf(stderr, "sv test janitor: stopped %zu processes and %zu PostgreSQL clusters\n",
          processes + strays, clusters);
  return 0;
}
