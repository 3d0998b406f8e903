#ifndef SV_TESTS_INTEGRATION_JANITOR_H_
#define SV_TESTS_INTEGRATION_JANITOR_H_

// Cleans up after a test process that dies without running its destructors:
// a ctest timeout, a crash, an abort. Such a process would leave its svd
// children and its PostgreSQL clusters running (pg_ctl detaches the
// postmaster, so no signal to the test's process tree reaches it), and a CI
// run would keep them until the machine went away.
//
// The first call starts a janitor process outside the test's process tree.
// It holds one end of a socket whose other end only the test process holds,
// and acts only when it reads end-of-file, that is once the test process has
// gone. A test that ends normally cleans up itself and tells the janitor to
// forget what it cleaned, so the janitor then does nothing.
//
// The janitor signals only processes that started after it did, so a pid
// reused by an unrelated process is never touched.

#include <sys/types.h>

#include <string>

namespace sv::testing::janitor {

// Should this process die first, `pid` gets SIGTERM and, after 10 s,
// SIGKILL.
void Watch(pid_t pid);
// `pid` was waited for; drop it.
void Forget(pid_t pid);

// Should this process die first, every PostgreSQL whose data folder lies
// under `dir` is stopped at once (SIGQUIT, then SIGKILL), as is every other
// process named by a `*.pid` file under `dir`; then `dir` is removed when
// `remove` is set, else kept for its logs.
void WatchDir(const std::string& dir, bool remove);
void ForgetDir(const std::string& dir);

// The janitor's pid, starting it if needed; -1 if it could not be started
// (the tests then run without it).
pid_t Pid();

}  // namespace sv::testing::janitor

#endif  // SV_TESTS_INTEGRATION_JANITOR_H_
