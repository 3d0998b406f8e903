// The janitor (janitor.h) against real processes: a forked "test process"
// registers what it starts and then dies as a ctest timeout would kill it.

#include "tests/integration/janitor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "store/embedded_postgres.h"
#include "tests/integration/janitor_proc.h"

namespace sv::testing {
namespace {

namespace fs = std::filesystem;

bool Running(pid_t pid) { return janitor::StartTicks(pid) >= 0; }

// Waits up to 30 s for `done`.
template <typename Predicate>
bool Eventually(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// `sleep 600` as a child, in its own session when `detached` (as an
// agent's instance runs).
pid_t StartSleep(bool detached) {
  pid_t pid = fork();
  if (pid == 0) {
    if (detached) setsid();
    execlp("sleep", "sleep", "600", static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

std::string MakeDir() {
  std::string pattern = "/tmp/sv-janitor-test-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  chmod(dir.c_str(), 0755);
  return dir;
}

// Runs `body` in a forked child that then dies by SIGKILL, and returns the
// pids `body` wrote to its pipe.
template <typename Body>
std::vector<pid_t> InDyingChild(Body body) {
  int ends[2];
  EXPECT_EQ(pipe2(ends, O_CLOEXEC), 0);  // not held open by the sleeps
  pid_t child = fork();
  if (child == 0) {
    close(ends[0]);
    for (pid_t pid : body()) {
      if (write(ends[1], &pid, sizeof pid) != sizeof pid) _exit(1);
    }
    close(ends[1]);
    raise(SIGKILL);
  }
  close(ends[1]);
  std::vector<pid_t> pids;
  pid_t pid;
  while (read(ends[0], &pid, sizeof pid) == sizeof pid) pids.push_back(pid);
  close(ends[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  return pids;
}

TEST(JanitorTest, StopsWhatADeadTestProcessLeftRunning) {
  const std::string dir = MakeDir();
  // What the dead process left: a watched child (svd, say), and in a
  // watched folder the pid file of a process in its own session (an
  // agent's instance).
  std::vector<pid_t> pids = InDyingChild([&] {
    pid_t watched = StartSleep(false);
    janitor::Watch(watched);
    pid_t detached = StartSleep(true);
    fs::create_directories(dir + "/state/instances");
    std::ofstream(dir + "/state/instances/i-1.pid") << detached << "\n";
    janitor::WatchDir(dir, /*remove=*/true);
    return std::vector<pid_t>{watched, detached, janitor::Pid()};
  });
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_GT(pids[2], 0) << "the janitor did not start";
  EXPECT_TRUE(Eventually([&] { return !Running(pids[0]) && !Running(pids[1]); }));
  EXPECT_TRUE(Eventually([&] { return !Running(pids[2]); })) << "the janitor did not finish";
  EXPECT_FALSE(fs::exists(dir));
}

TEST(JanitorTest, LeavesAloneWhatTheTestForgot) {
  const std::string dir = MakeDir();
  std::vector<pid_t> pids = InDyingChild([&] {
    pid_t waited = StartSleep(false);
    janitor::Watch(waited);
    janitor::Forget(waited);
    janitor::WatchDir(dir, /*remove=*/true);
    janitor::ForgetDir(dir);
    return std::vector<pid_t>{waited, janitor::Pid()};
  });
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_GT(pids[1], 0);
  EXPECT_TRUE(Eventually([&] { return !Running(pids[1]); }));
  EXPECT_TRUE(Running(pids[0]));
  EXPECT_TRUE(fs::exists(dir));
  kill(pids[0], SIGKILL);
  fs::remove_all(dir);
}

// A kept folder (an svd's, for its log) loses its clusters but not its files.
TEST(JanitorTest, StopsTheClusterOfADeadTestProcess) {
  const std::string dir = MakeDir();
  std::vector<pid_t> pids = InDyingChild([&] {
    store::EmbeddedPostgresOptions options;
    options.data_dir = dir + "/data";
    options.durable = false;
    options.database = "postgres";
    janitor::WatchDir(dir, /*remove=*/false);
    // Leaked on purpose: the process dies as if killed mid-test.
    auto* postgres = new store::EmbeddedPostgres(options);
    if (!postgres->Start().ok()) return std::vector<pid_t>{};
    pid_t postmaster = -1;
    std::ifstream(dir + "/data/postmaster.pid") >> postmaster;
    return std::vector<pid_t>{postmaster, janitor::Pid()};
  });
  ASSERT_EQ(pids.size(), 2u) << "PostgreSQL did not start";
  ASSERT_GT(pids[0], 0);
  EXPECT_TRUE(Eventually([&] { return !Running(pids[0]); })) << "the cluster still runs";
  EXPECT_TRUE(Eventually([&] { return !Running(pids[1]); }));
  EXPECT_TRUE(fs::exists(dir + "/data/PG_VERSION"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace sv::testing
