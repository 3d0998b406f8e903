// svctl as a user runs it: a real binary against a real svd.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

class SvctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    svd_ = std::make_unique<SvdProcess>(SvdOptions{CreateTestDatabase(), 4, 1, {}});
    ASSERT_TRUE(svd_->Start());
    token_ = CreateTenant(*svd_, "cli");
    home_ = ::testing::TempDir() + "svctl-home-" + std::to_string(getpid());
  }

  // Runs svctl with the endpoint and key from the environment.
  RunResult Svctl(std::vector<std::string> args, std::vector<std::string> env = {}) {
    args.insert(args.begin(), SvctlPath());
    if (env.empty()) {
      env = {"SVCTL_ENDPOINT=" + svd_->endpoint(), "SVCTL_TOKEN=" + token_};
    }
    env.push_back("HOME=" + home_);
    env.push_back("XDG_CONFIG_HOME=");
    return RunCapture(args, env);
  }

  std::unique_ptr<SvdProcess> svd_;
  std::string token_;
  std::string home_;
};

// A failure prints exactly one line on stderr, naming the cause.
void ExpectOneLineError(const RunResult& r, const std::string& needle) {
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.out.empty()) << r.out;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST_F(SvctlTest, CreateWaitsUntilRunningThenGetListDelete) {
  RunResult created = Svctl({"-o", "json", "create", "--gpus", "8", "--name", "job", "--wait"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  auto instance = nlohmann::json::parse(created.out);
  EXPECT_EQ(instance["state"], "RUNNING");
  EXPECT_EQ(instance["gpu_count"], 8);
  EXPECT_EQ(instance["placement"][0]["gpu_indices"].size(), 8u);
  const std::string id = instance["id"];

  RunResult got = Svctl({"get", id});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_NE(got.out.find("RUNNING"), std::string::npos);
  EXPECT_NE(got.out.find("8 x RTX 4090"), std::string::npos);

  RunResult listed = Svctl({"list"});
  ASSERT_EQ(listed.exit_code, 0);
  EXPECT_NE(listed.out.find(id), std::string::npos);
  EXPECT_NE(listed.out.find("STATE"), std::string::npos);

  RunResult deleted = Svctl({"-o", "json", "delete", id});
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  EXPECT_EQ(nlohmann::json::parse(deleted.out)["state"], "DELETED");
  RunResult empty = Svctl({"-o", "json", "list"});
  EXPECT_EQ(nlohmann::json::parse(empty.out).value("instances", nlohmann::json::array()).size(),
            0u);
}

// Commands on one instance take its name as well as its id: a name is
// looked up among the tenant's instances, and one that names none, or
// several, is an error that changes nothing.
TEST_F(SvctlTest, InstancesByName) {
  RunResult created = Svctl({"-o", "json", "create", "--gpus", "1", "--name", "train", "--wait"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  const std::string id = nlohmann::json::parse(created.out)["id"];

  RunResult got = Svctl({"-o", "json", "get", "train"});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_EQ(nlohmann::json::parse(got.out)["id"], id);
  RunResult stopped = Svctl({"-o", "json", "stop", "train"});
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(nlohmann::json::parse(stopped.out)["state"], "STOPPED");
  RunResult events = Svctl({"events", "train"});
  ASSERT_EQ(events.exit_code, 0) << events.err;
  EXPECT_NE(events.out.find("stopped by the user"), std::string::npos) << events.out;
  RunResult volume = Svctl({"-o", "json", "volumes", "create", "--size-gib", "1"});
  ASSERT_EQ(volume.exit_code, 0) << volume.err;
  RunResult attached = Svctl({"-o", "json", "volumes", "attach",
                              nlohmann::json::parse(volume.out)["id"], "train"});
  ASSERT_EQ(attached.exit_code, 0) << attached.err;
  EXPECT_EQ(nlohmann::json::parse(attached.out)["attachments"][0]["instance_id"], id);

  ExpectOneLineError(Svctl({"get", "nothere"}), "no instance is named \"nothere\"");
  // Another tenant's instance of that name is not found, nor acted on.
  const std::string other = CreateTenant(*svd_, "other");
  RunResult theirs = Svctl({"-o", "json", "create", "--gpus", "1", "--name", "theirs"},
                           {"SVCTL_ENDPOINT=" + svd_->endpoint(), "SVCTL_TOKEN=" + other});
  ASSERT_EQ(theirs.exit_code, 0) << theirs.err;
  ExpectOneLineError(Svctl({"delete", "theirs"}), "no instance is named \"theirs\"");

  // Two of one name: the error names both ids, and neither is deleted.
  RunResult second = Svctl({"-o", "json", "create", "--gpus", "1", "--name", "train"});
  ASSERT_EQ(second.exit_code, 0) << second.err;
  const std::string second_id = nlohmann::json::parse(second.out)["id"];
  RunResult ambiguous = Svctl({"delete", "train"});
  ExpectOneLineError(ambiguous, "2 instances are named \"train\"");
  EXPECT_NE(ambiguous.err.find(id), std::string::npos) << ambiguous.err;
  EXPECT_NE(ambiguous.err.find(second_id), std::string::npos) << ambiguous.err;
  RunResult listed = Svctl({"-o", "json", "list"});
  EXPECT_EQ(nlohmann::json::parse(listed.out)["instances"].size(), 2u) << listed.out;

  // Once one is deleted, by id, the name is the other's again.
  ASSERT_EQ(Svctl({"delete", second_id}).exit_code, 0);
  RunResult started = Svctl({"-o", "json", "start", "train"});
  ASSERT_EQ(started.exit_code, 0) << started.err;
  EXPECT_EQ(nlohmann::json::parse(started.out)["id"], id);
}

// svctl ssh-keys adds ~/.ssh/id_ed25519.pub by default and never sends a
// private key; create --ssh publishes port 22 and get prints the ssh
// command; delete takes the key's name.
TEST_F(SvctlTest, SshKeysAndTheSshCommand) {
  const std::string pub =
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP70Y+xCt5EzReeUR50s3jvnEg4Zp0K69t/uLvsMIhiw dev@box";
  std::filesystem::create_directories(home_ + "/.ssh");
  std::ofstream(home_ + "/.ssh/id_ed25519.pub") << pub << "\n";
  std::ofstream(home_ + "/.ssh/id_ed25519") << "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n"
                                            << "-----END OPENSSH PRIVATE KEY-----\n";
  ExpectOneLineError(Svctl({"ssh-keys", "add", "--file", home_ + "/.ssh/id_ed25519"}),
                     "is a private key; give the .pub file");
  RunResult added = Svctl({"ssh-keys", "add"});
  ASSERT_EQ(added.exit_code, 0) << added.err;
  EXPECT_NE(added.out.find("added dev-box"), std::string::npos) << added.out;
  RunResult listed = Svctl({"ssh-keys", "list"});
  EXPECT_NE(listed.out.find("SHA256:"), std::string::npos) << listed.out;
  ExpectOneLineError(Svctl({"ssh-keys", "add", "--name", "again"}), "SSH_KEY_EXISTS");

  RunResult created = Svctl({"create", "--gpus", "1", "--name", "box", "--ssh", "--wait"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  RunResult got = Svctl({"get", "box"});
  EXPECT_NE(got.out.find("ssh:"), std::string::npos) << got.out;
  EXPECT_NE(got.out.find("ssh -p 3"), std::string::npos) << got.out;
  EXPECT_NE(got.out.find(" root@127.0.0.1"), std::string::npos) << got.out;

  RunResult deleted = Svctl({"ssh-keys", "delete", "dev-box"});
  ASSERT_EQ(deleted.exit_code, 0) << deleted.err;
  ExpectOneLineError(Svctl({"ssh-keys", "delete", "dev-box"}), "SSH_KEY_NOT_FOUND");
  RunResult empty = Svctl({"-o", "json", "ssh-keys", "list"});
  EXPECT_EQ(nlohmann::json::parse(empty.out).value("keys", nlohmann::json::array()).size(), 0u)
      << empty.out;
}

// Operator commands on one tenant take its name as well as its id (tenant
// names are unique); an unknown name is an error that credits nobody.
TEST_F(SvctlTest, OperatorsNameTenants) {
  const std::vector<std::string> admin = {"SVCTL_ENDPOINT=" + svd_->endpoint(),
                                          "SVCTL_ADMIN_TOKEN=" + svd_->admin_key()};
  RunResult paid = Svctl({"-o", "json", "admin", "topup", "cli", "12.50", "--payment-id", "p-1"},
                         admin);
  ASSERT_EQ(paid.exit_code, 0) << paid.err;
  RunResult who = Svctl({"-o", "json", "whoami"});
  ASSERT_EQ(who.exit_code, 0) << who.err;
  const std::string tenant_id = nlohmann::json::parse(who.out)["tenant_id"];
  RunResult balance = Svctl({"-o", "json", "balance"});
  EXPECT_EQ(nlohmann::json::parse(balance.out)["paid_micros"], "12500000") << balance.out;

  ExpectOneLineError(
      Svctl({"admin", "topup", "nobody", "12.50", "--payment-id", "p-2"}, admin),
      "no tenant is named \"nobody\"");
  // Only a down node's mounts can be forgotten (a live agent answers for
  // its own), and only with a reason.
  ExpectOneLineError(Svctl({"admin", "nodes", "forget-mounts", "sim-node-000", "--reason",
                            "replaced"},
                           admin),
                     "NODE_NOT_DOWN");
  EXPECT_NE(Svctl({"admin", "nodes", "forget-mounts", "sim-node-000"}, admin).exit_code, 0);
  RunResult quota = Svctl({"admin", "quota", "get", "cli"}, admin);
  ASSERT_EQ(quota.exit_code, 0) << quota.err;
  EXPECT_EQ(nlohmann::json::parse(quota.out)["tenant_id"], tenant_id);
  RunResult mode = Svctl({"admin", "billing-mode", "cli", "postpaid", "--credit-limit", "100"},
                         admin);
  ASSERT_EQ(mode.exit_code, 0) << mode.err;
  EXPECT_NE(mode.out.find(tenant_id + " is postpaid"), std::string::npos) << mode.out;
  ASSERT_EQ(Svctl({"create", "--gpus", "1"}).exit_code, 0);  // A call the audit records.
  RunResult audit = Svctl({"-o", "json", "audit", "--admin", "--tenant", "cli"}, admin);
  ASSERT_EQ(audit.exit_code, 0) << audit.err;
  const auto entries = nlohmann::json::parse(audit.out)["entries"];
  ASSERT_FALSE(entries.empty()) << audit.out;
  for (const auto& e : entries) EXPECT_EQ(e["tenant_id"], tenant_id) << e;
}

TEST_F(SvctlTest, WhoamiNamesTheTenant) {
  RunResult r = Svctl({"whoami"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cli@example.com"), std::string::npos);
  EXPECT_NE(r.out.find("cli ("), std::string::npos);
  // The role in the tenant, as `svctl users list` words it, and the key's
  // scope; not the platform role, which says MEMBER for every tenant user.
  EXPECT_NE(r.out.find("owner"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(full)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("MEMBER"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("operator:"), std::string::npos) << r.out;
}

TEST_F(SvctlTest, RetriedCreateWithOneRequestIdMakesOneInstance) {
  RunResult a = Svctl({"-o", "json", "create", "--gpus", "1", "--request-id", "abc-1"});
  RunResult b = Svctl({"-o", "json", "create", "--gpus", "1", "--request-id", "abc-1"});
  ASSERT_EQ(a.exit_code, 0);
  ASSERT_EQ(b.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(a.out)["id"], nlohmann::json::parse(b.out)["id"]);
  ExpectOneLineError(Svctl({"create", "--gpus", "2", "--request-id", "abc-1"}),
                     "REQUEST_ID_REUSED");
}

TEST_F(SvctlTest, ErrorsAreOneLineAndNonZero) {
  ExpectOneLineError(Svctl({"create", "--gpus", "12"}), "INVALID_GPU_COUNT");
  ExpectOneLineError(Svctl({"get", "ins-nosuchinstance1"}), "NOT_FOUND");
  ExpectOneLineError(Svctl({"whoami"}, {"SVCTL_ENDPOINT=" + svd_->endpoint(),
                                        "SVCTL_TOKEN=sv_wrong"}),
                     "UNAUTHENTICATED");
  ExpectOneLineError(Svctl({"whoami"}, {"SVCTL_ENDPOINT=" + svd_->endpoint()}), "no API key");
  ExpectOneLineError(Svctl({"--timeout", "2", "whoami"},
                           {"SVCTL_ENDPOINT=127.0.0.1:1", "SVCTL_TOKEN=" + token_}),
                     "cannot reach svd");
  RunResult usage = Svctl({"create"});
  EXPECT_EQ(usage.exit_code, 2);
  // An overrides file with a field of the wrong type is told, not an abort
  // (nlohmann threw through svctl), and a refund share out of range is not
  // wrapped into another one.
  const std::string file = home_ + "-overrides.json";
  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"([{"metric": 1, "threshold": 9900}])", "metric must be a string"},
           {R"([{"metric": "gpu_usable", "threshold": 9900, "refund_basis_points": 4294968296}])",
            "refund_basis_points must be an integer from 0 to 10000"}}) {
    std::ofstream(file) << json;
    ExpectOneLineError(Svctl({"admin", "sla-override", "acme", "--file", file}), needle);
  }
  std::remove(file.c_str());
}

TEST_F(SvctlTest, FlagsBeatEnvironmentWhichBeatsTheConfigFile) {
  std::string config = home_ + "/.config/svctl/config.json";
  std::filesystem::create_directories(home_ + "/.config/svctl");
  std::ofstream(config) << nlohmann::json{{"endpoint", svd_->endpoint()},
                                          {"token", "sv_bogus"}}.dump();
  // The config alone has a bad token.
  ExpectOneLineError(Svctl({"whoami"}, {"PATH=/usr/bin"}), "UNAUTHENTICATED");
  // The environment's token wins over the config's.
  RunResult env = Svctl({"whoami"}, {"SVCTL_TOKEN=" + token_});
  EXPECT_EQ(env.exit_code, 0) << env.err;
  // A flag wins over the environment.
  RunResult flag = Svctl({"--token", "sv_bogus2", "whoami"}, {"SVCTL_TOKEN=" + token_});
  EXPECT_NE(flag.exit_code, 0);
  RunResult flag_ok = Svctl({"--token", token_, "whoami"}, {"SVCTL_TOKEN=sv_bad"});
  EXPECT_EQ(flag_ok.exit_code, 0) << flag_ok.err;
}

// The README's first command (deploy/dev.sh): `svd --dev` on its own
// PostgreSQL with a simulated fleet, and svctl working at once from the
// config svd wrote, with nothing else set up. A stop leaves no PostgreSQL
// running and logs no lost LISTEN connection: the listeners close before
// the database does.
TEST(SvctlDevTest, DevServerTakesACreateAtOnceAndStopsCleanly) {
  SvdOptions options;
  options.dev = true;
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::vector<std::string> env = {"HOME=" + svd.state_dir(),
                                        "XDG_CONFIG_HOME=" + svd.svctl_config_home()};
  auto svctl = [&](std::vector<std::string> args) {
    args.insert(args.begin(), SvctlPath());
    return RunCapture(args, env);
  };

  RunResult created = svctl({"-o", "json", "create", "--gpus", "8", "--wait"});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  auto instance = nlohmann::json::parse(created.out);
  EXPECT_EQ(instance["state"], "RUNNING");
  EXPECT_EQ(instance["placement"][0]["gpu_indices"].size(), 8u);

  RunResult odd = svctl({"create", "--gpus", "12"});
  EXPECT_NE(odd.exit_code, 0);
  EXPECT_NE(odd.err.find("INVALID_GPU_COUNT"), std::string::npos) << odd.err;

  RunResult nodes = svctl({"-o", "json", "admin", "nodes", "list"});
  ASSERT_EQ(nodes.exit_code, 0) << nodes.err;
  EXPECT_EQ(nlohmann::json::parse(nodes.out)["nodes"].size(), 16u) << nodes.out;

  ASSERT_EQ(svd.Stop(), 0);
  std::ostringstream read;
  read << std::ifstream(svd.log_path()).rdbuf();
  const std::string log = read.str();
  EXPECT_NE(log.find("postgres: stopped"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(svd.state_dir() + "/pg/postmaster.pid"))
      << "the embedded PostgreSQL outlived svd";
  EXPECT_EQ(log.find("lost the LISTEN connection"), std::string::npos) << log;
  EXPECT_EQ(log.find("database system is shutting down"), std::string::npos) << log;
}

}  // namespace
}  // namespace sv::testing
