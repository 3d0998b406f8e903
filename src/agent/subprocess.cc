#include "agent/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace sv::agent {

absl::StatusOr<CommandResult> RunCommand(const std::vector<std::string>& argv,
                                         absl::Duration timeout, size_t out_bytes_max) {
  assert(!argv.empty());
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return Error(absl::StatusCode::kInternal, "PIPE_FAILED", "cannot create a pipe");
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return Error(absl::StatusCode::kUnavailable, "FORK_FAILED", "cannot fork");
  }
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  CommandResult result;
  const absl::Time deadline = absl::Now() + timeout;
  char buffer[4096];
  while (true) {
    const int wait_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    pollfd fd{pipe_fds[0], POLLIN, 0};
    int ready = poll(&fd, 1, wait_ms);
    if (ready == 0) break;  // Timed out.
    if (ready < 0 && errno == EINTR) continue;
    ssize_t n = read(pipe_fds[0], buffer, sizeof(buffer));
    if (n <= 0) break;
    if (result.out.size() < out_bytes_max) result.out.append(buffer, n);
  }
  close(pipe_fds[0]);
  int status = 0;
  if (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() >= deadline) kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    if (absl::Now() >= deadline) {
      return Error(absl::StatusCode::kDeadlineExceeded, "COMMAND_TIMEOUT",
                   absl::StrCat(argv[0], " ran longer than ", absl::FormatDuration(timeout)));
    }
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (result.exit_code == 127) {
    return Error(absl::StatusCode::kFailedPrecondition, "COMMAND_NOT_FOUND",
                 absl::StrCat("cannot run ", argv[0]));
  }
  return result;
}

}  // namespace sv::agent
