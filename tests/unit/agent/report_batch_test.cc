// What svagent sends about the instances it starts, against a peer svd of
// the test's own: one InstanceReports for a pass when svd offers batches,
// and single reports to an svd that does not (one older than batches).
// svd's side of the same exchange is agent_lifecycle_test's
// ABatchOfReportsIsHandledInOrder, against the real svd. Also: a mount
// report follows every desired set that changed an instance's mounts.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "agent/runtime_driver.h"
#include "agent/telemetry.h"
#include "common/clock.h"
#include "sv/v1/agent.grpc.pb.h"
#include "sv/v1/sla.grpc.pb.h"

namespace sv::agent {
namespace {

constexpr int kInstances = 3;

// The desired set of the peer's kInstances instances, with `volume`
// mounted on ins-0 when it is not empty; `confirmed`: svd needs no more
// start reports of them.
v1::ServerMessage DesiredSet(const std::string& volume, bool confirmed) {
  v1::ServerMessage desired;
  for (int i = 0; i < kInstances; ++i) {
    auto* a = desired.mutable_desired()->add_instances();
    a->set_instance_id("ins-" + std::to_string(i));
    a->set_image("example/image");
    a->set_run(1);
    a->set_confirmed(confirmed);
    a->add_gpu_indices(i);
    if (i == 0 && !volume.empty()) {
      auto* mount = a->add_volumes();
      mount->set_volume_id(volume);
      mount->set_source("/var/lib/sv/volumes/" + volume);
      mount->set_target("/data");
    }
  }
  return desired;
}

// Registers the agent, hands it kInstances instances and records what it
// sends back.
class PeerSvd final : public v1::AgentService::Service {
 public:
  explicit PeerSvd(bool offers_batches) : offers_batches_(offers_batches) {}

  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) override {
    v1::AgentMessage in;
    if (!stream->Read(&in) || !in.has_register_()) return grpc::Status::OK;
    v1::ServerMessage registered;
    registered.mutable_registered()->set_node_id("node-test");
    registered.mutable_registered()->set_heartbeat_interval_ms(heartbeat_ms_);
    registered.mutable_registered()->set_accepts_report_batches(offers_batches_);
    if (!stream->Write(registered)) return grpc::Status::OK;
    std::chrono::milliseconds delay{0};
    v1::ServerMessage first = DesiredSet("", false);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ended_ = false;
      if (++connections_ > 1) {
        delay = later_first_set_delay_;
        first = later_first_set_ ? *later_first_set_ : DesiredSet("", delay.count() > 0);
      }
      changed_.notify_all();
    }
    std::this_thread::sleep_for(delay);
    if (!stream->Write(first)) return grpc::Status::OK;
    std::thread reader([&] {
      v1::AgentMessage message;
      while (stream->Read(&message)) {
        std::lock_guard<std::mutex> lock(mutex_);
        received_.push_back(message);
        changed_.notify_all();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      ended_ = true;
      changed_.notify_all();
    });
    // Sets the test queues (Send), written in order.
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [this] { return ended_ || hang_up_ || !outbox_.empty(); });
      if (hang_up_) {
        hang_up_ = false;
        context->TryCancel();
        break;
      }
      if (ended_) break;
      std::vector<v1::ServerMessage> out;
      std::swap(out, outbox_);
      lock.unlock();
      for (const auto& m : out) stream->Write(m);
      lock.lock();
    }
    lock.unlock();
    reader.join();
    return grpc::Status::OK;
  }

  // Queues desired sets, written back to back.
  void Send(std::vector<v1::ServerMessage> sets) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& m : sets) outbox_.push_back(std::move(m));
    changed_.notify_all();
  }

  // Waits (bounded) for a mount report of `instance_id` that lists no
  // mount, after the first `after` messages; false if none came.
  bool WaitForMountReport(const std::string& instance_id, size_t after, v1::MountReport* out) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto found = [&] {
      for (size_t i = after; i < received_.size(); ++i) {
        if (received_[i].has_mounts() && received_[i].mounts().instance_id() == instance_id &&
            received_[i].mounts().mounts().empty()) {
          *out = received_[i].mounts();
          return true;
        }
      }
      return false;
    };
    return changed_.wait_for(lock, std::chrono::seconds(20), found);
  }

  // Waits (bounded) for a report of `state` for `instance_id` among the
  // messages after the first `after`; false if none came.
  bool WaitForReport(const std::string& instance_id, v1::AgentInstanceState state, size_t after,
                     v1::InstanceReport* out = nullptr) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto found = [&] {
      for (size_t i = after; i < received_.size(); ++i) {
        std::vector<v1::InstanceReport> reports(received_[i].reports().reports().begin(),
                                                received_[i].reports().reports().end());
        if (received_[i].has_report()) reports.push_back(received_[i].report());
        for (const v1::InstanceReport& r : reports) {
          if (r.instance_id() != instance_id || r.state() != state) continue;
          if (out != nullptr) *out = r;
          return true;
        }
      }
      return false;
    };
    return changed_.wait_for(lock, std::chrono::seconds(20), found);
  }

  // Ends the agent's stream; it connects again, and this peer waits
  // `delay` before the new connection's first desired set: `first`, or the
  // one every connection gets.
  void HangUp(std::chrono::milliseconds delay,
              std::optional<v1::ServerMessage> first = std::nullopt) {
    std::lock_guard<std::mutex> lock(mutex_);
    later_first_set_delay_ = delay;
    later_first_set_ = std::move(first);
    hang_up_ = true;
    changed_.notify_all();
  }

  // Waits (bounded) until the agent has connected `n` times.
  bool WaitForConnections(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return changed_.wait_for(lock, std::chrono::seconds(20),
                             [&] { return connections_ >= n && !ended_; });
  }

  int ConnectionCount() {
    std::lock_guard<std::mutex> lock(mutex_);
    return connections_;
  }

  std::vector<v1::AgentMessage> Received() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }

  size_t ReceivedCount() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_.size();
  }

  // Waits (bounded: a failure, not a timing assertion) until the agent has
  // reported the starts the test expects (all kInstances unless told
  // otherwise), and returns what it sent.
  std::vector<v1::AgentMessage> WaitForStarts() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(20), [this] { return Starts() >= starts_; });
    return received_;
  }
  // The heartbeat interval registration gives agents (default a minute).
  void SetHeartbeatMs(int ms) { heartbeat_ms_ = ms; }
  void ExpectStarts(int n) {
    std::lock_guard<std::mutex> lock(mutex_);
    starts_ = n;
  }

 private:
  int Starts() const {
    int starts = 0;
    for (const auto& m : received_) {
      if (m.has_report()) starts += m.report().state() == v1::AGENT_STARTED;
      for (const auto& r : m.reports().reports()) starts += r.state() == v1::AGENT_STARTED;
    }
    return starts;
  }

  const bool offers_batches_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<v1::AgentMessage> received_;
  std::vector<v1::ServerMessage> outbox_;
  bool ended_ = false;
  bool hang_up_ = false;
  int connections_ = 0;
  int starts_ = kInstances;
  std::chrono::milliseconds later_first_set_delay_{0};
  std::optional<v1::ServerMessage> later_first_set_;
  int heartbeat_ms_ = 60000;
};


class PeerTelemetry final : public v1::SlaTelemetryService::Service {
 public:
  grpc::Status StreamTelemetry(grpc::ServerContext*,
                               grpc::ServerReader<v1::SlaTelemetryBatch>* reader,
                               v1::StreamTelemetryResponse*) override {
    v1::SlaTelemetryBatch ignored;
    while (reader->Read(&ignored)) {
    }
    return grpc::Status::OK;
  }
};

// Runs a real svagent against `svd`; `then` runs once the starts are in.
std::vector<v1::AgentMessage> RunAgainst(PeerSvd& svd,
                                         const std::function<void()>& then = [] {},
                                         std::unique_ptr<RuntimeDriver> driver = nullptr,
                                         const std::string& record_file = "") {
  PeerTelemetry telemetry;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&svd);
  builder.RegisterService(&telemetry);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_NE(port, 0);

  AgentOptions options;
  options.endpoint = "127.0.0.1:" + std::to_string(port);
  options.credential = "svn_test_test";
  options.node_name = "node-test";
  options.simulated = true;
  options.runtime_poll_interval = absl::Milliseconds(100);
  options.record_file = record_file;
  RealClock clock;
  Agent agent(options, driver ? std::move(driver) : NewSimulatedDriver(),
              std::make_unique<SimulatedTelemetry>(8, 1), clock);
  std::thread running([&] { agent.Run(); });
  std::vector<v1::AgentMessage> received = svd.WaitForStarts();
  then();
  agent.Stop();
  running.join();
  server->Shutdown();
  return received;
}

// The simulated runtime, whose instances end when the test says.
class ExitingDriver final : public RuntimeDriver {
 public:
  std::string Name() const override { return inner_->Name(); }
  absl::Status Start(const RuntimeInstance& instance) override {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_.erase(instance.instance_id);
    calls_.push_back("start " + instance.instance_id + " run " + std::to_string(instance.run) +
                     " gpus " + Gpus(instance.gpu_indices));
    return inner_->Start(instance);
  }
  absl::Status Stop(const std::string& instance_id) override {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_.erase(instance_id);
    calls_.push_back("stop " + instance_id);
    return inner_->Stop(instance_id);
  }
  // Every Start ("start <id> run <run> gpus <i,j>") and Stop ("stop <id>").
  std::vector<std::string> Calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }
  absl::StatusOr<std::vector<RuntimeStatus>> List() override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto list = inner_->List();
    if (!list.ok()) return list;
    for (RuntimeStatus& s : *list) {
      auto it = exited_.find(s.instance_id);
      if (it == exited_.end()) continue;
      s.running = false;
      s.exit_code = it->second;
      s.detail = "exited with code " + std::to_string(it->second);
    }
    return list;
  }
  // The instance's process ends with `code`.
  void Exit(const std::string& instance_id, int code) {
    std::lock_guard<std::mutex> lock(mutex_);
    exited_[instance_id] = code;
  }
  bool Running(const std::string& instance_id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto list = inner_->List();
    if (!list.ok()) return false;
    for (const RuntimeStatus& s : *list) {
      if (s.instance_id == instance_id) return s.running && !exited_.count(instance_id);
    }
    return false;
  }

 private:
  std::unique_ptr<RuntimeDriver> inner_ = NewSimulatedDriver();
  std::mutex mutex_;
  static std::string Gpus(const std::vector<int>& gpus) {
    std::string out;
    for (int g : gpus) out += (out.empty() ? "" : ",") + std::to_string(g);
    return out;
  }
  std::map<std::string, int> exited_;
  std::vector<std::string> calls_;
};

TEST(ReportBatchTest, OneMessageForAPassWhenSvdOffersBatches) {
  int batches = 0, singles = 0, started = 0;
  PeerSvd svd(true);
  for (const auto& m : RunAgainst(svd)) {
    singles += m.has_report();
    if (!m.has_reports()) continue;
    ++batches;
    for (const auto& r : m.reports().reports()) started += r.state() == v1::AGENT_STARTED;
  }
  EXPECT_EQ(started, kInstances);
  EXPECT_EQ(batches, 1) << "the three starts of one pass";
  EXPECT_EQ(singles, 0);
}

TEST(ReportBatchTest, SingleReportsToAnSvdWithoutBatches) {
  int batches = 0, started = 0;
  PeerSvd svd(false);
  for (const auto& m : RunAgainst(svd)) {
    batches += m.has_reports();
    if (m.has_report()) started += m.report().state() == v1::AGENT_STARTED;
  }
  EXPECT_EQ(started, kInstances);
  EXPECT_EQ(batches, 0);
}

// A volume attached and detached again before the agent's next pass was
// never mounted, and nothing changed on the node; svd still waits for a
// report that it is not mounted to end the detach. Sets that come close
// together are the rule since svd sends them on a signal (docs/agent.md),
// not every 500 ms: this report was missing, and the detach never ended.
TEST(MountReportTest, ASetThatChangedAnInstancesMountsGetsAReport) {
  PeerSvd svd(true);
  bool reported = false;
  v1::MountReport report;
  RunAgainst(svd, [&] {
    const size_t before = svd.ReceivedCount();
    svd.Send({DesiredSet("vol-a", true), DesiredSet("", true)});
    reported = svd.WaitForMountReport("ins-0", before, &report);
  });
  ASSERT_TRUE(reported) << "no report that ins-0 has nothing mounted";
  EXPECT_TRUE(report.error().empty()) << report.error();
}

// An agent that connects again knows nothing of what svd wants until the
// new connection's first desired set: it must not take the instances
// running on the node for unwanted meanwhile. (Until 2026-12-07 its first
// pass came 50 ms after registering, and an svd slower than that to send
// the set had every container on the node removed at each reconnect.)
TEST(ReconnectTest, InstancesRunOnUntilTheFirstDesiredSetComes) {
  PeerSvd svd(true);
  std::vector<v1::AgentMessage> after;
  size_t before = 0;
  RunAgainst(svd, [&] {
    before = svd.ReceivedCount();
    svd.HangUp(std::chrono::milliseconds(1500));
    ASSERT_TRUE(svd.WaitForConnections(2));
    // Past the delayed set and a few of the agent's passes after it.
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    after = svd.Received();
  });
  int stopped = 0;
  for (size_t i = before; i < after.size(); ++i) {
    if (after[i].has_report()) stopped += after[i].report().state() == v1::AGENT_STOPPED;
    for (const auto& r : after[i].reports().reports()) stopped += r.state() == v1::AGENT_STOPPED;
    // The re-registration lists what runs: all of them, still.
    if (after[i].has_register_()) {
      EXPECT_EQ(after[i].register_().running_instance_ids_size(), kInstances);
    }
  }
  EXPECT_EQ(stopped, 0) << "instances were stopped before svd said what it wants";
}

// An instance ended, and the connection broke before svd read the report:
// svd, not knowing, still wants it under the same run. The runtime has
// forgotten the ended process, so the next connection's first pass took the
// instance for one to start, ran the tenant's finished job again, and svd
// never heard it had ended. Now the exit is told again and nothing starts.
TEST(ReconnectTest, AnExitWhoseReportWasLostIsToldAgainNotStarted) {
  PeerSvd svd(true);
  auto owned = std::make_unique<ExitingDriver>();
  ExitingDriver* driver = owned.get();
  bool told_again = false;
  v1::InstanceReport retold;
  size_t before = 0;
  RunAgainst(
      svd,
      [&] {
        driver->Exit("ins-0", 3);
        ASSERT_TRUE(svd.WaitForReport("ins-0", v1::AGENT_EXITED, 0));
        before = svd.ReceivedCount();
        // This peer forgets the report: its next connection sends the set
        // it sent before, as an svd that never read it would.
        svd.HangUp(std::chrono::milliseconds(0));
        ASSERT_TRUE(svd.WaitForConnections(2));
        told_again = svd.WaitForReport("ins-0", v1::AGENT_EXITED, before, &retold);
        // Past a few of the agent's passes (100 ms apart) after the set.
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        EXPECT_FALSE(driver->Running("ins-0")) << "the ended instance was started again";
        EXPECT_TRUE(driver->Running("ins-1"));
      },
      std::move(owned));
  ASSERT_TRUE(told_again) << "the new connection did not tell svd that ins-0 ended";
  EXPECT_EQ(retold.exit_code(), 3);
  EXPECT_EQ(retold.run(), 1);
  EXPECT_EQ(retold.reason(), "exited with code 3");
  int started_again = 0;
  for (size_t i = before; i < svd.Received().size(); ++i) {
    const v1::AgentMessage& m = svd.Received()[i];
    for (const auto& r : m.reports().reports()) {
      started_again += r.instance_id() == "ins-0" && r.state() == v1::AGENT_STARTED;
    }
  }
  EXPECT_EQ(started_again, 0);
}

// The same, across a restart of the svagent process: the exit was read
// from the runtime (which then forgot the instance) and reported on a
// stream that broke before svd read it, and the process was restarted.
// What the agent knew of ended instances was the process's own, so the
// restarted agent started the finished job again. It is now kept in the
// state dir, told again, and the instance is not started.
TEST(ReconnectTest, ARestartedAgentTellsAnExitAgainAndDoesNotStartIt) {
  const std::string dir = ::testing::TempDir() + "/sv-ended-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string record_file = dir + "/instances.json";
  {
    PeerSvd svd(true);
    auto owned = std::make_unique<ExitingDriver>();
    ExitingDriver* driver = owned.get();
    RunAgainst(
        svd,
        [&] {
          driver->Exit("ins-0", 3);
          ASSERT_TRUE(svd.WaitForReport("ins-0", v1::AGENT_EXITED, 0));
        },
        std::move(owned), record_file);
  }
  // A new process with a new runtime that knows nothing of ins-0, against
  // an svd that never read the report: it wants ins-0 under run 1 still.
  PeerSvd svd(true);
  svd.ExpectStarts(kInstances - 1);
  auto owned = std::make_unique<ExitingDriver>();
  ExitingDriver* driver = owned.get();
  bool told = false;
  v1::InstanceReport retold;
  RunAgainst(
      svd,
      [&] {
        told = svd.WaitForReport("ins-0", v1::AGENT_EXITED, 0, &retold);
        // Past a few of the agent's passes (100 ms apart) after the set.
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        EXPECT_FALSE(driver->Running("ins-0")) << "the ended instance was started again";
        EXPECT_TRUE(driver->Running("ins-1"));
      },
      std::move(owned), record_file);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(told) << "the restarted agent did not tell svd that ins-0 ended";
  EXPECT_EQ(retold.exit_code(), 3);
  EXPECT_EQ(retold.run(), 1);
  EXPECT_EQ(retold.reason(), "exited with code 3");
  for (const v1::AgentMessage& m : svd.Received()) {
    for (const auto& r : m.reports().reports()) {
      EXPECT_FALSE(r.instance_id() == "ins-0" && r.state() == v1::AGENT_STARTED)
          << "the restarted agent started ins-0";
    }
  }
}

// While the agent's connection was down, svd stopped ins-0, placed another
// tenant's instance on its GPU, and started ins-0 again on another GPU of
// the node: a new run. The old run's process still runs. The run each
// instance runs under was the connection's own, so the new connection took
// the old process for the new run, confirmed it, and it went on using GPU 0
// (another tenant's) while the GPU svd gave it sat idle and billed.
TEST(ReconnectTest, AnOldRunsProcessIsReplacedAfterAReconnect) {
  PeerSvd svd(true);
  auto owned = std::make_unique<ExitingDriver>();
  ExitingDriver* driver = owned.get();
  std::vector<std::string> calls;
  RunAgainst(
      svd,
      [&] {
        v1::ServerMessage moved = DesiredSet("", false);
        moved.mutable_desired()->mutable_instances(0)->set_run(2);
        moved.mutable_desired()->mutable_instances(0)->clear_gpu_indices();
        moved.mutable_desired()->mutable_instances(0)->add_gpu_indices(3);
        moved.mutable_desired()->mutable_instances(1)->set_image("another/tenant");
        moved.mutable_desired()->mutable_instances(1)->set_instance_id("ins-other");
        moved.mutable_desired()->mutable_instances(1)->clear_gpu_indices();
        moved.mutable_desired()->mutable_instances(1)->add_gpu_indices(0);
        const size_t before = svd.ReceivedCount();
        svd.HangUp(std::chrono::milliseconds(0), moved);
        ASSERT_TRUE(svd.WaitForConnections(2));
        ASSERT_TRUE(svd.WaitForReport("ins-other", v1::AGENT_STARTED, before));
        // Past a few of the agent's passes (100 ms apart) after the set.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        calls = driver->Calls();
      },
      std::move(owned));
  auto at = [&](const std::string& call) {
    return std::find(calls.begin(), calls.end(), call) - calls.begin();
  };
  const auto stop = at("stop ins-0");
  const auto restart = at("start ins-0 run 2 gpus 3");
  EXPECT_LT(stop, static_cast<long>(calls.size())) << "run 1's process of ins-0 was kept";
  EXPECT_LT(restart, static_cast<long>(calls.size())) << "ins-0 was not started under run 2";
  EXPECT_LT(stop, restart);
}

// svd's write of an exit can fail (a database outage, a lock timeout); it
// logs that and goes on wanting the instance. Told once per connection, the
// instance stayed RUNNING, billed and holding its GPUs for as long as the
// stream lived. The agent now tells it again every heartbeat interval
// while svd still wants the instance under the run it ended in.
TEST(ReconnectTest, AnExitSvdDidNotRecordIsToldAgainOnTheSameConnection) {
  PeerSvd svd(true);
  svd.SetHeartbeatMs(200);
  auto owned = std::make_unique<ExitingDriver>();
  ExitingDriver* driver = owned.get();
  bool told_again = false;
  RunAgainst(
      svd,
      [&] {
        driver->Exit("ins-0", 3);
        ASSERT_TRUE(svd.WaitForReport("ins-0", v1::AGENT_EXITED, 0));
        // This peer never takes the instance out of its set, as an svd
        // whose write failed would not.
        const size_t before = svd.ReceivedCount();
        told_again = svd.WaitForReport("ins-0", v1::AGENT_EXITED, before);
        EXPECT_FALSE(driver->Running("ins-0")) << "the ended instance was started again";
      },
      std::move(owned));
  EXPECT_TRUE(told_again) << "the exit was told once, and svd never recorded it";
  EXPECT_EQ(svd.ConnectionCount(), 1) << "told again on a new connection, not the same one";
}

// A volume was detached while the agent's connection was down: the next
// connection's first set no longer lists it. The agent must take it off the
// instance and say so, or svd's detach waits for ever (or, worse, is taken
// as done while the volume is still mounted). What is mounted used to be
// the connection's own knowledge: the new connection took the instance to
// have exactly what the set listed, changed nothing and reported nothing.
TEST(ReconnectTest, AVolumeDetachedWhileDisconnectedIsUnmountedAndReported) {
  PeerSvd svd(true);
  bool mounted = false;
  bool reported = false;
  v1::MountReport report;
  RunAgainst(svd, [&] {
    svd.Send({DesiredSet("vol-1", true)});
    for (int i = 0; i < 200 && !mounted; ++i) {
      for (const auto& m : svd.Received()) {
        mounted |= m.has_mounts() && m.mounts().instance_id() == "ins-0" &&
                   m.mounts().mounts_size() == 1 && m.mounts().mounts(0).volume_id() == "vol-1";
      }
      if (!mounted) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(mounted) << "vol-1 was never reported mounted";
    const size_t before = svd.ReceivedCount();
    svd.HangUp(std::chrono::milliseconds(0));  // The next set has no volume.
    ASSERT_TRUE(svd.WaitForConnections(2));
    reported = svd.WaitForMountReport("ins-0", before, &report);
  });
  ASSERT_TRUE(reported) << "no report that ins-0 no longer has vol-1";
  EXPECT_TRUE(report.error().empty()) << report.error();
}

}  // namespace
}  // namespace sv::agent
