// Tenants' webhooks against a real svd and PostgreSQL (docs/notifications.md):
// svd POSTs each notice to a receiver run by the test, signed, oldest first,
// and retries after the receiver fails; notices from before the webhook and
// after its deletion are not sent.
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "api/errors.h"
#include "api/webhooks.h"
#include "common/ids.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "store/agent_store.h"
#include "store/database.h"
#include "store/webhook_store.h"
#include "sv/v1/billing.grpc.pb.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/webhook.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

struct Received {
  std::string event_id, timestamp, signature, body;
};

// An HTTP server on a free loopback port that records what it is sent and
// answers `status`.
class Receiver {
 public:
  Receiver() {
    server_.Post("/hook", [this](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mutex_);
      ++calls_;
      res.status = status_.load();
      if (res.status == 200) {
        received_.push_back({req.get_header_value("X-Sv-Event-Id"),
                             req.get_header_value("X-Sv-Timestamp"),
                             req.get_header_value("X-Sv-Signature"), req.body});
      }
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~Receiver() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/hook"; }
  void set_status(int status) { status_ = status; }
  std::vector<Received> received() {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mutex_);
    return calls_;
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> status_{200};
  std::mutex mutex_;
  std::vector<Received> received_;
  int calls_ = 0;
};

class WebhookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SvdOptions options;
    options.database_url = CreateTestDatabase();
    url_ = options.database_url;
    options.sim_nodes = 2;
    options.extra_args = {"--webhook-allow-private", "--webhook-interval-ms", "100"};
    svd_ = std::make_unique<SvdProcess>(options);
    ASSERT_TRUE(svd_->Start());
    owner_ = CreateTenant(*svd_, "hooked");
    tenant_id_ = TenantIdByName(*svd_, "hooked");
  }

  // An operator's credit: one `credit` notice to the tenant.
  void Credit(const std::string& credit_id, const std::string& reason) {
    v1::BillingAdminService::Stub admin(svd_->channel());
    v1::IssueCreditRequest request;
    request.set_tenant_id(tenant_id_);
    request.set_credit_id(credit_id);
    request.set_amount_micros(1'000'000);
    request.set_reason(reason);
    v1::Transfer transfer;
    grpc::Status status = admin.IssueCredit(Context(svd_->admin_key()).get(), request, &transfer);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  // Sets the webhook to `receiver`, made to fail, and writes a credit
  // notice per id, held until it answers; waits for the first failure.
  // `set` is the request that set it.
  void HoldNotices(Receiver& receiver, const std::vector<std::string>& credit_ids,
                   v1::SetWebhookRequest* set) {
    receiver.set_status(500);
    v1::WebhookService::Stub hooks(svd_->channel());
    set->set_url(receiver.url());
    v1::Webhook webhook;
    ASSERT_TRUE(hooks.SetWebhook(Context(owner_).get(), *set, &webhook).ok());
    for (const std::string& id : credit_ids) Credit(id, "held while the receiver fails");
    ASSERT_TRUE(WaitFor([&] { return Get().failed_attempts() >= 1; }));
  }

  v1::Webhook Get() {
    v1::WebhookService::Stub hooks(svd_->channel());
    v1::Webhook webhook;
    EXPECT_TRUE(hooks.GetWebhook(Context(owner_).get(), {}, &webhook).ok());
    return webhook;
  }

  std::unique_ptr<SvdProcess> svd_;
  std::string url_, owner_, tenant_id_;
};

// Goal: set a webhook; every later notice reaches it once, in order, signed
// with the secret given once; a failing receiver is retried until it
// answers; the ping checks the URL; deleting the webhook stops deliveries;
// bad URLs are refused with the reason.
TEST_F(WebhookTest, NoticesReachTheReceiverSignedInOrderAndAreRetried) {
  Receiver receiver;
  v1::WebhookService::Stub hooks(svd_->channel());
  v1::Webhook webhook;
  EXPECT_EQ(hooks.GetWebhook(Context(owner_).get(), {}, &webhook).error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::SetWebhookRequest set;
  set.set_url("ftp://127.0.0.1/hook");
  grpc::Status status = hooks.SetWebhook(Context(owner_).get(), set, &webhook);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(api::ReasonOf(status), "INVALID_WEBHOOK_URL");

  Credit("before", "before the webhook");  // Not sent: it predates the webhook.
  set.set_url(receiver.url());
  status = hooks.SetWebhook(Context(owner_).get(), set, &webhook);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string secret = webhook.secret();
  EXPECT_EQ(secret.rfind("whsec_", 0), 0u);
  EXPECT_TRUE(Get().secret().empty()) << "the secret is shown once";

  v1::TestWebhookResponse ping;
  ASSERT_TRUE(hooks.TestWebhook(Context(owner_).get(), {}, &ping).ok());
  EXPECT_EQ(ping.http_status(), 200) << ping.error();
  ASSERT_EQ(receiver.received().size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(receiver.received()[0].body)["kind"], "ping");

  // The receiver fails at first: the first notice is tried again and the
  // second waits behind it.
  receiver.set_status(500);
  Credit("one", "first");
  Credit("two", "second");
  ASSERT_TRUE(WaitFor([&] { return receiver.calls() >= 3; }));
  v1::Webhook failing = Get();
  EXPECT_GE(failing.failed_attempts(), 1);
  EXPECT_EQ(failing.last_error(), "answered HTTP 500");
  EXPECT_EQ(failing.pending_count(), 2);
  receiver.set_status(200);
  ASSERT_TRUE(WaitFor([&] { return receiver.received().size() >= 3; }))
      << "pending " << Get().pending_count();
  const std::vector<Received> got = receiver.received();
  ASSERT_EQ(got.size(), 3u);
  std::vector<std::string> reasons;
  for (size_t i = 1; i < got.size(); ++i) {
    const Received& r = got[i];
    EXPECT_EQ(r.signature, api::WebhookSignature(secret, std::stoll(r.timestamp), r.body));
    const auto body = nlohmann::json::parse(r.body);
    EXPECT_EQ(body["id"], r.event_id);
    EXPECT_EQ(body["tenantId"], tenant_id_);
    EXPECT_EQ(body["kind"], "credit");
    reasons.push_back(body["message"]);
  }
  EXPECT_NE(reasons[0].find("first"), std::string::npos) << reasons[0];
  EXPECT_NE(reasons[1].find("second"), std::string::npos) << reasons[1];
  const v1::Webhook healthy = Get();
  EXPECT_EQ(healthy.pending_count(), 0);
  EXPECT_EQ(healthy.failed_attempts(), 0);
  EXPECT_TRUE(healthy.has_last_delivery_time());

  // Deleted: nothing more is sent.
  v1::DeleteWebhookResponse deleted;
  ASSERT_TRUE(hooks.DeleteWebhook(Context(owner_).get(), {}, &deleted).ok());
  EXPECT_TRUE(deleted.deleted());
  Credit("three", "after the webhook");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(receiver.received().size(), 3u);
  ASSERT_TRUE(hooks.DeleteWebhook(Context(owner_).get(), {}, &deleted).ok());
  EXPECT_FALSE(deleted.deleted());
}

// Goal: the tenant's webhook hears when an instance starts running (every
// node confirmed it, and its rent runs) and when the platform ends it (here
// its node reports it failed, through the agents' store call), with the
// reason; the balance's billing notices list neither.
TEST_F(WebhookTest, InstanceRunningAndEndedByThePlatformAreSent) {
  Receiver receiver;
  v1::WebhookService::Stub hooks(svd_->channel());
  v1::SetWebhookRequest set;
  set.set_url(receiver.url());
  v1::Webhook webhook;
  ASSERT_TRUE(hooks.SetWebhook(Context(owner_).get(), set, &webhook).ok());
  v1::InstanceService::Stub instances(svd_->channel());
  v1::CreateInstanceRequest create;
  create.mutable_instance()->set_name("trainer");
  create.mutable_instance()->set_gpu_count(1);
  create.set_request_id("ended-1");
  v1::Instance instance;
  ASSERT_TRUE(instances.CreateInstance(Context(owner_).get(), create, &instance).ok());
  v1::GetInstanceRequest get;
  get.set_id(instance.id());
  ASSERT_TRUE(WaitFor([&] {
    instances.GetInstance(Context(owner_).get(), get, &instance);
    return instance.state() == v1::RUNNING;
  }));
  ASSERT_EQ(instance.placement_size(), 1);
  store::DatabaseOptions db_options;
  db_options.url = url_;
  store::Database db(db_options);
  std::string node_id;
  ASSERT_TRUE(db.Transact([&](pqxx::work& txn) {
                  node_id = txn.exec_params1("SELECT id FROM nodes WHERE name = $1",
                                             instance.placement(0).node_name())[0]
                                .as<std::string>();
                  return absl::OkStatus();
                }).ok());
  store::AgentStore agents(db);
  ASSERT_TRUE(agents.ReportEnded(node_id, instance.id(), true, "GPU 0 fell off the bus",
                                 absl::Now())
                  .ok());
  // First the start (its rent runs from then), then the failure.
  ASSERT_TRUE(WaitFor([&] { return receiver.received().size() >= 2; }));
  const auto started = nlohmann::json::parse(receiver.received()[0].body);
  EXPECT_EQ(started["kind"], "instance_running");
  EXPECT_EQ(started["instanceId"], instance.id());
  EXPECT_EQ(started["message"].get<std::string>().rfind(
                "Instance trainer (" + instance.id() + ") is running on 1 GPU; its rent runs "
                "from 20", 0),
            0u)
      << started["message"];
  const auto body = nlohmann::json::parse(receiver.received()[1].body);
  EXPECT_EQ(body["kind"], "instance_ended");
  EXPECT_EQ(body["instanceId"], instance.id());
  EXPECT_EQ(body["message"], "Instance trainer (" + instance.id() +
                                 ") failed: GPU 0 fell off the bus");
  v1::BillingService::Stub billing(svd_->channel());
  v1::Balance balance;
  ASSERT_TRUE(billing.GetBalance(Context(owner_).get(), {}, &balance).ok());
  for (const auto& notice : balance.notices()) {
    EXPECT_NE(notice.kind(), "instance_ended");
    EXPECT_NE(notice.kind(), "instance_running");
  }
  // A tenant with no webhook gets no instance_running rows: they exist
  // only to be sent.
  const std::string plain = CreateTenant(*svd_, "unhooked");
  create.set_request_id("plain-1");
  ASSERT_TRUE(instances.CreateInstance(Context(plain).get(), create, &instance).ok());
  get.set_id(instance.id());
  ASSERT_TRUE(WaitFor([&] {
    instances.GetInstance(Context(plain).get(), get, &instance);
    return instance.state() == v1::RUNNING;
  }));
  ASSERT_TRUE(db.Transact([&](pqxx::work& txn) {
                  EXPECT_EQ(txn.exec_params1("SELECT count(*) FROM billing_notices WHERE "
                                             "instance_id = $1", instance.id())[0]
                                .as<int>(),
                            0);
                  return absl::OkStatus();
                }).ok());
}

// Goal: a webhook failing for longer than the give-up time (72 h) is
// turned off with a notice to the tenant and no more tries; notices keep
// accumulating; setting it again turns it back on and sends them, oldest
// first. The store is driven with chosen times (svd's dispatcher runs on
// the real clock beside it).
TEST_F(WebhookTest, AWebhookFailingForDaysIsTurnedOffUntilSetAgain) {
  Receiver receiver;
  v1::WebhookService::Stub hooks(svd_->channel());
  v1::SetWebhookRequest set;
  v1::Webhook webhook;
  HoldNotices(receiver, {"held"}, &set);
  const v1::Webhook failing = Get();
  ASSERT_TRUE(failing.has_failing_since_time());
  EXPECT_FALSE(failing.disabled());
  const absl::Time since = absl::FromUnixSeconds(failing.failing_since_time().seconds());

  store::DatabaseOptions db_options;
  db_options.url = url_;
  store::Database db(db_options);
  store::WebhookStore store(db);
  auto off = store.RecordFailure(tenant_id_, "answered HTTP 500", absl::Seconds(1),
                                 absl::Hours(72), since + absl::Hours(71));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(*off) << "not yet 72 hours";
  off = store.RecordFailure(tenant_id_, "answered HTTP 500", absl::Seconds(1), absl::Hours(72),
                            since + absl::Hours(73));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(*off);
  const v1::Webhook disabled = Get();
  EXPECT_TRUE(disabled.disabled());
  EXPECT_NE(disabled.disabled_reason().find("answered HTTP 500"), std::string::npos)
      << disabled.disabled_reason();
  auto due = store.Due(since + absl::Hours(80), 100);
  ASSERT_TRUE(due.ok());
  for (const auto& hook : *due) EXPECT_NE(hook.tenant_id, tenant_id_) << "no more tries";
  v1::BillingService::Stub billing(svd_->channel());
  v1::Balance balance;
  ASSERT_TRUE(billing.GetBalance(Context(owner_).get(), {}, &balance).ok());
  bool told = false;
  for (const auto& notice : balance.notices()) {
    told = told || (notice.kind() == "webhook_disabled" &&
                    notice.message().find(receiver.url()) != std::string::npos);
  }
  EXPECT_TRUE(told);

  // Set again, with the receiver healthy: the held credit and the notice
  // of the turning off arrive, in order.
  const int calls_before = receiver.calls();
  receiver.set_status(200);
  ASSERT_TRUE(hooks.SetWebhook(Context(owner_).get(), set, &webhook).ok());
  EXPECT_FALSE(webhook.disabled());
  ASSERT_TRUE(WaitFor([&] { return receiver.received().size() >= 2; }))
      << "pending " << Get().pending_count() << ", calls " << receiver.calls() - calls_before;
  const std::vector<Received> got = receiver.received();
  EXPECT_EQ(nlohmann::json::parse(got[0].body)["kind"], "credit");
  EXPECT_EQ(nlohmann::json::parse(got[1].body)["kind"], "webhook_disabled");
  const v1::Webhook healthy = Get();
  EXPECT_FALSE(healthy.disabled());
  EXPECT_FALSE(healthy.has_failing_since_time());
}

// Goal: a webhook replaced with skip_backlog (svctl webhook set URL
// --skip-backlog) sends only notices written from then on; what was held
// is skipped, not lost from the balance.
TEST_F(WebhookTest, ReplacingAWebhookCanSkipTheBacklog) {
  Receiver receiver;
  v1::WebhookService::Stub hooks(svd_->channel());
  v1::SetWebhookRequest set;
  v1::Webhook webhook;
  HoldNotices(receiver, {"old-1", "old-2"}, &set);
  EXPECT_EQ(Get().pending_count(), 2);

  receiver.set_status(200);
  set.set_skip_backlog(true);
  ASSERT_TRUE(hooks.SetWebhook(Context(owner_).get(), set, &webhook).ok());
  EXPECT_EQ(Get().pending_count(), 0);
  Credit("new-1", "after the replacement");
  ASSERT_TRUE(WaitFor([&] { return !receiver.received().empty(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // Nothing else comes.
  const std::vector<Received> got = receiver.received();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(got[0].body)["message"].get<std::string>().find(
                "after the replacement") != std::string::npos,
            true)
      << got[0].body;
  v1::BillingService::Stub billing(svd_->channel());
  v1::Balance balance;
  ASSERT_TRUE(billing.GetBalance(Context(owner_).get(), {}, &balance).ok());
  int credits = 0;
  for (const auto& notice : balance.notices()) credits += notice.kind() == "credit";
  EXPECT_EQ(credits, 3);
}

// Goal: svctl sets, shows, tests and deletes the webhook.
TEST_F(WebhookTest, Svctl) {
  Receiver receiver;
  auto svctl = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {SvctlPath(), "--endpoint", svd_->endpoint(), "--token",
                                     owner_};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCapture(argv, {});
  };
  RunResult set = svctl({"webhook", "set", receiver.url()});
  ASSERT_EQ(set.exit_code, 0) << set.err;
  EXPECT_NE(set.out.find("whsec_"), std::string::npos) << set.out;
  RunResult test = svctl({"webhook", "test"});
  ASSERT_EQ(test.exit_code, 0) << test.err;
  EXPECT_NE(test.out.find("delivered: HTTP 200"), std::string::npos) << test.out;
  RunResult get = svctl({"webhook", "get"});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_NE(get.out.find(receiver.url()), std::string::npos) << get.out;
  EXPECT_EQ(get.out.find("whsec_"), std::string::npos) << get.out;
  RunResult del = svctl({"webhook", "delete"});
  ASSERT_EQ(del.exit_code, 0) << del.err;
  EXPECT_NE(del.out.find("webhook deleted"), std::string::npos) << del.out;
}

}  // namespace
}  // namespace sv::testing
