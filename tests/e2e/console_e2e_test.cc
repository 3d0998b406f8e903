// Runs the browser end-to-end test (console.e2e.js) against a real svd and
// PostgreSQL: a fresh tenant, the operator key, and a short billing period
// so a charged minute shows on the console within seconds of its end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

namespace fs = std::filesystem;

std::string Which(const std::string& program) {
  for (const char* dir : {"/usr/local/bin", "/usr/bin", "/bin"}) {
    const std::string path = std::string(dir) + "/" + program;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

bool SvdHasFlag(const std::string& flag) {
  RunResult help = RunCapture({SvdPath(), "--help"}, {});
  return help.out.find(flag) != std::string::npos;
}

TEST(ConsoleE2eTest, SignInRunInstanceSeeBalanceFallStopAndSeeRevenue) {
  const std::string node = Which("node");
  ASSERT_FALSE(node.empty()) << "node is not installed (deploy/setup.sh installs it)";
  const std::string chromium = getenv("SV_CHROMIUM") ? getenv("SV_CHROMIUM") : "/usr/bin/chromium";
  ASSERT_EQ(access(chromium.c_str(), X_OK), 0) << chromium << " missing (apt-get install chromium)";
  ASSERT_TRUE(fs::exists(std::string(SV_E2E_DIR) + "/node_modules/playwright-core"))
      << "run `npm ci` in tests/e2e (deploy/setup.sh does)";

  // Minutes are billed as soon as they end (no metering lag), every 200 ms.
  SvdOptions options{CreateTestDatabase(), 4, 2,
                     {"--billing-interval-ms", "200", "--billing-lag-ms", "0",
                      "--agent-heartbeat-interval-ms", "200", "--agent-telemetry-interval-ms",
                      "500", "--sla-checkpoint-interval-ms", "500"}};
  // With svd's test clock, the minute is simulated; without it, real time.
  if (SvdHasFlag("--fake-clock-start")) {
    // A few seconds into a minute, so the instance's first minute is whole.
    const absl::Time start = absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now()) / 60 * 60 + 5);
    options.extra_args.push_back("--fake-clock-start");
    options.extra_args.push_back(absl::FormatTime(absl::RFC3339_full, start, absl::UTCTimeZone()));
  }
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string key = CreateTenant(svd, "e2e-tenant");
  ASSERT_FALSE(key.empty());

  const std::string out_dir = SV_E2E_OUT_DIR;
  fs::create_directories(out_dir);
  std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin",
                                  "HOME=" + std::string(getenv("HOME") ? getenv("HOME") : "/tmp"),
                                  "NODE_PATH=" + std::string(SV_E2E_DIR) + "/node_modules",
                                  "SV_CHROMIUM=" + chromium};
  RunResult run = RunCapture({node, std::string(SV_E2E_DIR) + "/console.e2e.js",
                              "--base", "http://127.0.0.1:" + std::to_string(svd.http_port()),
                              "--key", key, "--admin-key", svd.admin_key(), "--out", out_dir},
                             env);
  std::printf("%s\n%s\n", run.out.c_str(), run.err.c_str());
  EXPECT_EQ(run.exit_code, 0) << "screenshots in " << out_dir << "; svd log " << svd.log_path();
  EXPECT_TRUE(fs::exists(out_dir + "/05-admin.png"));
}

}  // namespace
}  // namespace sv::testing
