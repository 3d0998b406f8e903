#include "tests/chaos/chaos_util.h"

#include <chrono>
#include <cstdlib>
#include <pqxx/pqxx>
#include <random>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "billing/billing.h"
#include "common/clock.h"
#include "control/scheduling.h"
#include "store/database.h"
#include "store/migrations.h"
#include "store/store.h"
#include "sv/v1/instance.grpc.pb.h"
#include "tests/integration/harness.h"

namespace sv::chaos {
namespace {

constexpr int64_t kGpuMinuteMicros = 33'000;  // The default price book.

bool Transient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::CANCELLED;
}

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    default: return "OTHER";
  }
}

}  // namespace

int EnvInt(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

int64_t QueryInt(const std::string& url, const std::string& sql) {
  pqxx::connection db(url);
  pqxx::work txn(db);
  auto row = txn.exec1(sql);
  return row[0].is_null() ? -1 : row[0].as<int64_t>();
}

bool SeedBillingHistory(const std::string& url, int instances, int hours) {
  const absl::Time now = absl::Now();
  const absl::Time start = now - absl::Hours(hours) + absl::Seconds(17);
  store::DatabaseOptions db_options;
  db_options.url = url;
  store::Database db(db_options);
  if (!store::ApplyMigrations(db).ok()) return false;
  store::Store store(db);
  control::Scheduling scheduling(db, {});
  const int nodes = (instances + 7) / 8;
  for (int n = 0; n < nodes; ++n) {
    store::NodeRecord node{absl::StrCat("hist-", n), absl::StrCat("hist-", n), "z9", "p9",
                           "leaf-9", "RTX 4090", 8, store::NodeState::kReady, true};
    if (!store.UpsertNode(node, start).ok()) return false;
  }
  auto tenant = store.CreateTenant({"history", "h@example.com", store::Role::kMember,
                                    "key-history", std::string(32, 'a'), std::string(64, 'b')},
                                   start);
  if (!tenant.ok()) return false;
  FakeClock clock(start);
  billing::BillingOptions options;
  options.first_run_lookback = absl::Hours(24 * 7);
  billing::Billing billing(db, store, clock, options);
  if (!billing.TopUp(tenant->tenant.id, "big", 100'000'000'000, start).ok()) return false;
  if (!billing.BillMinutesBefore(billing::MinuteOf(start), start).ok()) return false;
  for (int i = 0; i < instances; ++i) {
    const absl::Time from = start + absl::Seconds(i * 7);
    const absl::Time to = now - absl::Minutes(30) - absl::Seconds(i * 13);
    auto created = store.CreateInstance(tenant->tenant.id,
                                        {absl::StrCat("h", i), 1, "RTX 4090", "ubuntu"},
                                        absl::StrCat("r", i), absl::StrCat("f", i), from);
    if (!created.ok() || !scheduling.RunPass(from).ok()) return false;
    if (!store.AdvanceSimulatedStarts(from).ok()) return false;
    if (!store.StopInstance(tenant->tenant.id, created->id, "done", to).ok()) return false;
  }
  // Nothing live may land on nodes without agents.
  pqxx::connection c(url);
  pqxx::work txn(c);
  txn.exec("UPDATE nodes SET state = 'down' WHERE name LIKE 'hist-%'");
  txn.commit();
  return true;
}

Load::Load(LoadOptions options, std::function<std::string(int)> endpoint)
    : options_(std::move(options)), endpoint_(std::move(endpoint)) {}

Load::~Load() { Stop(); }

void Load::Start() {
  for (int i = 0; i < options_.clients; ++i) threads_.emplace_back([this, i] { Client(i); });
}

void Load::Stop() {
  stopping_ = true;
  Wait();
}

void Load::Wait() {
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

std::vector<Acknowledged> Load::acknowledged() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return acknowledged_;
}

std::vector<double> Load::create_latencies_ms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return create_latencies_ms_;
}

std::map<std::string, int> Load::final_codes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return codes_;
}

void Load::Client(int index) {
  std::mt19937 random(options_.seed * 7919 + index);
  const std::string token = options_.tenant_tokens[index % options_.tenant_tokens.size()];
  std::string channel_endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::InstanceService::Stub> stub;
  auto refresh = [&] {
    const std::string e = endpoint_(index);
    if (e != channel_endpoint || stub == nullptr) {
      channel_endpoint = e;
      channel = grpc::CreateChannel(e, grpc::InsecureChannelCredentials());
      stub = v1::InstanceService::NewStub(channel);
    }
  };
  // Runs one call until it gets a final answer or retry_for passes.
  auto call = [&](const std::function<grpc::Status(v1::InstanceService::Stub&,
                                                   grpc::ClientContext&)>& rpc) {
    const auto deadline =
        std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(options_.retry_for);
    grpc::Status status;
    for (int attempt = 0;; ++attempt) {
      refresh();
      auto context = testing::Context(token);
      context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      ++attempts_;
      status = rpc(*stub, *context);
      if (!Transient(status.error_code())) break;
      if (std::chrono::steady_clock::now() > deadline) {
        ++unanswered_;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50 * (attempt + 1), 500)));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++codes_[CodeName(status.error_code())];
    return status;
  };
  std::vector<size_t> mine;  // Indices into acknowledged_.
  for (int n = 0; options_.creates_per_client == 0 || n < options_.creates_per_client; ++n) {
    if (stopping_) break;
    v1::CreateInstanceRequest request;
    static constexpr int kSizes[] = {1, 1, 2, 4, 8, 8, 16};
    int gpus = kSizes[random() % 7];
    if (gpus > options_.gpu_count_max) gpus = options_.gpu_count_max;
    request.mutable_instance()->set_gpu_count(gpus);
    request.mutable_instance()->set_name(absl::StrCat("load-", index, "-", n));
    request.set_request_id(absl::StrCat("s", options_.seed, "-c", index, "-", n));
    v1::Instance created;
    const auto started = std::chrono::steady_clock::now();
    grpc::Status status = call([&](v1::InstanceService::Stub& s, grpc::ClientContext& c) {
      return s.CreateInstance(&c, request, &created);
    });
    {
      std::lock_guard<std::mutex> lock(mutex_);
      create_latencies_ms_.push_back(std::chrono::duration<double, std::milli>(
                                         std::chrono::steady_clock::now() - started)
                                         .count());
    }
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      mine.push_back(acknowledged_.size());
      acknowledged_.push_back({created.id(), token, request.request_id(), false});
    }
    if (!mine.empty() && std::uniform_real_distribution<double>(0, 1)(random) <
                             options_.delete_share) {
      const size_t pick = mine[random() % mine.size()];
      std::string id;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (acknowledged_[pick].deleted) continue;
        id = acknowledged_[pick].id;
      }
      v1::DeleteInstanceRequest del;
      del.set_id(id);
      v1::Instance deleted;
      grpc::Status s = call([&](v1::InstanceService::Stub& st, grpc::ClientContext& c) {
        return st.DeleteInstance(&c, del, &deleted);
      });
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(mutex_);
        acknowledged_[pick].deleted = true;
      }
    }
  }
}

namespace {

// Expected charges: every minute touched by a RUNNING interval (from the
// event log), from the ledger's first minute up to the billing cursor.
constexpr char kMinuteMismatchSql[] = R"sql(
WITH ev AS (
  SELECT instance_id, to_state, (extract(epoch from at) * 1000000)::bigint AS at_us,
         lead((extract(epoch from at) * 1000000)::bigint)
           OVER (PARTITION BY instance_id ORDER BY at, id) AS next_us
  FROM instance_events),
cur AS (SELECT billed_before_minute AS c, first_minute AS f FROM billing_cursor),
expected AS (
  SELECT DISTINCT ev.instance_id, m AS minute
  FROM ev, cur,
       generate_series(greatest(ev.at_us / 60000000, cur.f),
                       least(coalesce((ev.next_us - 1) / 60000000, cur.c - 1), cur.c - 1)) m
  WHERE ev.to_state = 'RUNNING' AND cur.c IS NOT NULL),
charged AS (
  SELECT t.instance_id, t.usage_minute AS minute, sum(t.amount_micros) AS amount,
         count(DISTINCT t.idempotency_key) AS keys
  FROM ledger_charge_legs t WHERE t.kind = 'charge' GROUP BY 1, 2)
SELECT coalesce(e.instance_id, c.instance_id) || ' minute ' || coalesce(e.minute, c.minute)
       || CASE WHEN c.instance_id IS NULL THEN ': RUNNING but not charged'
               WHEN e.instance_id IS NULL THEN ': charged but not RUNNING'
               WHEN c.keys <> 1 THEN ': charged under ' || c.keys || ' keys'
               ELSE ': charged ' || c.amount || ' for ' || i.gpu_count || ' GPUs' END
FROM expected e
FULL JOIN charged c ON c.instance_id = e.instance_id AND c.minute = e.minute
LEFT JOIN instances i ON i.id = coalesce(e.instance_id, c.instance_id)
WHERE e.instance_id IS NULL OR c.instance_id IS NULL OR c.keys <> 1
   OR c.amount <> i.gpu_count * $1
LIMIT 10
)sql";

}  // namespace

std::vector<std::string> CheckInvariants(const std::string& url,
                                         const std::vector<Acknowledged>& acknowledged) {
  std::vector<std::string> failures;
  pqxx::connection db(url);
  pqxx::work txn(db);
  std::map<std::string, std::string> states;
  for (const auto& row : txn.exec("SELECT id, state FROM instances")) {
    states[row[0].as<std::string>()] = row[1].as<std::string>();
  }
  for (const Acknowledged& a : acknowledged) {
    auto it = states.find(a.id);
    if (it == states.end()) {
      failures.push_back(absl::StrCat("acknowledged create ", a.id, " (", a.request_id,
                                      ") does not exist"));
    } else if (a.deleted && it->second != "DELETED") {
      failures.push_back(absl::StrCat("acknowledged delete of ", a.id, " left it ", it->second));
    }
  }
  auto check = [&](const std::string& what, const std::string& sql) {
    for (const auto& row : txn.exec(sql)) failures.push_back(what + ": " + row[0].c_str());
  };
  check("GPU reserved twice",
        "SELECT node_id || '/' || gpu_index FROM gpu_reservations "
        "GROUP BY node_id, gpu_index HAVING count(*) > 1");
  check("finished instance holds GPUs",
        "SELECT DISTINCT r.instance_id || ' ' || i.state FROM gpu_reservations r "
        "JOIN instances i ON i.id = r.instance_id "
        "WHERE i.state NOT IN ('SCHEDULED', 'STARTING', 'RUNNING', 'STOPPING')");
  check("placed instance holds the wrong GPU count",
        "SELECT i.id || ' holds ' || count(r.gpu_index) || ' of ' || i.gpu_count "
        "FROM instances i LEFT JOIN gpu_reservations r ON r.instance_id = i.id "
        "WHERE i.state IN ('SCHEDULED', 'STARTING', 'RUNNING') "
        "GROUP BY i.id, i.gpu_count HAVING count(r.gpu_index) <> i.gpu_count");
  check("instance placed more than once",
        "SELECT instance_id || ' scheduled ' || count(*) || ' times without a release' "
        "FROM instance_events WHERE to_state = 'SCHEDULED' GROUP BY instance_id "
        "HAVING count(*) > 1 + (SELECT count(*) FROM instance_events e2 WHERE "
        "e2.instance_id = instance_events.instance_id AND e2.to_state IN "
        "('STOPPED', 'PENDING'))");
  check("PENDING without a reason",
        "SELECT id FROM instances WHERE state = 'PENDING' AND state_reason = ''");
  for (const auto& row : txn.exec_params(kMinuteMismatchSql, kGpuMinuteMicros)) {
    failures.push_back(absl::StrCat("billing: ", row[0].c_str()));
  }
  txn.commit();
  testing::RunResult audit =
      testing::RunCapture({testing::SvdPath(), "--database-url", url, "audit"}, {});
  if (audit.exit_code != 0) {
    failures.push_back(absl::StrCat("svd audit failed (exit ", audit.exit_code, "): ", audit.out,
                                    audit.err));
  }
  return failures;
}

}  // namespace sv::chaos
