#include "tests/integration/janitor.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/janitor_proc.h"

namespace sv::testing::janitor {
namespace {

std::mutex g_mu;
int g_socket = -1;  // Guarded by g_mu; -1 before the start or if it failed.
pid_t g_pid = -1;
bool g_started = false;

// Starts the janitor: fork, fork again so that it is nobody's child in the
// test's process tree, and exec the janitor program with the socket's other
// end as its fd 3. Between fork and exec only async-signal-safe calls.
void StartLocked() {
  g_started = true;
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) return;
  int pid_pipe[2];
  if (pipe2(pid_pipe, O_CLOEXEC) != 0) {
    close(ends[0]);
    close(ends[1]);
    return;
  }
  const long long start_ticks = StartTicks(getpid());
  std::string program = SV_JANITOR_PATH;
  std::string ticks = std::to_string(start_ticks);
  std::vector<char*> argv = {program.data(), ticks.data(), nullptr};
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);

  pid_t child = fork();
  if (child == 0) {
    setsid();
    pid_t grandchild = fork();
    if (grandchild != 0) {
      if (grandchild > 0) (void)!write(pid_pipe[1], &grandchild, sizeof grandchild);
      _exit(0);
    }
    // The janitor keeps the test's stderr for its report: ctest shows it
    // with the test's output.
    dup2(ends[1], 3);  // dup2 clears close-on-exec on the copy
    if (null_fd >= 0) {
      dup2(null_fd, STDIN_FILENO);
      dup2(null_fd, STDOUT_FILENO);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (null_fd >= 0) close(null_fd);
  close(ends[1]);
  close(pid_pipe[1]);
  if (child < 0) {
    close(ends[0]);
    close(pid_pipe[0]);
    return;
  }
  waitpid(child, nullptr, 0);
  pid_t grandchild = -1;
  if (read(pid_pipe[0], &grandchild, sizeof grandchild) != sizeof grandchild) grandchild = -1;
  close(pid_pipe[0]);
  if (grandchild <= 0) {
    close(ends[0]);
    return;
  }
  g_socket = ends[0];
  g_pid = grandchild;
}

void Send(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_started) StartLocked();
  if (g_socket < 0) return;
  const std::string message = line + "\n";
  size_t sent = 0;
  while (sent < message.size()) {
    ssize_t n = send(g_socket, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the janitor is gone; the tests run on without it
    sent += static_cast<size_t>(n);
  }
}

}  // namespace

void Watch(pid_t pid) { Send(absl::StrCat("W ", pid)); }
void Forget(pid_t pid) { Send(absl::StrCat("F ", pid)); }
void WatchDir(const std::string& dir, bool remove) {
  Send(absl::StrCat("D ", remove ? 1 : 0, " ", dir));
}
void ForgetDir(const std::string& dir) { Send(absl::StrCat("U ", dir)); }

pid_t Pid() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_started) StartLocked();
  return g_pid;
}

}  // namespace sv::testing::janitor
