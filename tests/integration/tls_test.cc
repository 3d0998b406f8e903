// TLS end to end (docs/security.md): a throwaway CA made by openssl in the
// test's folder signs svd's certificate and a client certificate; a second
// CA signs a rogue client certificate. A real svd serves gRPC and HTTP over
// TLS, with and without --tls-client-ca, and real svctl and svagent
// processes connect to it.
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"
#include "sv/v1/agent.grpc.pb.h"
#include "tests/integration/harness.h"
#include "tests/integration/janitor.h"

namespace sv::testing {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Openssl(std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/openssl");
  RunResult r = RunCapture(args, {});
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

// ca.pem/ca.key, server.pem/server.key (localhost, 127.0.0.1),
// client.pem/client.key signed by ca; rogue.pem/rogue.key signed by a CA
// svd does not trust.
void MakePki(const std::string& dir) {
  for (const std::string ca : {"ca", "rogue-ca"}) {
    Openssl({"req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
             "/CN=sv-test-" + ca, "-keyout", dir + "/" + ca + ".key", "-out",
             dir + "/" + ca + ".pem"});
  }
  std::ofstream(dir + "/server.ext") << "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                     << "extendedKeyUsage=serverAuth\n";
  std::ofstream(dir + "/client.ext") << "extendedKeyUsage=clientAuth\n";
  struct Leaf {
    std::string name, cn, ca, ext;
  };
  for (const Leaf& leaf : {Leaf{"server", "localhost", "ca", "server.ext"},
                           Leaf{"client", "sv-test-client", "ca", "client.ext"},
                           Leaf{"rogue", "sv-test-client", "rogue-ca", "client.ext"}}) {
    const std::string base = dir + "/" + leaf.name;
    Openssl({"req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + leaf.cn, "-keyout",
             base + ".key", "-out", base + ".csr"});
    Openssl({"x509", "-req", "-in", base + ".csr", "-CA", dir + "/" + leaf.ca + ".pem",
             "-CAkey", dir + "/" + leaf.ca + ".key", "-CAcreateserial", "-days", "1",
             "-extfile", dir + "/" + leaf.ext, "-out", base + ".pem"});
  }
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir_template[] = "/tmp/sv-tls-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    dir_ = dir_template;
    ASSERT_NO_FATAL_FAILURE(MakePki(dir_));
  }

  void TearDown() override {
    if (agent_pid_ > 0) {
      kill(agent_pid_, SIGKILL);
      waitpid(agent_pid_, nullptr, 0);
      janitor::Forget(agent_pid_);
    }
    svd_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  void StartSvd(bool client_ca) {
    SvdOptions options;
    options.database_url = CreateTestDatabase();
    options.sim_nodes = 0;
    options.extra_args = {"--tls-cert", dir_ + "/server.pem", "--tls-key", dir_ + "/server.key"};
    if (client_ca) {
      options.extra_args.insert(options.extra_args.end(),
                                {"--tls-client-ca", dir_ + "/ca.pem"});
    }
    svd_ = std::make_unique<SvdProcess>(options);
    ASSERT_TRUE(svd_->Start());
  }

  // svctl whoami with the admin key over TLS trusting ca.pem, plus `extra`.
  RunResult Whoami(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {SvctlPath(), "--endpoint", svd_->endpoint(), "--token",
                                     svd_->admin_key(), "--ca-file", dir_ + "/ca.pem",
                                     "--timeout", "5"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back("whoami");
    return RunCapture(argv, {});
  }

  std::vector<std::string> ClientCert(const std::string& name) {
    return {"--client-cert", dir_ + "/" + name + ".pem", "--client-key", dir_ + "/" + name + ".key"};
  }

  std::shared_ptr<grpc::Channel> Channel(const std::string& client) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = Slurp(dir_ + "/ca.pem");
    if (!client.empty()) {
      tls.pem_cert_chain = Slurp(dir_ + "/" + client + ".pem");
      tls.pem_private_key = Slurp(dir_ + "/" + client + ".key");
    }
    return grpc::CreateChannel(svd_->endpoint(), grpc::SslCredentials(tls));
  }

  grpc::Status GetAccount(const std::string& client, v1::Account* account) {
    v1::AccountService::Stub stub(Channel(client));
    auto context = Context(svd_->admin_key());
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub.GetCurrentAccount(context.get(), {}, account);
  }

  // REST over HTTPS: GET /v1/account with the admin key; the HTTP port
  // never asks for a client certificate (docs/security.md).
  void ExpectRestAccount() {
    httplib::SSLClient https("127.0.0.1", svd_->http_port());
    https.set_ca_cert_path((dir_ + "/ca.pem").c_str());
    https.enable_server_certificate_verification(true);
    https.set_connection_timeout(5);
    https.set_read_timeout(5);
    auto account = https.Get("/v1/account", {{"Authorization", "Bearer " + svd_->admin_key()}});
    ASSERT_TRUE(account) << httplib::to_string(account.error());
    EXPECT_EQ(account->status, 200) << account->body;
    auto body = nlohmann::json::parse(account->body, nullptr, false);
    EXPECT_EQ(body.value("role", ""), "OPERATOR") << account->body;
    // And never in plaintext.
    httplib::Client http("127.0.0.1", svd_->http_port());
    http.set_connection_timeout(3);
    http.set_read_timeout(3);
    auto plain = http.Get("/v1/account", {{"Authorization", "Bearer " + svd_->admin_key()}});
    EXPECT_TRUE(!plain || plain->status != 200);
  }

  std::string dir_;
  std::unique_ptr<SvdProcess> svd_;
  pid_t agent_pid_ = -1;
};

// Goal: with --tls-client-ca, gRPC takes only clients whose certificate the
// CA signed: svctl and a direct gRPC client with one get through; without
// one, or with one from another CA, they are refused; REST over HTTPS still
// works with a key alone; svagent registers with its client certificate.
TEST_F(TlsTest, MutualTlsRequiresATrustedClientCertificate) {
  ASSERT_NO_FATAL_FAILURE(StartSvd(/*client_ca=*/true));

  RunResult good = Whoami(ClientCert("client"));
  EXPECT_EQ(good.exit_code, 0) << good.err;
  EXPECT_NE(good.out.find("operator"), std::string::npos) << good.out;
  RunResult none = Whoami({});
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_NE(none.err.find("UNAVAILABLE"), std::string::npos) << none.err;
  RunResult rogue = Whoami(ClientCert("rogue"));
  EXPECT_EQ(rogue.exit_code, 1) << rogue.out;
  RunResult half = Whoami({"--client-cert", dir_ + "/client.pem"});
  EXPECT_EQ(half.exit_code, 1);
  EXPECT_NE(half.err.find("--client-cert and --client-key go together"), std::string::npos)
      << half.err;
  // The environment works like the flags.
  RunResult from_env =
      RunCapture({SvctlPath(), "--endpoint", svd_->endpoint(), "--token", svd_->admin_key(),
                  "--timeout", "5", "whoami"},
                 {"SVCTL_CA_FILE=" + dir_ + "/ca.pem", "SVCTL_CLIENT_CERT=" + dir_ + "/client.pem",
                  "SVCTL_CLIENT_KEY=" + dir_ + "/client.key"});
  EXPECT_EQ(from_env.exit_code, 0) << from_env.err;

  v1::Account account;
  grpc::Status status = GetAccount("client", &account);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(account.role(), v1::OPERATOR);
  EXPECT_EQ(GetAccount("", &account).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(GetAccount("rogue", &account).error_code(), grpc::StatusCode::UNAVAILABLE);

  ASSERT_NO_FATAL_FAILURE(ExpectRestAccount());

  // A node agent over mutual TLS: mint its credential, start svagent with
  // the client certificate, and wait for the node to register.
  v1::NodeCredentialService::Stub credentials(Channel("client"));
  v1::CreateNodeCredentialRequest mint;
  mint.set_node_name("tls-node-1");
  v1::CreateNodeCredentialResponse minted;
  status = credentials.CreateNodeCredential(Context(svd_->admin_key()).get(), mint, &minted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::ofstream(dir_ + "/node.credential") << minted.credential();
  agent_pid_ = fork();
  if (agent_pid_ == 0) {
    int fd = open((dir_ + "/agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<std::string> args = {
        SV_SVAGENT_PATH, "--endpoint", svd_->endpoint(), "--node-name", "tls-node-1",
        "--credential-file", dir_ + "/node.credential", "--state-dir", dir_ + "/agent-state",
        "--telemetry", "none", "--ca-file", dir_ + "/ca.pem", "--client-cert",
        dir_ + "/client.pem", "--client-key", dir_ + "/client.key",
        "--reconnect-backoff-max-ms", "300"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (agent_pid_ > 0) janitor::Watch(agent_pid_);
  v1::SchedulerAdminService::Stub admin(Channel("client"));
  bool registered = false;
  for (int i = 0; i < 150 && !registered; ++i) {
    v1::ListFleetNodesResponse nodes;
    status = admin.ListNodes(Context(svd_->admin_key()).get(), {}, &nodes);
    ASSERT_TRUE(status.ok()) << status.error_message();
    for (const auto& n : nodes.nodes()) registered |= n.name() == "tls-node-1";
    if (!registered) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(registered) << "svagent did not register over mutual TLS; see " << dir_
                          << "/agent.log";
  EXPECT_EQ(svd_->Stop(), 0);
}

// Goal: TLS without a client CA: svctl trusting the CA gets through (a
// client certificate is not asked for, and offering one does no harm);
// a plaintext client does not; REST works over HTTPS.
TEST_F(TlsTest, ServerTlsWithoutClientCa) {
  ASSERT_NO_FATAL_FAILURE(StartSvd(/*client_ca=*/false));
  RunResult ok = Whoami({});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("operator"), std::string::npos) << ok.out;
  RunResult with_cert = Whoami(ClientCert("client"));
  EXPECT_EQ(with_cert.exit_code, 0) << with_cert.err;
  RunResult plain = RunCapture({SvctlPath(), "--endpoint", svd_->endpoint(), "--token",
                                svd_->admin_key(), "--timeout", "3", "whoami"},
                               {});
  EXPECT_NE(plain.exit_code, 0) << "a plaintext client must not get through";
  v1::Account account;
  grpc::Status status = GetAccount("", &account);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_NO_FATAL_FAILURE(ExpectRestAccount());
  EXPECT_EQ(svd_->Stop(), 0);
}

// Goal: HTTPS speaks TLS 1.2 and later only, whatever the host's OpenSSL
// policy allows. cpp-httplib's own floor is TLS 1.1, so a host whose policy
// allows it (here: an OPENSSL_CONF with MinProtocol TLSv1 and security
// level 0, as older systems had) served TLS 1.0 and 1.1 on the HTTP port.
TEST_F(TlsTest, HttpsRefusesTlsOlderThan12WhereTheSystemAllowsIt) {
  const std::string weak = dir_ + "/weak-openssl.cnf";
  std::ofstream(weak) << "openssl_conf = default_conf\n[default_conf]\nssl_conf = ssl_sect\n"
                      << "[ssl_sect]\nsystem_default = system_default_sect\n"
                      << "[system_default_sect]\nMinProtocol = TLSv1\n"
                      << "CipherString = DEFAULT:@SECLEVEL=0\n";
  ASSERT_EQ(setenv("OPENSSL_CONF", weak.c_str(), 1), 0);  // svd inherits it.
  StartSvd(/*client_ca=*/false);
  unsetenv("OPENSSL_CONF");
  ASSERT_TRUE(svd_ != nullptr && svd_->http_port() > 0);
  // A handshake offering only `version`, from a client as permissive.
  auto handshake = [&](const std::string& version) {
    RunResult r = RunCapture(
        {"/bin/sh", "-c",
         "/usr/bin/openssl s_client -connect 127.0.0.1:" + std::to_string(svd_->http_port()) +
             " " + version + " -cipher DEFAULT:@SECLEVEL=0 </dev/null"},
        {"OPENSSL_CONF=" + weak});
    return r.exit_code == 0 && r.out.find("Cipher is (NONE)") == std::string::npos &&
           r.out.find("Protocol  :") != std::string::npos;
  };
  EXPECT_TRUE(handshake("-tls1_2"));
  EXPECT_FALSE(handshake("-tls1_1"));
  EXPECT_FALSE(handshake("-tls1"));
  EXPECT_EQ(svd_->Stop(), 0);
}

// Goal: the simulated fleet dials in plaintext, so svd refuses to start it
// behind TLS instead of running with a fleet that can never register.
TEST_F(TlsTest, SimulatedFleetWithTlsIsRefused) {
  SvdOptions options;
  options.database_url = CreateTestDatabase();
  options.sim_nodes = 2;
  options.extra_args = {"--tls-cert", dir_ + "/server.pem", "--tls-key", dir_ + "/server.key"};
  SvdProcess svd(options);
  EXPECT_FALSE(svd.Start());
  EXPECT_NE(Slurp(svd.log_path()).find("--sim-nodes cannot be combined with --tls-cert"),
            std::string::npos);
}

}  // namespace
}  // namespace sv::testing
