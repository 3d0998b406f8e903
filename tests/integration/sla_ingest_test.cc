// Telemetry ingest's attribution, in process, on a real PostgreSQL and a
// real gRPC stream with a node credential: a GPU sample counts only for the
// RUNNING instance holding that GPU of the reporting node (in the
// instance's own GPU numbering), probes and histograms only for instances
// on that node, and the stream's cached map of GPUs to instances follows a
// new allocation. The ingest path attributes per batch and packs samples
// (sla/monitor.h PackedBatch), so these are the semantics it must keep.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <ios>
#include <pqxx/pqxx>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/telemetry.h"
#include "api/agent_service.h"
#include "api/sla_service.h"
#include "google/protobuf/util/time_util.h"
#include "sla/latency_histogram.h"
#include "sla/runtime.h"
#include "store/sla_store.h"
#include "store/store.h"
#include "sv/v1/sla.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using google::protobuf::util::TimeUtil;
const absl::Time kHour = absl::FromUnixSeconds(1'793'613'600);  // 2026-11-02T10:00Z

google::protobuf::Timestamp Ts(absl::Time t) {
  return TimeUtil::MicrosecondsToTimestamp(absl::ToUnixMicros(t));
}

class SlaIngestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = CreateMigratedDatabase(&url_);
    ASSERT_NE(db_, nullptr);
    // node-a: ins-a holds GPUs 2..5 (its GPUs 0..3), GPUs 0, 1, 6 and 7 are
    // free. node-b: ins-b holds GPUs 0 and 1.
    Sql("INSERT INTO tenants (id, name, created_at) VALUES ('ten-1', 't', now())");
    Instance("ins-a", 4);
    Instance("ins-b", 2);
    Sql("INSERT INTO nodes (id, name, zone, pod, leaf_switch, gpu_model, gpu_count, state, "
        "simulated, last_heartbeat_at, created_at) VALUES "
        "('nod-a', 'node-a', 'z', 'p', 'leaf-0', 'RTX 4090', 8, 'ready', true, now(), now()), "
        "('nod-b', 'node-b', 'z', 'p', 'leaf-0', 'RTX 4090', 8, 'ready', true, now(), now())");
    Sql("INSERT INTO gpu_reservations (node_id, gpu_index, instance_id, reserved_at) "
        "SELECT 'nod-a', g, 'ins-a', now() FROM generate_series(2, 5) g "
        "UNION ALL SELECT 'nod-b', g, 'ins-b', now() FROM generate_series(0, 1) g");

    store_ = std::make_unique<store::Store>(*db_);
    agents_ = std::make_unique<api::AgentApi>(*store_, clock_, nullptr, api::AgentApiOptions{});
    runtime_ = std::make_unique<sla::Runtime>(*db_, clock_, sla::SlaOptions{});
    sla_ = std::make_unique<api::SlaApi>(*store_, clock_, *runtime_, *agents_,
                                         api::AuthOptions{}, nullptr);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    sla_->RegisterWith(builder);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ && port != 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials());
    auto credential = agents_->CreateNodeCredential("node-a");
    ASSERT_TRUE(credential.ok()) << credential.status();
    credential_ = *credential;
  }

  void TearDown() override {
    if (sla_) sla_->Stop();
    if (server_) server_->Shutdown();
  }

  void Sql(const std::string& sql) { ExecSql(url_, sql); }

  // ins-a charged (4 GPUs at 1,000 µ¥) for minutes `from` to `to` of kHour.
  void ChargeMinutes(int from, int to) {
    const int64_t first = absl::ToUnixSeconds(kHour) / 60;
    Sql(absl::StrCat(
        "INSERT INTO ledger_charges (instance_no, tenant_no, minute, gpu_count, unit_price, "
        "trial_micros, main_account, main_micros, revenue_account, at) SELECT i.billing_no, "
        "t.billing_no, m, 4, 1000, 0, 1, 4000, 2, now() FROM instances i, tenants t, "
        "generate_series(", first + from, ", ", first + to,
        ") m WHERE i.id = 'ins-a' AND t.id = 'ten-1'"));
  }

  // A state change of ins-a, `after` into kHour.
  void Event(absl::Duration after, const char* from, const char* to) {
    Sql(absl::StrCat("INSERT INTO instance_events (instance_id, at, from_state, to_state, "
                     "reason) VALUES ('ins-a', to_timestamp(",
                     absl::ToUnixSeconds(kHour + after), "), '", from, "', '", to,
                     "', 'test')"));
  }

  std::vector<store::SlaRent> RentsOfTheHour() {
    std::vector<store::SlaRent> rents;
    EXPECT_TRUE(db_->Transact([&](pqxx::work& txn) {
                     rents = store::SlaStore::ReadRents(txn, kHour);
                     return absl::OkStatus();
                   }).ok());
    return rents;
  }

  void Instance(const std::string& id, int gpus) {
    Sql(absl::StrCat(
        "INSERT INTO instances (id, tenant_id, name, gpu_count, gpu_model, image, state, "
        "request_id, request_fingerprint, created_at, updated_at, running_since) VALUES ('",
        id, "', 'ten-1', '", id, "', ", gpus, ", 'RTX 4090', 'img', 'RUNNING', 'r-", id,
        "', 'f', now(), now(), to_timestamp(", absl::ToUnixSeconds(kHour - absl::Hours(1)),
        "))"));
  }

  // Six 10-second slots from `from`: every GPU of the node, a storage probe
  // and a latency histogram (100 probes) for each of `instances`.
  static v1::SlaTelemetryBatch Batch(absl::Time from, const std::vector<std::string>& instances,
                                     int throttled_gpu = -1) {
    v1::SlaTelemetryBatch batch;
    for (int s = 0; s < 6; ++s) {
      const auto at = Ts(from + absl::Seconds(10 * s + 5));
      for (int g = 0; g < 8; ++g) {
        auto* x = batch.add_gpu_samples();
        x->set_gpu_index(g);
        *x->mutable_sample_time() = at;
        x->set_utilization_pct(90);
        if (g == throttled_gpu && s == 1) x->set_throttle_reasons(agent::kThrottleHwThermal);
        if (g == throttled_gpu && s == 2) x->set_throttle_reasons(agent::kThrottleGpuIdle);
      }
      for (const auto& id : instances) {
        auto* p = batch.add_storage_probes();
        p->set_instance_id(id);
        *p->mutable_probe_time() = at;
        p->set_bytes_written(s == 3 ? 1'000'000 : 4'000'000);
        p->set_duration_us(1'000);
        auto* h = batch.add_latency();
        h->set_instance_id(id);
        *h->mutable_sample_time() = at;
        h->add_bucket_indices(sla::LatencyHistogram::BucketOf(2'000'000));
        h->add_bucket_counts(99);
        h->add_bucket_indices(sla::LatencyHistogram::BucketOf(9'000'000));
        h->add_bucket_counts(1);
      }
    }
    return batch;
  }

  v1::StreamTelemetryResponse Send(const std::vector<v1::SlaTelemetryBatch>& batches) {
    auto stub = v1::SlaTelemetryService::NewStub(channel_);
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + credential_);
    v1::StreamTelemetryResponse response;
    auto writer = stub->StreamTelemetry(&context, &response);
    for (const auto& b : batches) EXPECT_TRUE(writer->Write(b));
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  std::string url_;
  std::unique_ptr<store::Database> db_;
  FakeClock clock_{kHour + absl::Minutes(30)};
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<api::AgentApi> agents_;
  std::unique_ptr<sla::Runtime> runtime_;
  std::unique_ptr<api::SlaApi> sla_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::string credential_;
};

// Goal: only the reporting node's held GPUs and its own instances count,
// each GPU as its instance's ordinal, platform throttling is unusable time
// and the tenant's idle throttle is not.
TEST_F(SlaIngestTest, SamplesCountOnlyForTheInstanceHoldingTheGpu) {
  // Node GPU 3 is ins-a's GPU 1; ins-b runs on node-b, not on node-a.
  auto r = Send({Batch(kHour, {"ins-a", "ins-b"}, 3)});
  EXPECT_EQ(r.batches(), 1);
  // ins-a: 6 x 4 GPU samples, 6 probes, 6 histograms of 100.
  EXPECT_EQ(r.samples_accepted(), 6 * 4 + 6 + 600);
  // Free GPUs 0, 1, 6, 7, and ins-b's probes and histograms (one each).
  EXPECT_EQ(r.samples_dropped(), 6 * 4 + 6 + 6);
  EXPECT_EQ(r.samples_late(), 0);

  auto a = runtime_->monitor().Find("ins-a", kHour);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->window.gpu_count(), 4);
  EXPECT_EQ(a->window.ReportedSlots(kHour, kHour + absl::Minutes(1)), 6);
  EXPECT_EQ(a->window.UsableSlots(kHour, kHour + absl::Minutes(1)), 5)
      << "the thermal slot of node GPU 3 is lost, its idle slot is not";
  EXPECT_TRUE(a->window.unusable(1).test(1)) << "node GPU 3 is ins-a's GPU 1";
  EXPECT_EQ(a->window.unusable(1).count(), 1u);
  for (int g : {0, 2, 3}) EXPECT_EQ(a->window.unusable(g).count(), 0u);
  EXPECT_EQ(a->window.storage_probe_count(), 6);
  EXPECT_EQ(a->window.storage_min_bytes_per_second(), 1'000'000'000);
  EXPECT_EQ(a->window.storage_mean_bytes_per_second(), (5 * 4'000'000'000LL + 1'000'000'000) / 6);
  EXPECT_EQ(a->window.latency().count(), 600);
  EXPECT_EQ(a->window.latency().Quantile(0.99),
            sla::LatencyHistogram::ValueOf(sla::LatencyHistogram::BucketOf(2'000'000)));
  EXPECT_EQ(a->node_names, std::vector<std::string>{"node-a"});
  EXPECT_FALSE(runtime_->monitor().Find("ins-b", kHour).has_value())
      << "node-a cannot report for node-b's instance";
  EXPECT_EQ(runtime_->monitor().window_count(), 1);
}

// Goal: an instance placed on the node's free GPUs while a stream is open
// gets that GPU's samples from the next batch on (the stream looks again
// for a GPU it does not know), and not the samples sent before.
TEST_F(SlaIngestTest, ANewAllocationIsFollowedByTheOpenStream) {
  auto stub = v1::SlaTelemetryService::NewStub(channel_);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + credential_);
  v1::StreamTelemetryResponse response;
  auto writer = stub->StreamTelemetry(&context, &response);
  ASSERT_TRUE(writer->Write(Batch(kHour, {"ins-a"})));
  // Both batches in one stream: wait until the first is in before the
  // allocation changes.
  for (int i = 0; i < 200 && !runtime_->monitor().Find("ins-a", kHour); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Instance("ins-c", 2);
  Sql("INSERT INTO gpu_reservations (node_id, gpu_index, instance_id, reserved_at) "
      "SELECT 'nod-a', g, 'ins-c', now() FROM generate_series(6, 7) g");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // > the 250 ms refresh floor.
  ASSERT_TRUE(writer->Write(Batch(kHour + absl::Minutes(1), {"ins-a", "ins-c"})));
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.batches(), 2);
  // Batch 1: ins-a 630 accepted, GPUs 0, 1, 6, 7 dropped. Batch 2: ins-a
  // and ins-c 630 + 12 + 6 + 600, GPUs 0 and 1 dropped.
  EXPECT_EQ(response.samples_accepted(), 630 + 630 + 12 + 6 + 600);
  EXPECT_EQ(response.samples_dropped(), 24 + 12);

  auto c = runtime_->monitor().Find("ins-c", kHour);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->window.gpu_count(), 2);
  EXPECT_EQ(c->window.ReportedSlots(kHour, kHour + absl::Minutes(1)), 0)
      << "samples sent before the allocation are nobody's";
  EXPECT_EQ(c->window.ReportedSlots(kHour + absl::Minutes(1), kHour + absl::Minutes(2)), 6);
  auto a = runtime_->monitor().Find("ins-a", kHour);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->window.ReportedSlots(kHour, kHour + absl::Minutes(2)), 12);
}

// Goal: a sample stamped after the grace period of its hour is late (not
// counted, recorded as ignored), one stamped too far ahead is dropped, and
// a zero timestamp means "now".
TEST_F(SlaIngestTest, LateFutureAndUnstampedSamples) {
  clock_.Advance(absl::Minutes(40));  // 11:10, past hour 10's 5-minute grace.
  const absl::Time now = kHour + absl::Minutes(70);
  v1::SlaTelemetryBatch batch = Batch(kHour, {"ins-a"});
  // Stamped 11:11:35 to 11:12:25: the last three slots are more than the
  // allowed 2 minutes ahead of svd's clock.
  v1::SlaTelemetryBatch ahead = Batch(now + absl::Seconds(90), {"ins-a"});
  v1::SlaTelemetryBatch unstamped = Batch(kHour, {"ins-a"});
  for (auto& s : *unstamped.mutable_gpu_samples()) s.clear_sample_time();
  for (auto& p : *unstamped.mutable_storage_probes()) p.clear_probe_time();
  for (auto& l : *unstamped.mutable_latency()) l.clear_sample_time();
  auto r = Send({batch, ahead, unstamped});
  // One slot of ins-a weighs 4 GPU samples + 1 probe + 100 latency probes.
  EXPECT_EQ(r.samples_late(), 6 * 105);
  EXPECT_EQ(r.samples_accepted(), 3 * 105 + 6 * 105);
  EXPECT_EQ(r.samples_dropped(), 3 * 24 + 3 * 105);
  auto a = runtime_->monitor().Find("ins-a", kHour + absl::Hours(1));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->window.ReportedSlots(kHour + absl::Hours(1), kHour + absl::Hours(2)), 3 + 1)
      << "the unstamped samples land in the slot of 11:10";
  EXPECT_TRUE(a->window.reported(0).test(60));  // 11:10 is slot 60.
  EXPECT_EQ(a->window.storage_probe_count(), 3 + 6);
  EXPECT_EQ(a->window.latency().count(), 900);
  EXPECT_FALSE(runtime_->monitor().Find("ins-a", kHour).has_value());
  auto late = runtime_->monitor().TakeLateCounts();
  EXPECT_EQ((late[{"ins-a", kHour}]), 6 * 105);
}

// Goal: a node cannot spoil time it did not serve: samples stamped before
// the instance's run on it began (beyond one slot of slack) are dropped,
// so after a move the new node cannot back-date faults onto the old
// node's minutes; and latency buckets no real latency has, or counts that
// could overflow an hour's sums, are dropped.
TEST_F(SlaIngestTest, BackDatedSamplesAndImpossibleBucketsAreDropped) {
  // ins-a's run here began at 10:20.
  Sql(absl::StrCat("UPDATE instances SET running_since = to_timestamp(",
                   absl::ToUnixSeconds(kHour + absl::Minutes(20)), ") WHERE id = 'ins-a'"));
  v1::SlaTelemetryBatch before = Batch(kHour + absl::Minutes(10), {"ins-a"}, 3);
  for (auto& g : *before.mutable_gpu_samples()) g.set_xid_errors(1);
  v1::SlaTelemetryBatch after = Batch(kHour + absl::Minutes(20), {"ins-a"});
  v1::SlaTelemetryBatch bad = Batch(kHour + absl::Minutes(21), {});
  auto* h = bad.add_latency();
  h->set_instance_id("ins-a");
  *h->mutable_sample_time() = Ts(kHour + absl::Minutes(21));
  h->add_bucket_indices(100'000);  // No latency is that long.
  h->add_bucket_counts(1);
  auto* z = bad.add_latency();
  z->set_instance_id("ins-a");
  *z->mutable_sample_time() = Ts(kHour + absl::Minutes(21));
  z->set_zero_count(int64_t{1} << 62);
  auto r = Send({before, after, bad});
  // before: all 6 slots (4 GPU samples, a probe, a histogram) and the 4
  // free GPUs; after: the free GPUs only; bad: the free GPUs and the two
  // histograms.
  EXPECT_EQ(r.samples_dropped(), 6 * (4 + 1 + 1) + 6 * 4 + 6 * 4 + 6 * 4 + 2);
  auto a = runtime_->monitor().Find("ins-a", kHour);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->window.ReportedSlots(kHour, kHour + absl::Minutes(20)), 0);
  EXPECT_EQ(a->window.ReportedSlots(kHour + absl::Minutes(20), kHour + absl::Minutes(22)), 12);
  EXPECT_EQ(a->window.UsableSlots(kHour + absl::Minutes(20), kHour + absl::Minutes(22)), 12);
  EXPECT_EQ(a->window.latency().count(), 600);
}

// Goal: a stop that the run goes on after (started again within the next
// minute) leaves its minute and the next out of the judged minutes: the
// charged minutes stay back to back, and the seconds in between, with no
// GPU held and nothing reported, were judged as unusable, so two such
// restarts an hour (about 22 of 360 slots) earned a 10% refund. A stop
// that ends a run is a run edge as before.
TEST_F(SlaIngestTest, MinutesAroundAQuickRestartAreNotJudged) {
  const int64_t first = absl::ToUnixSeconds(kHour) / 60;
  // Charged :00 to :50; stopped at :10:05 and running again at :11:55,
  // stopped for good at :50:05.
  ChargeMinutes(0, 50);
  Event(absl::Minutes(10) + absl::Seconds(5), "RUNNING", "STOPPED");
  Event(absl::Minutes(11) + absl::Seconds(55), "STARTING", "RUNNING");
  Event(absl::Minutes(50) + absl::Seconds(5), "RUNNING", "STOPPED");
  const std::vector<store::SlaRent> rents = RentsOfTheHour();
  ASSERT_EQ(rents.size(), 1u);
  EXPECT_EQ(rents[0].rent_micros, 51 * 4000);
  uint64_t expected = 0;
  for (int m = 0; m <= 50; ++m) {
    if (m != 10 && m != 11) expected |= uint64_t{1} << m;
  }
  EXPECT_EQ(rents[0].charged_minutes, expected) << std::hex << rents[0].charged_minutes;
  EXPECT_EQ(rents[0].first_minute, first);
  EXPECT_EQ(rents[0].last_minute, first + 50);
}

// Two quick runs inside two charged minutes: running :20:10, stopped
// :20:20, running again :20:40, stopped for good :21:10. The stop's minute
// and the next were left out, which left the hour no charged minute: its
// window was written with billed_minutes 0, refused by the table's CHECK,
// and the judge retried the hour for ever (no refunds for anyone, every
// month-end invoice held). The hour's only minutes are kept and judged.
TEST_F(SlaIngestTest, AnHourOfOnlyQuickRestartMinutesIsStillJudged) {
  ChargeMinutes(20, 21);
  Event(absl::Minutes(20) + absl::Seconds(20), "RUNNING", "STOPPED");
  Event(absl::Minutes(20) + absl::Seconds(40), "STARTING", "RUNNING");
  Event(absl::Minutes(21) + absl::Seconds(10), "RUNNING", "STOPPED");
  const std::vector<store::SlaRent> rents = RentsOfTheHour();
  ASSERT_EQ(rents.size(), 1u);
  EXPECT_EQ(rents[0].charged_minutes, (uint64_t{1} << 20) | (uint64_t{1} << 21))
      << std::hex << rents[0].charged_minutes;
  auto judged = runtime_->JudgeHour(kHour, kHour + absl::Hours(3));
  ASSERT_TRUE(judged.ok()) << judged.status();
  pqxx::connection c(url_);
  pqxx::nontransaction n(c);
  EXPECT_EQ(n.exec1(absl::StrCat("SELECT count(*) FROM sla_windows WHERE instance_id = 'ins-a' "
                                 "AND hour_start = to_timestamp(",
                                 absl::ToUnixSeconds(kHour), ")"))[0]
                .as<int>(),
            1);
}

// Goal: a replica forgets the windows of hours the leader has judged at its
// next checkpoint, whether or not it leads (it used to keep them until it
// ran the judge itself, so a replica that never led grew without bound and
// at windows_max dropped every sample).
TEST_F(SlaIngestTest, EveryReplicaForgetsJudgedHoursAtItsCheckpoint) {
  Send({Batch(kHour + absl::Minutes(10), {"ins-a"})});
  ASSERT_TRUE(runtime_->monitor().Find("ins-a", kHour).has_value());
  ASSERT_TRUE(runtime_->Checkpoint().ok());
  EXPECT_TRUE(runtime_->monitor().Find("ins-a", kHour).has_value()) << "not judged yet";
  // Another replica, leading, judged the hour.
  Sql(absl::StrCat("UPDATE sla_cursor SET judged_before = to_timestamp(",
                   absl::ToUnixSeconds(kHour + absl::Hours(1)), ") WHERE id = 1"));
  ASSERT_TRUE(runtime_->Checkpoint().ok());
  EXPECT_FALSE(runtime_->monitor().Find("ins-a", kHour).has_value());
}

}  // namespace
}  // namespace sv::testing
