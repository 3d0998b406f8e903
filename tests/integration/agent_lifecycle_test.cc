// The instance lifecycle driven by real node agents: a real svd on a real
// PostgreSQL, real svagent processes with the process driver (instances are
// real local processes), and the real agent protocol.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <pqxx/pqxx>
#include <set>
#include <sstream>
#include <thread>

#include "api/errors.h"
#include "sv/v1/agent.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/security.grpc.pb.h"
#include "sv/v1/sla.grpc.pb.h"
#include "sv/v1/volume.grpc.pb.h"
#include "store/embedded_postgres.h"
#include "tests/integration/harness.h"
#include "tests/integration/janitor.h"

namespace sv::testing {
namespace {

namespace fs = std::filesystem;
using v1::Instance;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool Alive(pid_t pid) { return pid > 0 && kill(pid, 0) == 0; }

// A real svagent child process.
class AgentProcess {
 public:
  AgentProcess(std::string dir, std::vector<std::string> args)
      : dir_(std::move(dir)), args_(std::move(args)) {}
  ~AgentProcess() { Kill(); }

  void Start() {
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open((dir_ + "/agent.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      std::vector<std::string> all = {SV_SVAGENT_PATH};
      all.insert(all.end(), args_.begin(), args_.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (pid_ > 0) janitor::Watch(pid_);
  }

  // SIGKILL, as in a crash; the instances it started keep running.
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    janitor::Forget(pid_);
    pid_ = -1;
  }

  // The pid of an instance's process, from the driver's pid file.
  pid_t InstancePid(const std::string& id) const {
    pid_t pid = -1;
    std::ifstream(dir_ + "/state/instances/" + id + ".pid") >> pid;
    return pid;
  }

 private:
  std::string dir_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
};

class AgentLifecycleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    database_url_ = CreateTestDatabase();
    SvdOptions options{database_url_, 0, 1, {}};
    options.extra_args = {"--node-heartbeat-timeout-ms", "3000",
                          "--agent-heartbeat-interval-ms", "200",
                          "--agent-telemetry-interval-ms", "200"};
    options.keep_port_on_restart = true;
    svd_ = std::make_unique<SvdProcess>(options);
    ASSERT_TRUE(svd_->Start());
    token_ = CreateTenant(*svd_, "alpha");
    ASSERT_FALSE(token_.empty());
    stub_ = v1::InstanceService::NewStub(svd_->channel());
    dir_ = fs::temp_directory_path() / ("sv-agent-test-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // The instances of an agent write their pid files under it.
    janitor::WatchDir(dir_, /*remove=*/false);
  }

  void TearDown() override {
    agents_.clear();
    // Instances left by killed agents are our processes' grandchildren in
    // their own sessions; end them.
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
      if (entry.path().extension() != ".pid") continue;
      pid_t pid = -1;
      std::ifstream(entry.path()) >> pid;
      if (pid > 0) kill(-pid, SIGKILL);
    }
    janitor::ForgetDir(dir_);
    stub_.reset();
    svd_.reset();
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string MintCredential(const std::string& node) {
    v1::NodeCredentialService::Stub stub(svd_->channel());
    v1::CreateNodeCredentialRequest request;
    request.set_node_name(node);
    v1::CreateNodeCredentialResponse response;
    grpc::Status status =
        stub.CreateNodeCredential(Context(svd_->admin_key()).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.credential();
  }

  // An agent stream of the test's own (no svagent behind it), registered as
  // `node`. The deadline is a failure bound, not a timing assertion: a
  // missing message fails the test instead of hanging it.
  struct RawAgent {
    std::unique_ptr<v1::AgentService::Stub> stub;
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream;
    v1::Registered registered;
  };
  void ConnectRegistered(const std::string& node, RawAgent* agent,
                         std::chrono::seconds deadline = std::chrono::seconds(30),
                         bool reports_mounts_on_connect = false,
                         bool reports_complete_lists = false,
                         const std::vector<std::string>& running = {}) {
    agent->stub = v1::AgentService::NewStub(svd_->channel());
    agent->context = Context(MintCredential(node));
    agent->context->set_deadline(std::chrono::system_clock::now() + deadline);
    agent->stream = agent->stub->Connect(agent->context.get());
    v1::AgentMessage registration = AgentRegistration(node);
    registration.mutable_register_()->set_reports_mounts_on_connect(reports_mounts_on_connect);
    registration.mutable_register_()->set_reports_complete_lists(reports_complete_lists);
    for (const std::string& id : running) {
      registration.mutable_register_()->add_running_instance_ids(id);
    }
    ASSERT_TRUE(agent->stream->Write(registration));
    v1::ServerMessage m;
    ASSERT_TRUE(agent->stream->Read(&m));
    ASSERT_TRUE(m.has_registered());
    agent->registered = m.registered();
  }

  // The next desired set on the raw agent's stream that `pred` accepts;
  // false when none comes.
  static bool NextSet(RawAgent& agent,
                      const std::function<bool(const v1::DesiredInstances&)>& pred,
                      v1::DesiredInstances* out) {
    v1::ServerMessage m;
    while (agent.stream->Read(&m)) {
      if (m.has_desired() && pred(m.desired())) {
        *out = m.desired();
        return true;
      }
    }
    return false;
  }

  // The next desired set's assignment of `id` (false when none comes).
  static bool NextAssignment(RawAgent& agent, const std::string& id,
                             v1::InstanceAssignment* out) {
    v1::DesiredInstances set;
    auto names = [&](const v1::DesiredInstances& d) {
      for (const auto& a : d.instances()) {
        if (a.instance_id() == id) return true;
      }
      return false;
    };
    if (!NextSet(agent, names, &set)) return false;
    for (const auto& a : set.instances()) {
      if (a.instance_id() == id) *out = a;
    }
    return true;
  }

  v1::VolumeState VolumeStateOf(const std::string& id) {
    v1::GetVolumeRequest request;
    request.set_id(id);
    v1::Volume out;
    EXPECT_TRUE(
        v1::VolumeService::NewStub(svd_->channel())->GetVolume(Context(token_).get(), request, &out)
            .ok());
    return out.state();
  }

  // Detaches the volume from the instance; the detach waits (DETACHING).
  void ExpectDetachWaits(const std::string& volume_id, const std::string& instance_id) {
    v1::DetachVolumeRequest detach;
    detach.set_volume_id(volume_id);
    detach.set_instance_id(instance_id);
    v1::Volume detaching;
    ASSERT_TRUE(v1::VolumeService::NewStub(svd_->channel())
                    ->DetachVolume(Context(token_).get(), detach, &detaching)
                    .ok());
    EXPECT_EQ(detaching.state(), v1::DETACHING);
  }

  // A 4-GPU instance on the raw agent's node, its start reported, RUNNING;
  // then a network volume attached to it, mounted by the agent (its mount
  // report sent), ATTACHED. `set` is the set that named the volume.
  void RunWithMountedVolume(RawAgent& agent, Instance* created, v1::Volume* volume,
                            v1::DesiredInstances* set) {
    *created = Create(4);
    v1::InstanceAssignment assignment;
    ASSERT_TRUE(NextAssignment(agent, created->id(), &assignment));
    v1::AgentMessage started;
    started.mutable_report()->set_instance_id(created->id());
    started.mutable_report()->set_state(v1::AGENT_STARTED);
    ASSERT_TRUE(agent.stream->Write(started));
    ASSERT_TRUE(WaitForState(created->id(), v1::RUNNING));
    auto volumes = v1::VolumeService::NewStub(svd_->channel());
    v1::CreateVolumeRequest create;
    create.mutable_volume()->set_name("data");
    create.mutable_volume()->set_size_gib(10);
    create.mutable_volume()->set_kind(v1::NETWORK);
    create.set_request_id("create-data");
    ASSERT_TRUE(volumes->CreateVolume(Context(token_).get(), create, volume).ok());
    v1::AttachVolumeRequest attach;
    attach.set_volume_id(volume->id());
    attach.set_instance_id(created->id());
    v1::Volume attached;
    ASSERT_TRUE(volumes->AttachVolume(Context(token_).get(), attach, &attached).ok());
    const std::string id = created->id();
    ASSERT_TRUE(NextSet(agent,
                        [&](const v1::DesiredInstances& d) {
                          for (const auto& a : d.instances()) {
                            if (a.instance_id() == id && a.volumes_size() > 0) return true;
                          }
                          return false;
                        },
                        set));
    v1::AgentMessage mounted;
    mounted.mutable_mounts()->set_instance_id(id);
    for (const auto& a : set->instances()) {
      if (a.instance_id() == id) *mounted.mutable_mounts()->add_mounts() = a.volumes(0);
    }
    ASSERT_TRUE(agent.stream->Write(mounted));
    ASSERT_TRUE(WaitFor([&] { return VolumeStateOf(volume->id()) == v1::ATTACHED; }));
  }

  AgentProcess& StartAgent(const std::string& node, std::vector<std::string> extra = {}) {
    const std::string dir = dir_ + "/" + node;
    fs::create_directories(dir);
    const std::string credential_file = dir + "/credential";
    if (!fs::exists(credential_file)) std::ofstream(credential_file) << MintCredential(node);
    std::vector<std::string> args = {"--endpoint", svd_->endpoint(),
                                     "--node-name", node,
                                     "--credential-file", credential_file,
                                     "--state-dir", dir + "/state",
                                     "--process-command", "exec sleep 600",
                                     "--telemetry", "simulated",
                                     "--storage-probe-bytes", "65536",
                                     "--reconnect-backoff-max-ms", "300"};
    args.insert(args.end(), extra.begin(), extra.end());
    agents_.push_back(std::make_unique<AgentProcess>(dir, args));
    agents_.back()->Start();
    return *agents_.back();
  }

  Instance Create(int gpus) {
    v1::CreateInstanceRequest request;
    request.mutable_instance()->set_gpu_count(gpus);
    Instance out;
    grpc::Status status = stub_->CreateInstance(Context(token_).get(), request, &out);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return out;
  }

  Instance Get(const std::string& id) {
    v1::GetInstanceRequest request;
    request.set_id(id);
    Instance out;
    grpc::Status status = stub_->GetInstance(Context(token_).get(), request, &out);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return out;
  }

  bool WaitForState(const std::string& id, v1::InstanceState state) {
    return WaitFor([&] { return Get(id).state() == state; });
  }

  std::vector<v1::InstanceEvent> Events(const std::string& id) {
    v1::ListInstanceEventsRequest request;
    request.set_id(id);
    v1::ListInstanceEventsResponse response;
    grpc::Status status = stub_->ListInstanceEvents(Context(token_).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return {response.events().begin(), response.events().end()};
  }

  // The instance's newest SLA window (the open hour).
  v1::SlaWindow OpenWindow(const std::string& id) {
    v1::ListSlaWindowsRequest request;
    request.set_instance_id(id);
    v1::ListSlaWindowsResponse response;
    grpc::Status status = v1::SlaService::NewStub(svd_->channel())
                              ->ListSlaWindows(Context(token_).get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.windows_size() > 0 ? response.windows(0) : v1::SlaWindow();
  }

  int CountTransitionsTo(const std::string& id, v1::InstanceState state) {
    int n = 0;
    for (const auto& e : Events(id)) n += e.to_state() == state;
    return n;
  }

  std::string database_url_;
  std::unique_ptr<SvdProcess> svd_;
  std::string token_;
  std::unique_ptr<v1::InstanceService::Stub> stub_;
  std::string dir_;
  std::vector<std::unique_ptr<AgentProcess>> agents_;
};

// Goal: an instance runs as a real process on the agent's node with the GPUs
// svd reserved, and stop, start and delete end and restart that process,
// each transition recorded with a reason.
TEST_F(AgentLifecycleTest, StartStopStartDelete) {
  AgentProcess& agent = StartAgent("node-a");
  Instance created = Create(4);
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING)) << Slurp(svd_->log_path());
  const Instance running = Get(created.id());
  ASSERT_EQ(running.placement_size(), 1);
  EXPECT_EQ(running.placement(0).node_name(), "node-a");

  pid_t pid = agent.InstancePid(created.id());
  ASSERT_TRUE(Alive(pid));
  // The process sees exactly the GPUs svd reserved. Right after the fork
  // /proc shows the agent's own environment until the child has exec'd, so
  // wait for the instance's.
  std::string environ;
  for (int i = 0; i < 100; ++i) {
    environ = Slurp("/proc/" + std::to_string(pid) + "/environ");
    if (environ.find("SV_INSTANCE_ID=" + created.id() + '\0') != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::string gpus;
  for (int g : running.placement(0).gpu_indices()) {
    gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
  }
  EXPECT_NE(environ.find("CUDA_VISIBLE_DEVICES=" + gpus + '\0'), std::string::npos);

  std::vector<v1::InstanceState> expected = {v1::PENDING, v1::SCHEDULED, v1::STARTING,
                                             v1::RUNNING};
  auto events = Events(created.id());
  ASSERT_EQ(events.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(events[i].to_state(), expected[i]);
  EXPECT_EQ(events[3].reason(), "every node confirmed the start");

  v1::StopInstanceRequest stop;
  stop.set_id(created.id());
  Instance stopped;
  ASSERT_TRUE(stub_->StopInstance(Context(token_).get(), stop, &stopped).ok());
  EXPECT_EQ(stopped.state(), v1::STOPPED);
  EXPECT_EQ(stopped.placement_size(), 0);
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); })) << "the agent did not stop the process";

  v1::StartInstanceRequest start;
  start.set_id(created.id());
  Instance restarted;
  ASSERT_TRUE(stub_->StartInstance(Context(token_).get(), start, &restarted).ok());
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));
  pid_t second = agent.InstancePid(created.id());
  EXPECT_TRUE(Alive(second));
  EXPECT_NE(second, pid);
  EXPECT_EQ(CountTransitionsTo(created.id(), v1::RUNNING), 2);

  v1::DeleteInstanceRequest del;
  del.set_id(created.id());
  Instance deleted;
  ASSERT_TRUE(stub_->DeleteInstance(Context(token_).get(), del, &deleted).ok());
  EXPECT_EQ(deleted.state(), v1::DELETED);
  EXPECT_TRUE(WaitFor([&] { return !Alive(second); }));
}

// Goal: a tenant's SSH keys reach its running instance through a real
// agent, follow adds and deletes while it runs (a deleted key stops being
// accepted), and never reach another tenant's instance; the published port
// 22 is an ssh:// URL. Keys are checked and scoped: a retried add answers
// with the same key, the same key under another name is ALREADY_EXISTS, and
// another tenant can neither see nor delete it.
TEST_F(AgentLifecycleTest, SshKeysReachRunningInstances) {
  const std::string key_a =
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIP70Y+xCt5EzReeUR50s3jvnEg4Zp0K69t/uLvsMIhiw a@test";
  const std::string key_b =
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINZaiqN+/kNi5Igegz1Selii6NOeHjd/W3ausrjADWks b@test";
  const std::string key_c =
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINgDRegrOONw5ORLXW8P8NQOLRS/KL+WEWMLl+GxR3Fs c@test";
  auto keys = v1::SshKeyService::NewStub(svd_->channel());
  auto add = [&](const std::string& token, const std::string& name, const std::string& key,
                 v1::SshKey* out) {
    v1::AddSshKeyRequest request;
    request.set_name(name);
    request.set_public_key(key);
    return keys->AddSshKey(Context(token).get(), request, out);
  };
  v1::SshKey a, again, b;
  ASSERT_TRUE(add(token_, "", key_a + "\n", &a).ok());
  EXPECT_EQ(a.name(), "a-test");
  EXPECT_EQ(a.public_key(), key_a);
  ASSERT_TRUE(add(token_, "a-test", key_a, &again).ok());  // A retry.
  EXPECT_EQ(again.id(), a.id());
  grpc::Status renamed = add(token_, "laptop", key_a, &again);
  EXPECT_EQ(renamed.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(api::ReasonOf(renamed), "SSH_KEY_EXISTS");
  grpc::Status taken = add(token_, "a-test", key_b, &again);
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(api::ReasonOf(taken), "SSH_KEY_NAME_TAKEN");

  const std::string other = CreateTenant(*svd_, "beta");
  v1::SshKey c;
  ASSERT_TRUE(add(other, "", key_c, &c).ok());
  v1::ListSshKeysResponse listed;
  ASSERT_TRUE(keys->ListSshKeys(Context(other).get(), {}, &listed).ok());
  ASSERT_EQ(listed.keys_size(), 1);
  EXPECT_EQ(listed.keys(0).id(), c.id());
  v1::DeleteSshKeyRequest steal;
  steal.set_id(a.id());
  v1::DeleteSshKeyResponse deleted;
  grpc::Status stolen = keys->DeleteSshKey(Context(other).get(), steal, &deleted);
  EXPECT_EQ(stolen.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(api::ReasonOf(stolen), "SSH_KEY_NOT_FOUND");

  AgentProcess& agent = StartAgent("node-a");
  v1::CreateInstanceRequest request;
  request.mutable_instance()->set_gpu_count(1);
  request.mutable_instance()->add_ports()->set_container_port(22);
  Instance created;
  ASSERT_TRUE(stub_->CreateInstance(Context(token_).get(), request, &created).ok());
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING)) << Slurp(svd_->log_path());
  const Instance running = Get(created.id());
  ASSERT_EQ(running.ports_size(), 1);
  EXPECT_EQ(running.ports(0).url().rfind("ssh://root@", 0), 0u) << running.ports(0).url();

  // The instance's environment names its authorized_keys file.
  const pid_t pid = agent.InstancePid(created.id());
  const std::string marker = "SV_SSH_AUTHORIZED_KEYS_FILE=";
  std::string file;
  ASSERT_TRUE(WaitFor([&] {
    const std::string environ = Slurp("/proc/" + std::to_string(pid) + "/environ");
    const size_t at = environ.find(marker);
    if (at == std::string::npos) return false;
    file = environ.substr(at + marker.size(), environ.find('\0', at) - at - marker.size());
    return true;
  }));
  // The agent rewrites the file in place (a bind mount keeps its inode), so
  // a read can land between its truncation and its write: the content is
  // read until it is whole (it starts with svagent's header line).
  auto keys_file = [&] {
    std::string text;
    WaitFor([&] {
      text = Slurp(file);
      return text.rfind("# Written by svagent", 0) == 0;
    });
    return text;
  };
  EXPECT_NE(keys_file().find(key_a + "\n"), std::string::npos) << Slurp(file);

  ASSERT_TRUE(add(token_, "b", key_b, &b).ok());
  EXPECT_TRUE(WaitFor([&] { return keys_file().find(key_b) != std::string::npos; }))
      << Slurp(file);
  v1::DeleteSshKeyRequest drop;
  drop.set_id(a.id());
  ASSERT_TRUE(keys->DeleteSshKey(Context(token_).get(), drop, &deleted).ok());
  std::string now;
  EXPECT_TRUE(WaitFor([&] {
    now = keys_file();
    return now.find(key_a) == std::string::npos;
  })) << now;
  EXPECT_NE(now.find(key_b + "\n"), std::string::npos) << now;
  EXPECT_EQ(now.find(key_c), std::string::npos) << now;
  EXPECT_EQ(keys->DeleteSshKey(Context(token_).get(), drop, &deleted).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // A member's keys go with the member.
  auto users = v1::UserService::NewStub(svd_->channel());
  v1::AddUserRequest join;
  join.set_email("dev@alpha.example");
  join.set_role(v1::TENANT_ROLE_MEMBER);
  v1::AddUserResponse member;
  ASSERT_TRUE(users->AddUser(Context(token_).get(), join, &member).ok());
  const std::string key_d =
      "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHfEEtt9IWoMZRzane5L5oxN9EqjMENrsNsXY3GBvRUL d@test";
  v1::SshKey d;
  ASSERT_TRUE(add(member.first_key().secret(), "", key_d, &d).ok());
  EXPECT_TRUE(WaitFor([&] { return keys_file().find(key_d) != std::string::npos; }))
      << Slurp(file);
  v1::RemoveUserRequest leave;
  leave.set_user_id(member.user().id());
  v1::RemoveUserResponse left;
  ASSERT_TRUE(users->RemoveUser(Context(token_).get(), leave, &left).ok());
  std::string after;
  EXPECT_TRUE(WaitFor([&] {
    after = keys_file();
    return after.find(key_d) == std::string::npos;
  })) << after;
  EXPECT_NE(after.find(key_b), std::string::npos) << after;
}

// Goal: an agent that crashes and comes back adopts the instance processes
// that kept running, so the instance never leaves RUNNING.
// A stop and a start that both land before the agent hears of the stop
// still give the tenant a fresh process, not the old one confirmed again.
TEST_F(AgentLifecycleTest, StopAndStartAtOnceRestartsTheProcess) {
  AgentProcess& agent = StartAgent("node-a");
  Instance created = Create(2);
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING)) << Slurp(svd_->log_path());
  const pid_t first = agent.InstancePid(created.id());
  ASSERT_TRUE(Alive(first));

  v1::StopInstanceRequest stop;
  stop.set_id(created.id());
  v1::StartInstanceRequest start;
  start.set_id(created.id());
  Instance out;
  ASSERT_TRUE(stub_->StopInstance(Context(token_).get(), stop, &out).ok());
  ASSERT_TRUE(stub_->StartInstance(Context(token_).get(), start, &out).ok());
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));
  EXPECT_TRUE(WaitFor([&] { return !Alive(first); })) << "the old process still runs";
  EXPECT_TRUE(WaitFor([&] {
    pid_t now = agent.InstancePid(created.id());
    return now > 0 && now != first && Alive(now);
  })) << "no fresh process";
  EXPECT_EQ(CountTransitionsTo(created.id(), v1::RUNNING), 2);
}

// Goal: a process that ended while its node was away, of an instance svd
// stopped meanwhile, does not end the instance's next run. The agent kept
// the dead process's record and forgot its run; when the tenant started the
// instance again on that node, the old exit was reported (run unknown) and
// svd ended the new run at once, as FAILED.
TEST_F(AgentLifecycleTest, AProcessThatEndedWhileTheNodeWasAwayDoesNotEndTheNextRun) {
  AgentProcess* agent = &StartAgent("node-a");
  Instance created = Create(2);
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING)) << Slurp(svd_->log_path());
  const pid_t pid = agent->InstancePid(created.id());
  ASSERT_TRUE(Alive(pid));

  // The node goes silent, and the process dies while it is away.
  agent->Kill();
  kill(-pid, SIGKILL);
  ASSERT_TRUE(WaitFor([&] { return !Alive(pid); }));
  ASSERT_TRUE(WaitForState(created.id(), v1::STOPPED));
  // It returns: svd no longer wants the instance there.
  agent = &StartAgent("node-a");
  pqxx::connection db(database_url_);
  ASSERT_TRUE(WaitFor([&] {
    pqxx::work t(db);
    return t.exec1("SELECT state = 'ready' AND last_heartbeat_at > now() - interval '1 second' "
                   "FROM nodes WHERE name = 'node-a'")[0]
        .as<bool>();
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // A few heartbeats.

  // Started again, on the only node there is.
  v1::StartInstanceRequest start;
  start.set_id(created.id());
  Instance out;
  ASSERT_TRUE(stub_->StartInstance(Context(token_).get(), start, &out).ok());
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING)) << Get(created.id()).state_reason();
  EXPECT_TRUE(WaitFor([&] {
    const pid_t now = agent->InstancePid(created.id());
    return now > 0 && now != pid && Alive(now);
  })) << "no fresh process";
  EXPECT_EQ(CountTransitionsTo(created.id(), v1::FAILED), 0);
  EXPECT_EQ(Get(created.id()).state(), v1::RUNNING);
}

TEST_F(AgentLifecycleTest, AgentCrashAndReconnect) {
  auto* agent = &StartAgent("node-a");
  Instance created = Create(4);
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));
  const pid_t pid = agent->InstancePid(created.id());
  ASSERT_TRUE(Alive(pid));

  agent->Kill();
  EXPECT_TRUE(Alive(pid)) << "instances outlive their agent";
  agent = &StartAgent("node-a");

  // A second instance can only run if the restarted agent serves the node.
  Instance second = Create(2);
  ASSERT_TRUE(WaitForState(second.id(), v1::RUNNING)) << Slurp(svd_->log_path());
  Instance after = Get(created.id());
  EXPECT_EQ(after.state(), v1::RUNNING);
  EXPECT_EQ(agent->InstancePid(created.id()), pid);
  EXPECT_TRUE(Alive(pid));
  EXPECT_EQ(CountTransitionsTo(created.id(), v1::RUNNING), 1);
  EXPECT_EQ(CountTransitionsTo(created.id(), v1::STOPPED), 0);
}

// Goal: restarting svd while agents are connected loses nothing: agents
// reconnect by themselves, running instances stay RUNNING, and new work
// reaches the agents.
TEST_F(AgentLifecycleTest, SvdRestartWhileAgentsConnected) {
  StartAgent("node-a");
  StartAgent("node-b");
  Instance first = Create(8);
  ASSERT_TRUE(WaitForState(first.id(), v1::RUNNING));

  ASSERT_EQ(svd_->Stop(), 0);
  ASSERT_TRUE(svd_->Start()) << Slurp(svd_->log_path());
  stub_ = v1::InstanceService::NewStub(svd_->channel());

  Instance second = Create(8);
  ASSERT_TRUE(WaitForState(second.id(), v1::RUNNING)) << Slurp(svd_->log_path());
  EXPECT_EQ(Get(first.id()).state(), v1::RUNNING);
  EXPECT_EQ(CountTransitionsTo(first.id(), v1::RUNNING), 1);
}

// Goal: when a node dies mid-run, its instance leaves RUNNING as of the
// node's last heartbeat (so billing charges exactly the time the node was
// alive), the node is down, and a node that comes back is reconciled.
TEST_F(AgentLifecycleTest, NodeDeathRecordsExactRunningInterval) {
  AgentProcess& agent = StartAgent("node-a");
  Instance created = Create(8);
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));
  const pid_t pid = agent.InstancePid(created.id());
  pqxx::connection db(database_url_);
  // Let a heartbeat arrive after the start, so the interval is not empty.
  ASSERT_TRUE(WaitFor([&] {
    pqxx::work t(db);
    return t.exec1("SELECT n.last_heartbeat_at > i.running_since FROM nodes n, instances i "
                   "WHERE n.name = 'node-a' AND i.id = " + t.quote(created.id()))[0]
        .as<bool>();
  }));
  agent.Kill();

  ASSERT_TRUE(WaitForState(created.id(), v1::STOPPED));
  auto events = Events(created.id());
  ASSERT_GE(events.size(), 5u);
  const auto& running = events[events.size() - 2];
  const auto& stopped = events.back();
  ASSERT_EQ(running.to_state(), v1::RUNNING);
  EXPECT_EQ(stopped.from_state(), v1::RUNNING);
  EXPECT_NE(stopped.reason().find("node-a missed heartbeats"), std::string::npos)
      << stopped.reason();

  pqxx::work txn(db);
  auto node = txn.exec1(
      "SELECT state, (extract(epoch FROM last_heartbeat_at) * 1000000)::bigint "
      "FROM nodes WHERE name = 'node-a'");
  EXPECT_EQ(node[0].as<std::string>(), "down");
  const int64_t last_heartbeat_us = node[1].as<int64_t>();
  auto micros = [](const google::protobuf::Timestamp& t) {
    return t.seconds() * 1000000 + t.nanos() / 1000;
  };
  // The RUNNING interval ends exactly at the last heartbeat, which came
  // after the start and before svd noticed the silence.
  EXPECT_EQ(micros(stopped.event_time()), last_heartbeat_us);
  EXPECT_GT(micros(stopped.event_time()), micros(running.event_time()));
  EXPECT_GT(micros(Get(created.id()).update_time()), micros(stopped.event_time()));
  auto running_since = txn.exec1("SELECT running_since IS NULL FROM instances WHERE id = " +
                                 txn.quote(created.id()));
  EXPECT_TRUE(running_since[0].as<bool>());
  txn.commit();

  // The node comes back: it is ready again and its agent stops the process
  // of the instance svd no longer wants there.
  EXPECT_TRUE(Alive(pid));
  StartAgent("node-a");
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));
  EXPECT_TRUE(WaitFor([&] {
    pqxx::work t(db);
    return t.exec1("SELECT state FROM nodes WHERE name = 'node-a'")[0].as<std::string>() ==
           "ready";
  }));
}

// Goal: an instance whose GPUs report low utilization is stopped by its
// idle policy, judged from the telemetry the agent streams.
TEST_F(AgentLifecycleTest, IdleAutoStop) {
  AgentProcess& agent = StartAgent("node-a", {"--sim-utilization-pct", "3"});
  Instance created = Create(2);
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));
  const pid_t pid = agent.InstancePid(created.id());

  v1::SetIdlePolicyRequest bad;
  bad.set_id(created.id());
  bad.set_idle_seconds(60);
  bad.set_utilization_pct(0);
  Instance ignored;
  grpc::Status status = stub_->SetIdlePolicy(Context(token_).get(), bad, &ignored);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(status), "INVALID_IDLE_POLICY");

  v1::SetIdlePolicyRequest policy;
  policy.set_id(created.id());
  policy.set_idle_seconds(1);
  policy.set_utilization_pct(10);
  ASSERT_TRUE(stub_->SetIdlePolicy(Context(token_).get(), policy, &ignored).ok());

  ASSERT_TRUE(WaitForState(created.id(), v1::STOPPED));
  const Instance stopped = Get(created.id());
  EXPECT_NE(stopped.state_reason().find("idle"), std::string::npos) << stopped.state_reason();
  EXPECT_TRUE(WaitFor([&] { return !Alive(pid); }));

  // The same telemetry stream feeds the instance's SLA window (open hour).
  v1::SlaWindow window = OpenWindow(created.id());
  EXPECT_EQ(window.gpu_count(), 2);
  EXPECT_GT(window.slots_reported(), 0);
  EXPECT_GT(window.storage_probe_count(), 0);
}

// Goal: real agents measure the fabric between them (UDP echo probes) and
// svd stores the latency histogram per instance and minute for the SLA.
TEST_F(AgentLifecycleTest, RealAgentsReportFabricLatency) {
  const std::string a = "127.0.0.1:" + std::to_string(store::PickFreePort());
  const std::string b = "127.0.0.1:" + std::to_string(store::PickFreePort());
  StartAgent("node-a", {"--probe-listen", a, "--probe-peers", b});
  StartAgent("node-b", {"--probe-listen", b, "--probe-peers", a});
  Instance created = Create(2);
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));
  int64_t probes = 0;
  EXPECT_TRUE(WaitFor([&] {
    probes = OpenWindow(created.id()).latency_sample_count();
    return probes > 0;
  })) << "no fabric latency in the SLA window";
  EXPECT_EQ(probes % 20, 0) << "20 probes per peer and telemetry round";
}

// Goal: svd rejects agents with a wrong credential or posing as another
// node, and reports about instances the node does not hold, logging each.
TEST_F(AgentLifecycleTest, BadAgentMessagesAreRejected) {
  const std::string credential = MintCredential("node-a");
  auto stub = v1::AgentService::NewStub(svd_->channel());
  const auto& registration = AgentRegistration;
  auto connect_once = [&](const std::string& token, const std::string& node) {
    auto context = Context(token);
    auto stream = stub->Connect(context.get());
    stream->Write(registration(node));
    stream->WritesDone();
    v1::ServerMessage ignored;
    while (stream->Read(&ignored)) {
    }
    return stream->Finish();
  };

  std::string wrong = credential;
  wrong.back() = wrong.back() == 'a' ? 'b' : 'a';
  grpc::Status status = connect_once(wrong, "node-a");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(status), "NODE_CREDENTIAL_WRONG");

  status = connect_once(token_, "node-a");  // A tenant key is no node credential.
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(api::ReasonOf(status), "MALFORMED_CREDENTIALS");

  status = connect_once(credential, "node-b");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(api::ReasonOf(status), "NODE_NAME_MISMATCH");

  // A node port range too small for a full node's declared ports is refused
  // at registration, so a port allocation can never come up short later.
  {
    auto small = registration("node-a");
    small.mutable_register_()->set_node_port_min(40000);
    small.mutable_register_()->set_node_port_max(40000 + 126);  // 127 ports
    auto small_context = Context(credential);
    auto small_stream = stub->Connect(small_context.get());
    small_stream->Write(small);
    small_stream->WritesDone();
    v1::ServerMessage ignored;
    while (small_stream->Read(&ignored)) {
    }
    status = small_stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(api::ReasonOf(status), "INVALID_PORT_RANGE");
  }

  // The fleet is a tree: with node-a's leaf "l" in pod "p", node-b may not
  // put "l" in another pod (one node's bad labels made every queue pass
  // fail, fleet-wide), nor node-c pod "p" in another zone.
  {
    auto refused_as = [&](const std::string& node, const std::string& zone,
                          const std::string& pod, const std::string& leaf) {
      auto message = registration(node);
      message.mutable_register_()->set_zone(zone);
      message.mutable_register_()->set_pod(pod);
      message.mutable_register_()->set_leaf_switch(leaf);
      auto topology_context = Context(MintCredential(node));
      auto topology_stream = stub->Connect(topology_context.get());
      topology_stream->Write(message);
      topology_stream->WritesDone();
      v1::ServerMessage ignored;
      while (topology_stream->Read(&ignored)) {
      }
      return topology_stream->Finish();
    };
    ASSERT_TRUE(refused_as("node-a", "z", "p", "l").ok());
    status = refused_as("node-b", "z", "q", "l");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(api::ReasonOf(status), "INVALID_TOPOLOGY") << status.error_message();
    status = refused_as("node-c", "y", "p", "m");
    EXPECT_EQ(api::ReasonOf(status), "INVALID_TOPOLOGY") << status.error_message();
    EXPECT_TRUE(refused_as("node-d", "z", "q", "m").ok());  // A new leaf and pod.
  }

  // A registered agent reporting an instance it does not hold.
  auto context = Context(credential);
  auto stream = stub->Connect(context.get());
  ASSERT_TRUE(stream->Write(registration("node-a")));
  v1::ServerMessage m;
  ASSERT_TRUE(stream->Read(&m));
  ASSERT_TRUE(m.has_registered());
  v1::AgentMessage report;
  report.mutable_report()->set_instance_id("ins-aaaaaaaaaaaaaa");
  report.mutable_report()->set_state(v1::AGENT_STARTED);
  ASSERT_TRUE(stream->Write(report));
  bool refused = false;
  while (!refused && stream->Read(&m)) {
    if (m.has_error()) {
      EXPECT_EQ(m.error().reason(), "UNKNOWN_INSTANCE");
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
  context->TryCancel();
  (void)stream->Finish();
  EXPECT_NE(Slurp(svd_->log_path()).find("ins-aaaaaaaaaaaaaa"), std::string::npos);
  EXPECT_NE(Slurp(svd_->log_path()).find("NODE_CREDENTIAL_WRONG"), std::string::npos);
}

// svd tells an agent which of its instances need no more start
// confirmations (RUNNING), so the agent confirms again, when its desired set
// changes, only the starts svd still waits for: every change of a node's set
// used to confirm every instance on it again. The start itself sends no set
// (migration 0096): the next change of the node's set carries it.
TEST_F(AgentLifecycleTest, DesiredSetSaysWhichStartsAreConfirmed) {
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(ConnectRegistered("node-a", &agent));
  auto& stream = agent.stream;
  v1::ServerMessage m;
  const Instance created = Create(4);
  // The instance `id` as the next desired set that lists it shows it.
  auto next_assignment = [&](const std::string& id, v1::InstanceAssignment* out) {
    while (stream->Read(&m)) {
      if (!m.has_desired()) continue;
      for (const auto& a : m.desired().instances()) {
        if (a.instance_id() == id) {
          *out = a;
          return true;
        }
      }
    }
    return false;
  };
  v1::InstanceAssignment assignment;
  ASSERT_TRUE(next_assignment(created.id(), &assignment));
  EXPECT_FALSE(assignment.confirmed()) << "svd waits for this node's start";
  v1::AgentMessage report;
  report.mutable_report()->set_instance_id(created.id());
  report.mutable_report()->set_state(v1::AGENT_STARTED);
  ASSERT_TRUE(stream->Write(report));
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));
  // A second instance on the node changes its set.
  const Instance second = Create(4);
  ASSERT_TRUE(next_assignment(second.id(), &assignment));
  EXPECT_FALSE(assignment.confirmed()) << "svd waits for the second start";
  bool listed = false;
  for (const auto& a : m.desired().instances()) {
    if (a.instance_id() != created.id()) continue;
    listed = true;
    EXPECT_TRUE(a.confirmed()) << "the first start needs no confirmation again";
  }
  EXPECT_TRUE(listed);
  agent.context->TryCancel();
  (void)stream->Finish();
}

// A volume detached while its node's agent was away may still be mounted
// there: the earlier connection sent it. An agent that reports its mounts
// on each connection is asked, and the detach ends on its word, not when
// svd sends the new connection's first set (svd took every volume the new
// connection had not sent as never mounted, and ended the detach at once).
TEST_F(AgentLifecycleTest, ADetachWhileTheAgentWasAwayWaitsForItsWord) {
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(ConnectRegistered("node-a", &agent, std::chrono::seconds(30), true));
  Instance created;
  v1::Volume volume;
  v1::DesiredInstances set;
  ASSERT_NO_FATAL_FAILURE(RunWithMountedVolume(agent, &created, &volume, &set));
  v1::InstanceAssignment assignment;

  // The connection ends; the tenant detaches meanwhile.
  agent.context->TryCancel();
  (void)agent.stream->Finish();
  ExpectDetachWaits(volume.id(), created.id());

  RawAgent again;
  ASSERT_NO_FATAL_FAILURE(ConnectRegistered("node-a", &again, std::chrono::seconds(30), true));
  ASSERT_TRUE(NextAssignment(again, created.id(), &assignment));
  EXPECT_EQ(assignment.volumes_size(), 0);
  // svd settles unsent detaches right after it writes a set; give it far
  // longer than that (a bound, not a timing measurement).
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  EXPECT_EQ(VolumeStateOf(volume.id()), v1::DETACHING)
      << "the detach ended before the agent said the volume was off";
  v1::AgentMessage unmounted;
  unmounted.mutable_mounts()->set_instance_id(created.id());
  ASSERT_TRUE(again.stream->Write(unmounted));
  EXPECT_TRUE(WaitFor([&] { return VolumeStateOf(volume.id()) == v1::AVAILABLE; }));
  EXPECT_EQ(Get(created.id()).state(), v1::RUNNING);
  again.context->TryCancel();
  (void)again.stream->Finish();
}

// Goal: a heartbeat's lists end a node's volume fences only when they
// reflect the last desired set svd sent the node. Lists composed before the
// agent took in a set that was on its way (one that still named the
// instance, so the agent was about to start it with the volume) would end
// the fence while the volume was about to be mounted (docs/storage.md,
// "Fences").
TEST_F(AgentLifecycleTest, OnlyListsOfTheLastSetSentEndAFence) {
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(
      ConnectRegistered("node-a", &agent, std::chrono::seconds(30), true, true));
  Instance created;
  v1::Volume volume;
  v1::DesiredInstances set;
  ASSERT_NO_FATAL_FAILURE(RunWithMountedVolume(agent, &created, &volume, &set));
  const uint64_t with_volume = set.set_number();
  EXPECT_NE(with_volume, 0u);

  // Stopped: the node is sent a set without it, and the detach waits for
  // the node's word.
  v1::StopInstanceRequest stop;
  stop.set_id(created.id());
  Instance stopped;
  ASSERT_TRUE(stub_->StopInstance(Context(token_).get(), stop, &stopped).ok());
  ASSERT_TRUE(NextSet(
      agent, [](const v1::DesiredInstances& d) { return d.instances_size() == 0; }, &set));
  EXPECT_GT(set.set_number(), with_volume);
  ExpectDetachWaits(volume.id(), created.id());

  // Complete lists naming nothing, but of the set that still named it.
  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat()->set_lists_complete(true);
  heartbeat.mutable_heartbeat()->set_applied_set_number(with_volume);
  ASSERT_TRUE(agent.stream->Write(heartbeat));
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // A bound, not a timing.
  EXPECT_EQ(VolumeStateOf(volume.id()), v1::DETACHING)
      << "lists of an older set ended the fence";
  // The same lists, of the last set: the detach completes.
  heartbeat.mutable_heartbeat()->set_applied_set_number(set.set_number());
  ASSERT_TRUE(agent.stream->Write(heartbeat));
  EXPECT_TRUE(WaitFor([&] { return VolumeStateOf(volume.id()) == v1::AVAILABLE; }));
  agent.context->TryCancel();
  (void)agent.stream->Finish();
}

// Goal: a heartbeat confirms what runs only when it reflects the last set
// svd sent. One composed before the agent took in the set that started an
// instance (after a stop, on the same node) lists the old run's process:
// it made the new run RUNNING, and billed, before it was started.
TEST_F(AgentLifecycleTest, OnlyHeartbeatsOfTheLastSetSentConfirmWhatRuns) {
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(
      ConnectRegistered("node-a", &agent, std::chrono::seconds(30), false, true));
  v1::DesiredInstances before;
  ASSERT_TRUE(NextSet(
      agent, [](const v1::DesiredInstances& d) { return d.instances_size() == 0; }, &before));
  const Instance created = Create(2);
  v1::DesiredInstances with;
  ASSERT_TRUE(NextSet(
      agent, [](const v1::DesiredInstances& d) { return d.instances_size() == 1; }, &with));
  ASSERT_EQ(Get(created.id()).state(), v1::STARTING);

  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat()->add_running_instance_ids(created.id());
  heartbeat.mutable_heartbeat()->set_lists_complete(true);
  heartbeat.mutable_heartbeat()->set_applied_set_number(before.set_number());
  ASSERT_TRUE(agent.stream->Write(heartbeat));
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // A bound, not a timing.
  EXPECT_EQ(Get(created.id()).state(), v1::STARTING) << "an older set's heartbeat confirmed it";

  // Nor does a registration listing it (the connection broke before the
  // agent applied the set): the list predates every set of the connection.
  agent.context->TryCancel();
  (void)agent.stream->Finish();
  RawAgent again;
  ASSERT_NO_FATAL_FAILURE(ConnectRegistered("node-a", &again, std::chrono::seconds(30), false,
                                            true, {created.id()}));
  ASSERT_TRUE(NextSet(
      again, [](const v1::DesiredInstances& d) { return d.instances_size() == 1; }, &with));
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // A bound, not a timing.
  EXPECT_EQ(Get(created.id()).state(), v1::STARTING) << "the registration's list confirmed it";
  heartbeat.mutable_heartbeat()->set_applied_set_number(with.set_number());
  ASSERT_TRUE(again.stream->Write(heartbeat));
  EXPECT_TRUE(WaitForState(created.id(), v1::RUNNING));
  again.context->TryCancel();
  (void)again.stream->Finish();
}

// Goal: a node whose agent cannot list its container runtime gets no new
// instances. Its heartbeats kept it ready, and instances placed there stayed
// STARTING for good: the agent could start none. Once the runtime answers
// again, the node takes placements.
TEST_F(AgentLifecycleTest, ANodeWhoseRuntimeCannotBeListedGetsNoPlacements) {
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(
      ConnectRegistered("node-a", &agent, std::chrono::seconds(30), false, true));
  v1::AgentMessage failing;
  failing.mutable_heartbeat();  // Lists not complete: the runtime could not be listed.
  ASSERT_TRUE(agent.stream->Write(failing));
  pqxx::connection db(database_url_);
  ASSERT_TRUE(WaitFor([&] {
    pqxx::work t(db);
    return !t.exec1("SELECT runtime_failing_since IS NULL FROM nodes WHERE name = 'node-a'")[0]
                .as<bool>();
  }));
  const Instance created = Create(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // A bound, not a timing.
  const Instance waiting = Get(created.id());
  EXPECT_EQ(waiting.state(), v1::PENDING);
  EXPECT_NE(waiting.state_reason().find("1 node down"), std::string::npos) << waiting.state_reason();

  v1::AgentMessage healthy;
  healthy.mutable_heartbeat()->set_lists_complete(true);
  ASSERT_TRUE(agent.stream->Write(healthy));
  v1::DesiredInstances with;
  ASSERT_TRUE(NextSet(
      agent, [](const v1::DesiredInstances& d) { return d.instances_size() == 1; }, &with));
  EXPECT_EQ(Get(created.id()).state(), v1::STARTING);
  agent.context->TryCancel();
  (void)agent.stream->Finish();
}

// A report that arrives after the instance changed (here: started, then
// deleted while the agent's report was on its way) is not the agent's
// fault: svd neither answers it with an error nor logs it as a bad
// message. A report of an instance svd never had still is refused.
TEST_F(AgentLifecycleTest, LateReportOfADeletedInstanceIsNotAnError) {
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(ConnectRegistered("node-a", &agent));
  auto& stream = agent.stream;
  v1::ServerMessage m;
  const Instance created = Create(8);
  // Started once the node was told (a start reported before that is an
  // earlier run's and counts for nothing).
  bool told = false;
  while (!told && stream->Read(&m)) {
    if (m.has_desired()) told = m.desired().instances_size() == 1;
  }
  ASSERT_TRUE(told);
  v1::AgentMessage report;
  report.mutable_report()->set_instance_id(created.id());
  report.mutable_report()->set_state(v1::AGENT_STARTED);
  ASSERT_TRUE(stream->Write(report));
  ASSERT_TRUE(WaitForState(created.id(), v1::RUNNING));

  v1::DeleteInstanceRequest del;
  del.set_id(created.id());
  Instance deleted;
  ASSERT_TRUE(stub_->DeleteInstance(Context(token_).get(), del, &deleted).ok());
  ASSERT_EQ(Get(created.id()).state(), v1::DELETED);
  // The late start report, its exit report, then one of an id svd never
  // had. Messages are handled in order, so the first error must be the
  // last report's.
  ASSERT_TRUE(stream->Write(report));
  v1::AgentMessage exited;
  exited.mutable_report()->set_instance_id(created.id());
  exited.mutable_report()->set_state(v1::AGENT_EXITED);
  ASSERT_TRUE(stream->Write(exited));
  v1::AgentMessage unknown;
  unknown.mutable_report()->set_instance_id("ins-bbbbbbbbbbbbbb");
  unknown.mutable_report()->set_state(v1::AGENT_STARTED);
  ASSERT_TRUE(stream->Write(unknown));
  bool refused = false;
  while (!refused && stream->Read(&m)) {
    if (m.has_error()) {
      EXPECT_EQ(m.error().reason(), "UNKNOWN_INSTANCE");
      EXPECT_NE(m.error().message().find("ins-bbbbbbbbbbbbbb"), std::string::npos)
          << m.error().message();
      refused = true;
    }
  }
  EXPECT_TRUE(refused);
  agent.context->TryCancel();
  (void)stream->Finish();
  EXPECT_EQ(Get(created.id()).state(), v1::DELETED);
  const std::string log = Slurp(svd_->log_path());
  EXPECT_EQ(log.find("sent a bad message: FAILED_PRECONDITION"), std::string::npos) << log;
  EXPECT_NE(log.find("ins-bbbbbbbbbbbbbb"), std::string::npos);
}

// An agent reports what one pass over its runtime saw in one message. svd
// handles the reports in order, as it would one by one: a run of starts is
// confirmed together, a start of an instance that exited before it in the
// batch is late, and an unknown id is refused without losing the others. A
// batch with a bad report, or too many, is refused whole. A heartbeat's list
// confirms what runs, in one transaction too.
TEST_F(AgentLifecycleTest, ABatchOfReportsIsHandledInOrder) {
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(ConnectRegistered("node-a", &agent));
  EXPECT_TRUE(agent.registered.accepts_report_batches());
  auto& stream = agent.stream;
  v1::ServerMessage m;
  const Instance a = Create(2), b = Create(2), c = Create(2), d = Create(2);
  // Until one desired set lists all four.
  bool listed = false;
  while (!listed && stream->Read(&m)) {
    if (m.has_desired()) listed = m.desired().instances_size() == 4;
  }
  ASSERT_TRUE(listed);
  auto report = [](v1::InstanceReports* batch, const std::string& id,
                   v1::AgentInstanceState state, int exit_code = 0) {
    auto* r = batch->add_reports();
    r->set_instance_id(id);
    r->set_state(state);
    r->set_exit_code(exit_code);
  };
  auto next_error = [&] {
    while (stream->Read(&m)) {
      if (m.has_error()) return m.error();
    }
    return v1::AgentError();
  };

  v1::AgentMessage bad;
  report(bad.mutable_reports(), a.id(), v1::AGENT_STARTED);
  report(bad.mutable_reports(), b.id(), v1::AGENT_INSTANCE_STATE_UNSPECIFIED);
  ASSERT_TRUE(stream->Write(bad));
  EXPECT_EQ(next_error().reason(), "INVALID_REPORT");
  v1::AgentMessage too_many;
  for (int i = 0; i < 65; ++i) report(too_many.mutable_reports(), a.id(), v1::AGENT_STARTED);
  ASSERT_TRUE(stream->Write(too_many));
  EXPECT_EQ(next_error().reason(), "TOO_MANY_REPORTS");
  EXPECT_NE(Get(a.id()).state(), v1::RUNNING) << "a refused batch changes nothing";

  v1::AgentMessage batch;
  report(batch.mutable_reports(), a.id(), v1::AGENT_STARTED);
  report(batch.mutable_reports(), b.id(), v1::AGENT_STARTED);
  report(batch.mutable_reports(), a.id(), v1::AGENT_STARTED);  // Again: no second event.
  report(batch.mutable_reports(), c.id(), v1::AGENT_EXITED, 3);
  report(batch.mutable_reports(), "ins-cccccccccccccc", v1::AGENT_STARTED);
  report(batch.mutable_reports(), c.id(), v1::AGENT_STARTED);  // After its exit: late.
  ASSERT_TRUE(stream->Write(batch));
  const v1::AgentError error = next_error();
  EXPECT_EQ(error.reason(), "UNKNOWN_INSTANCE");
  EXPECT_NE(error.message().find("ins-cccccccccccccc"), std::string::npos) << error.message();
  EXPECT_EQ(Get(a.id()).state(), v1::RUNNING);
  EXPECT_EQ(Get(b.id()).state(), v1::RUNNING);
  EXPECT_EQ(Get(c.id()).state(), v1::FAILED);
  for (const Instance* i : {&a, &b}) {
    int running = 0;
    for (const auto& e : Events(i->id())) running += e.to_state() == v1::RUNNING;
    EXPECT_EQ(running, 1) << i->id();
  }

  v1::AgentMessage heartbeat;
  heartbeat.mutable_heartbeat()->add_running_instance_ids(a.id());
  heartbeat.mutable_heartbeat()->add_running_instance_ids(d.id());
  heartbeat.mutable_heartbeat()->add_running_instance_ids(c.id());
  ASSERT_TRUE(stream->Write(heartbeat));
  EXPECT_TRUE(WaitForState(d.id(), v1::RUNNING));
  EXPECT_EQ(Get(c.id()).state(), v1::FAILED);
  agent.context->TryCancel();
  (void)stream->Finish();
  const std::string log = Slurp(svd_->log_path());
  EXPECT_EQ(log.find("sent a bad message: FAILED_PRECONDITION"), std::string::npos) << log;
}

// A node's desired set reaches its agent when it changes, told by the
// signal of migration 0094: the harness sets svd's backstop read to an hour,
// so nothing else brings a set within this test's bound. While the LISTEN
// connection is down svd polls instead, so a change made meanwhile still
// arrives; once the connection is back, the signal serves again.
TEST_F(AgentLifecycleTest, DesiredSetFollowsTheSignalAndPollsWhileItIsDown) {
  const char* kListening = "sv_agent_desired_signal_listening";
  const char* kBySignal = "sv_agent_desired_reads_total{cause=\"signal\"}";
  const char* kByPoll = "sv_agent_desired_reads_total{cause=\"poll\"}";
  ASSERT_TRUE(WaitFor([&] { return MetricSample(*svd_, kListening) == 1; }));
  RawAgent agent;
  ASSERT_NO_FATAL_FAILURE(ConnectRegistered("node-a", &agent, std::chrono::seconds(120)));
  auto& stream = agent.stream;
  // Until a desired set lists exactly `ids`.
  auto listed = [&](std::set<std::string> ids) {
    v1::ServerMessage m;
    while (stream->Read(&m)) {
      if (!m.has_desired()) continue;
      std::set<std::string> got;
      for (const auto& a : m.desired().instances()) got.insert(a.instance_id());
      if (got == ids) return true;
    }
    return false;
  };
  ASSERT_TRUE(listed({}));  // The first set: nothing yet.
  const double signalled = MetricSample(*svd_, kBySignal);
  const Instance first = Create(4);
  ASSERT_TRUE(listed({first.id()}));
  EXPECT_GT(MetricSample(*svd_, kBySignal), signalled);

  // The listener's backend ends, and the database refuses new connections
  // (svd's pools are open), so the listener stays down.
  const double pid = MetricSample(*svd_, "sv_agent_desired_signal_backend_pid");
  ASSERT_GT(pid, 0);
  pqxx::connection admin(database_url_ + " dbname=postgres");
  const std::string db = pqxx::connection(database_url_).dbname();
  {
    pqxx::nontransaction txn(admin);
    txn.exec("ALTER DATABASE \"" + db + "\" ALLOW_CONNECTIONS false");
    txn.exec("SELECT pg_terminate_backend(" + std::to_string(static_cast<int>(pid)) + ")");
  }
  const bool down = WaitFor([&] { return MetricSample(*svd_, kListening) == 0; });
  // The read the lost connection rang for is done once the polls begin;
  // from then on only a poll can bring a change.
  const double before = MetricSample(*svd_, kByPoll);
  const bool polling = down && WaitFor([&] { return MetricSample(*svd_, kByPoll) > before; });
  const double polled = MetricSample(*svd_, kByPoll);
  const Instance second = polling ? Create(4) : Instance();
  const bool arrived = polling && listed({first.id(), second.id()});
  const double polled_after = MetricSample(*svd_, kByPoll);
  {
    pqxx::nontransaction txn(admin);
    txn.exec("ALTER DATABASE \"" + db + "\" ALLOW_CONNECTIONS true");
  }
  ASSERT_TRUE(down);
  ASSERT_TRUE(polling);
  ASSERT_TRUE(arrived) << "a change made while the signal is down";
  EXPECT_GT(polled_after, polled);

  ASSERT_TRUE(WaitFor([&] { return MetricSample(*svd_, kListening) == 1; }));
  v1::DeleteInstanceRequest del;
  del.set_id(first.id());
  Instance deleted;
  ASSERT_TRUE(stub_->DeleteInstance(Context(token_).get(), del, &deleted).ok());
  EXPECT_TRUE(listed({second.id()}));
  agent.context->TryCancel();
  (void)stream->Finish();
}

}  // namespace
}  // namespace sv::testing
