// What svagent sends about the instances it starts, against a peer svd of
// the test's own: one InstanceReports for a pass when svd offers batches,
// and single reports to an svd that does not (one older than batches).
// svd's side of the same exchange is agent_lifecycle_test's
// ABatchOfReportsIsHandledInOrder, against the real svd.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
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

// Registers the agent, hands it kInstances instances and records what it
// sends back.
class PeerSvd final : public v1::AgentService::Service {
 public:
  explicit PeerSvd(bool offers_batches) : offers_batches_(offers_batches) {}

  grpc::Status Connect(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) override {
    v1::AgentMessage in;
    if (!stream->Read(&in) || !in.has_register_()) return grpc::Status::OK;
    v1::ServerMessage registered;
    registered.mutable_registered()->set_node_id("node-test");
    registered.mutable_registered()->set_heartbeat_interval_ms(60000);
    registered.mutable_registered()->set_accepts_report_batches(offers_batches_);
    if (!stream->Write(registered)) return grpc::Status::OK;
    v1::ServerMessage desired;
    for (int i = 0; i < kInstances; ++i) {
      auto* a = desired.mutable_desired()->add_instances();
      a->set_instance_id("ins-" + std::to_string(i));
      a->set_image("example/image");
      a->set_run(1);
      a->add_gpu_indices(i);
    }
    if (!stream->Write(desired)) return grpc::Status::OK;
    while (stream->Read(&in)) {
      std::lock_guard<std::mutex> lock(mutex_);
      received_.push_back(in);
      changed_.notify_all();
    }
    return grpc::Status::OK;
  }

  // Waits (bounded: a failure, not a timing assertion) until the agent has
  // reported kInstances starts, and returns what it sent.
  std::vector<v1::AgentMessage> WaitForStarts() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(20), [this] { return Starts() >= kInstances; });
    return received_;
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

std::vector<v1::AgentMessage> RunAgainst(bool offers_batches) {
  PeerSvd svd(offers_batches);
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
  RealClock clock;
  Agent agent(options, NewSimulatedDriver(), std::make_unique<SimulatedTelemetry>(8, 1), clock);
  std::thread running([&] { agent.Run(); });
  std::vector<v1::AgentMessage> received = svd.WaitForStarts();
  agent.Stop();
  running.join();
  server->Shutdown();
  return received;
}

TEST(ReportBatchTest, OneMessageForAPassWhenSvdOffersBatches) {
  int batches = 0, singles = 0, started = 0;
  for (const auto& m : RunAgainst(true)) {
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
  for (const auto& m : RunAgainst(false)) {
    batches += m.has_reports();
    if (m.has_report()) started += m.report().state() == v1::AGENT_STARTED;
  }
  EXPECT_EQ(started, kInstances);
  EXPECT_EQ(batches, 0);
}

}  // namespace
}  // namespace sv::agent
