// The REST/JSON API through a real svd and PostgreSQL with an HTTP client:
// every route answers (and refuses a call without a key), the instance
// lifecycle and money work end to end, bad JSON and huge bodies are refused,
// another tenant's instance is NOT_FOUND, and rate limits are the gRPC ones.
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <pqxx/pqxx>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"
#include "server/rest_gateway.h"
#include "tests/integration/harness.h"

namespace sv::testing {
namespace {

using nlohmann::json;

struct Reply {
  int status = 0;
  json body;
  std::string raw;
  std::string retry_after;
};

// A connection to 127.0.0.1:port with a 30 s receive timeout; -1 on failure.
int ConnectLocal(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  return ::send(fd, data.data(), data.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(data.size());
}

// Sends `request` in one write to 127.0.0.1:port and reads until the
// server closes (or 30 s pass); "" when the connection fails.
std::string RawExchange(int port, const std::string& request) {
  const int fd = ConnectLocal(port);
  if (fd < 0) return "";
  std::string answer;
  if (SendAll(fd, request)) {
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) answer.append(buf, n);
  }
  ::close(fd);
  return answer;
}

class Rest {
 public:
  explicit Rest(int port) : client_("127.0.0.1", port) {
    client_.set_read_timeout(30, 0);
    client_.set_connection_timeout(5, 0);
  }

  Reply Call(const std::string& method, const std::string& path, const std::string& key,
             const std::string& body = "", const std::string& content_type = "application/json") {
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
    auto send = [&]() -> httplib::Result {
      if (method == "GET") return client_.Get(path, headers);
      if (method == "DELETE") return client_.Delete(path, headers);
      if (method == "POST") return client_.Post(path, headers, body, content_type);
      if (method == "PUT") return client_.Put(path, headers, body, content_type);
      return client_.Patch(path, headers, body, content_type);
    };
    httplib::Result res = send();
    Reply reply;
    if (!res) {
      ADD_FAILURE() << method << " " << path << ": no HTTP answer";
      return reply;
    }
    reply.status = res->status;
    reply.raw = res->body;
    reply.retry_after = res->get_header_value("Retry-After");
    if (json::accept(res->body)) reply.body = json::parse(res->body);
    return reply;
  }

 private:
  httplib::Client client_;
};

std::string Reason(const Reply& r) { return r.body.is_object() ? r.body.value("reason", "") : ""; }

// Waits until GET /v1/instances/{id} shows `state` (or fails after 30 s).
json WaitForState(Rest& rest, const std::string& key, const std::string& id,
                  const std::string& state) {
  json last;
  for (int i = 0; i < 300; ++i) {
    Reply r = rest.Call("GET", "/v1/instances/" + id, key);
    last = r.body;
    if (r.status == 200 && r.body["state"] == state) return r.body;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ADD_FAILURE() << id << " never reached " << state << "; last " << last.dump();
  return last;
}

class RestApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SvdOptions options{CreateTestDatabase(), 4, 2, {"--billing-interval-ms", "200"}};
    database_url_ = options.database_url;
    svd_ = std::make_unique<SvdProcess>(options);
    ASSERT_TRUE(svd_->Start());
    ASSERT_GT(svd_->http_port(), 0);
    rest_ = std::make_unique<Rest>(svd_->http_port());
  }

  std::string database_url_;
  std::unique_ptr<SvdProcess> svd_;
  std::unique_ptr<Rest> rest_;
};

// Create, read, list, stop, start, events, idle policy, resize and delete
// through REST, with the request_id retry of AIP-155.
TEST_F(RestApiTest, InstanceLifecycle) {
  const std::string key = CreateTenant(*svd_, "rest-life");
  const std::string create =
      R"({"instance": {"name": "train", "gpuCount": 8, "image": "pytorch:2"}, "requestId": "r-1"})";
  Reply created = rest_->Call("POST", "/v1/instances", key, create);
  ASSERT_EQ(created.status, 200) << created.raw;
  const std::string id = created.body["id"];
  EXPECT_EQ(created.body["gpuCount"], 8);
  EXPECT_EQ(created.body["name"], "train");
  Reply retried = rest_->Call("POST", "/v1/instances", key, create);
  ASSERT_EQ(retried.status, 200);
  EXPECT_EQ(retried.body["id"], id);
  Reply reused = rest_->Call("POST", "/v1/instances", key,
                             R"({"instance": {"gpuCount": 4}, "requestId": "r-1"})");
  EXPECT_EQ(reused.status, 409) << reused.raw;

  json running = WaitForState(*rest_, key, id, "RUNNING");
  EXPECT_EQ(running["placement"].size(), 1u);
  // The operator sees it among every tenant's running instances.
  Reply fleet = rest_->Call("GET", "/v1/admin/instances?state=RUNNING", svd_->admin_key());
  ASSERT_EQ(fleet.status, 200) << fleet.raw;
  ASSERT_EQ(fleet.body["instances"].size(), 1u) << fleet.raw;
  EXPECT_EQ(fleet.body["instances"][0]["id"], id);
  EXPECT_EQ(rest_->Call("GET", "/v1/admin/instances", key).status, 403);
  EXPECT_EQ(rest_->Call("GET", "/v1/admin/instances?state=ASLEEP", svd_->admin_key()).status,
            400);
  Reply list = rest_->Call("GET", "/v1/instances?pageSize=10", key);
  ASSERT_EQ(list.status, 200);
  ASSERT_EQ(list.body["instances"].size(), 1u);
  EXPECT_EQ(list.body["instances"][0]["id"], id);

  Reply idle = rest_->Call("POST", "/v1/instances/" + id + ":setIdlePolicy", key,
                           R"({"idleSeconds": 600, "utilizationPct": 5})");
  EXPECT_EQ(idle.status, 200) << idle.raw;
  // Resizing to the same size is a no-op; to 12 GPUs it is not a whole node.
  Reply resize = rest_->Call("POST", "/v1/instances/" + id + ":resize", key, R"({"gpuCount": 8})");
  EXPECT_EQ(resize.status, 200) << resize.raw;
  EXPECT_EQ(resize.body["previousGpuCount"], 8);
  resize = rest_->Call("POST", "/v1/instances/" + id + ":resize", key, R"({"gpuCount": 12})");
  EXPECT_EQ(resize.status, 400) << resize.raw;

  Reply stop = rest_->Call("POST", "/v1/instances/" + id + ":stop", key, "");
  ASSERT_EQ(stop.status, 200) << stop.raw;
  WaitForState(*rest_, key, id, "STOPPED");
  Reply start = rest_->Call("POST", "/v1/instances/" + id + ":start", key, "{}");
  ASSERT_EQ(start.status, 200) << start.raw;
  WaitForState(*rest_, key, id, "RUNNING");
  Reply events = rest_->Call("GET", "/v1/instances/" + id + "/events", key);
  ASSERT_EQ(events.status, 200);
  EXPECT_GE(events.body["events"].size(), 6u);

  Reply deleted = rest_->Call("DELETE", "/v1/instances/" + id, key);
  ASSERT_EQ(deleted.status, 200) << deleted.raw;
  EXPECT_EQ(deleted.body["state"], "DELETED");
  list = rest_->Call("GET", "/v1/instances", key);
  EXPECT_TRUE(list.body["instances"].empty());
  list = rest_->Call("GET", "/v1/instances?showDeleted=true", key);
  EXPECT_EQ(list.body["instances"].size(), 1u);
}

// One tenant reaching for another's instance gets 404, whatever the verb.
TEST_F(RestApiTest, AnotherTenantsInstanceIsNotFound) {
  const std::string owner = CreateTenant(*svd_, "rest-owner");
  const std::string other = CreateTenant(*svd_, "rest-other");
  Reply created = rest_->Call("POST", "/v1/instances", owner, R"({"instance": {"gpuCount": 1}})");
  ASSERT_EQ(created.status, 200) << created.raw;
  const std::string id = created.body["id"];
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/instances/" + id},
           {"POST", "/v1/instances/" + id + ":stop"},
           {"POST", "/v1/instances/" + id + ":start"},
           {"POST", "/v1/instances/" + id + ":resize"},
           {"GET", "/v1/instances/" + id + "/events"},
           {"DELETE", "/v1/instances/" + id},
           {"GET", "/v1/sla/windows?instanceId=" + id}}) {
    const bool resize = path.find(":resize") != std::string::npos;
    Reply r = rest_->Call(method, path, other,
                          method != "POST" ? "" : resize ? R"({"gpuCount": 8})" : "{}");
    if (r.status == 501) continue;  // A service this svd does not run yet.
    EXPECT_EQ(r.status, 404) << method << " " << path << ": " << r.raw;
    EXPECT_EQ(r.body.value("code", ""), "NOT_FOUND") << r.raw;
  }
  // The owner still sees it, unchanged.
  Reply mine = rest_->Call("GET", "/v1/instances/" + id, owner);
  EXPECT_EQ(mine.status, 200);
  EXPECT_NE(mine.body["state"], "DELETED");
  Reply theirs = rest_->Call("GET", "/v1/instances", other);
  EXPECT_TRUE(theirs.body["instances"].empty());
}

// Bad keys, bad JSON and huge bodies, each with its status and reason.
TEST_F(RestApiTest, RefusesBadCallsWithTheErrorModel) {
  const std::string key = CreateTenant(*svd_, "rest-bad");
  Reply r = rest_->Call("GET", "/v1/instances", "");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(Reason(r), "MISSING_CREDENTIALS");
  EXPECT_EQ(r.body["code"], "UNAUTHENTICATED");
  EXPECT_FALSE(r.body["message"].get<std::string>().empty());
  r = rest_->Call("GET", "/v1/instances", "svk_notakey.reallynot");
  EXPECT_EQ(r.status, 401);
  r = rest_->Call("GET", "/v1/balance", key.substr(0, key.size() - 2) + "zz");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(Reason(r), "API_KEY_UNKNOWN");

  r = rest_->Call("POST", "/v1/instances", key, R"({"instance": {"gpuCount": 8)");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "MALFORMED_JSON");
  r = rest_->Call("POST", "/v1/instances", key, R"({"instance": {"gpuCount": 8, "gpus": 8}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "UNKNOWN_FIELD");
  r = rest_->Call("POST", "/v1/instances", key, R"({"instance": {"gpuCount": "lots"}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "INVALID_JSON_FIELD");
  r = rest_->Call("POST", "/v1/instances", key, R"({"instance": {"gpuCount": 8.5}})");
  EXPECT_EQ(r.status, 400);
  r = rest_->Call("POST", "/v1/instances", key, R"({"instance": {"gpuCount": 12}})");
  EXPECT_EQ(r.status, 400);  // Validation of the service itself.
  EXPECT_EQ(Reason(r), "INVALID_GPU_COUNT");
  r = rest_->Call("GET", "/v1/instances?pageSize=-1", key);
  EXPECT_EQ(r.status, 400);
  r = rest_->Call("GET", "/v1/instances/ins-doesnotexist", key);
  EXPECT_EQ(r.status, 404);
  r = rest_->Call("GET", "/v1/no/such/thing", key);
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Reason(r), "ROUTE_NOT_FOUND");
  r = rest_->Call("PUT", "/v1/instances", key, "{}");
  EXPECT_EQ(r.status, 405);

  // Over the body limit: 413, nothing created.
  const std::string huge = R"({"instance": {"name": ")" +
                           std::string(server::kRestBodyBytesMax + 1024, 'a') + R"("}})";
  r = rest_->Call("POST", "/v1/instances", key, huge);
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(Reason(r), "BODY_TOO_LARGE");
  // Just under it, the body is read and the service refuses the name.
  const std::string big = R"({"instance": {"name": ")" + std::string(100'000, 'a') + R"("}})";
  r = rest_->Call("POST", "/v1/instances", key, big);
  EXPECT_EQ(r.status, 400) << r.raw;
  r = rest_->Call("GET", "/v1/instances", key);
  EXPECT_TRUE(r.body["instances"].empty());
  // A chunked body has no length to hold to the limit: refused before any
  // of it is read (cpp-httplib read it whole, however long). The request
  // goes in one write on a plain socket: an HTTP client that writes the
  // body after the headers may find the socket already answered and closed,
  // which is a fact of the refusal, not something this test measures.
  {
    const std::string part = R"({"instance": {"gpuCount": 1}})";
    const std::string request = absl::StrCat(
        "POST /v1/instances HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ", key,
        "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        "Connection: close\r\n\r\n",
        absl::StrCat(absl::Hex(part.size())), "\r\n", part, "\r\n0\r\n\r\n");
    const std::string answer = RawExchange(svd_->http_port(), request);
    EXPECT_EQ(answer.rfind("HTTP/1.1 411", 0), 0u) << answer;
    EXPECT_NE(answer.find("LENGTH_REQUIRED"), std::string::npos) << answer;
  }
  r = rest_->Call("GET", "/v1/instances", key);
  EXPECT_TRUE(r.body["instances"].empty()) << r.raw;
  // A Timestamp is one string in a query: a path inside it is refused, not
  // a server error.
  r = rest_->Call("GET", "/v1/usage?startTime=2026-01-01T00:00:00Z&startTime.seconds=1", key);
  EXPECT_EQ(r.status, 400) << r.raw;
  EXPECT_EQ(Reason(r), "INVALID_QUERY") << r.raw;

  // `curl -d '{...}'` without a Content-Type labels JSON as a form: it is
  // read as JSON all the same, and its text is no query parameter.
  const std::string form = "application/x-www-form-urlencoded";
  r = rest_->Call("POST", "/v1/instances", key,
                  R"({"instance": {"gpuCount": 1}, "requestId": "curl-1"})", form);
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body.value("gpuCount", 0), 1) << r.raw;
  r = rest_->Call("POST", "/v1/instances?pageSize=1", key, R"({"instance": {"gpuCount": 1}})",
                  form);
  EXPECT_EQ(r.status, 400) << r.raw;  // A real query parameter is still checked.
  EXPECT_EQ(Reason(r), "INVALID_QUERY");
  // httplib reads at most 8,192 bytes labelled as a form; the answer says so.
  const std::string long_form = R"({"instance": {"name": ")" + std::string(9'000, 'a') + R"("}})";
  r = rest_->Call("POST", "/v1/instances", key, long_form, form);
  EXPECT_EQ(r.status, 413) << r.raw;
  EXPECT_NE(r.body.value("message", "").find("application/json"), std::string::npos) << r.raw;
  r = rest_->Call("GET", "/v1/instances", key);
  ASSERT_EQ(r.body["instances"].size(), 1u) << r.raw;
  const std::string curl_id = r.body["instances"][0]["id"];
  r = rest_->Call("DELETE", "/v1/instances/" + curl_id, key);
  EXPECT_EQ(r.status, 200) << r.raw;

  // A member is not an operator.
  r = rest_->Call("GET", "/v1/admin/balances", key);
  EXPECT_EQ(r.status, 403);
  r = rest_->Call("GET", "/v1/admin/dashboard/revenue", key);
  EXPECT_EQ(r.status, 403);
}

// Every route of the table is served: without a key each answers 401 (or
// 501 for a service this svd does not run), and with the operator key none
// is ROUTE_NOT_FOUND or a server error.
// Open connections do not lock others out. cpp-httplib gives each
// connection a worker thread until it closes; with its default pool (8 on a
// small machine) a few clients that opened connections and had not finished
// their requests (browsers, slow links) held every thread, and the next
// client waited until their read timeouts closed them (and its listen
// backlog of 5 dropped bursts of new connections). Here 40 clients hold
// half-sent requests while another is served; then each finishes its own
// request and is answered, so none was given up on meanwhile.
TEST_F(RestApiTest, HeldConnectionsDoNotLockOutOtherClients) {
  constexpr int kHeld = 40;
  std::vector<int> held;
  for (int i = 0; i < kHeld; ++i) {
    const int fd = ConnectLocal(svd_->http_port());
    ASSERT_GE(fd, 0);
    held.push_back(fd);
    ASSERT_TRUE(SendAll(fd, "GET /healthz HTTP/1.1\r\n"));
  }
  const std::string answer = RawExchange(
      svd_->http_port(), "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  int answered = 0;
  for (const int fd : held) {
    if (SendAll(fd, "Host: x\r\nConnection: close\r\n\r\n")) {
      char buf[256];
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0 && std::string(buf, n).rfind("HTTP/1.1 200", 0) == 0) ++answered;
    }
    ::close(fd);
  }
  EXPECT_EQ(answered, kHeld);
}

TEST_F(RestApiTest, EveryRouteIsServed) {
  const std::string admin = svd_->admin_key();
  int served = 0;
  for (const auto& route : server::RestRoutes()) {
    std::string path = route.path;
    // Fill path variables with a value no resource has.
    for (size_t open; (open = path.find('{')) != std::string::npos;) {
      path.replace(open, path.find('}', open) - open + 1, "zz-none");
    }
    const std::string body = std::string(route.body).empty() ? "" : "{}";
    // Failed authentications are limited per client (burst 50, 5/s): wait
    // out a RATE_LIMITED answer as a client would.
    Reply anonymous;
    for (int attempt = 0; attempt < 50; ++attempt) {
      anonymous = rest_->Call(route.http_method, path, "", body);
      if (anonymous.status != 429) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    const bool unserved = anonymous.status == 501;
    if (!unserved) {
      EXPECT_EQ(anonymous.status, 401) << route.http_method << " " << path << ": " << anonymous.raw;
      ++served;
    }
    Reply r = rest_->Call(route.http_method, path, admin, body);
    EXPECT_NE(Reason(r), "ROUTE_NOT_FOUND") << route.http_method << " " << path;
    if (unserved) {
      EXPECT_EQ(r.status, 501);
    } else {
      EXPECT_LT(r.status, 500) << route.http_method << " " << path << ": " << r.raw;
    }
    ASSERT_TRUE(r.body.is_object()) << route.http_method << " " << path << ": " << r.raw;
  }
  EXPECT_GT(served, 30);

  Reply openapi = rest_->Call("GET", "/v1/openapi.json", "");
  ASSERT_EQ(openapi.status, 200);
  EXPECT_EQ(openapi.body["openapi"], "3.0.3");
  EXPECT_TRUE(openapi.body["paths"].contains("/v1/instances/{id}:stop"));
}

// Money through REST: the trial on the balance, a top-up by the operator
// (a replay is a no-op), transfers, usage, invoices and the dashboard.
TEST_F(RestApiTest, MoneyAndDashboard) {
  const std::string key = CreateTenant(*svd_, "rest-money");
  const std::string admin = svd_->admin_key();
  Reply balance = rest_->Call("GET", "/v1/balance", key);
  ASSERT_EQ(balance.status, 200) << balance.raw;
  EXPECT_EQ(balance.body["trialMicros"], "10000000");
  EXPECT_EQ(balance.body["paidMicros"], "0");
  EXPECT_TRUE(balance.body.contains("trialExpireTime"));
  Reply account = rest_->Call("GET", "/v1/account", key);
  ASSERT_EQ(account.status, 200);
  const std::string tenant = account.body["tenantId"];

  const std::string topup = R"({"paymentId": "pay-rest-1", "amountMicros": "25000000"})";
  Reply t = rest_->Call("POST", "/v1/admin/tenants/" + tenant + "/topups", admin, topup);
  ASSERT_EQ(t.status, 200) << t.raw;
  EXPECT_EQ(t.body["tenantDeltaMicros"], "25000000");
  t = rest_->Call("POST", "/v1/admin/tenants/" + tenant + "/topups", admin, topup);
  ASSERT_EQ(t.status, 200);
  balance = rest_->Call("GET", "/v1/balance", key);
  EXPECT_EQ(balance.body["paidMicros"], "25000000");
  Reply transfers = rest_->Call("GET", "/v1/transfers?kind=topup", key);
  ASSERT_EQ(transfers.status, 200);
  EXPECT_EQ(transfers.body["transfers"].size(), 1u);
  // An operator's credit and a refund of part of the top-up; a tenant may
  // call neither, and a second refund of the payment is refused.
  const std::string credit =
      R"({"creditId": "inc-rest-1", "amountMicros": "3000000", "reason": "late start"})";
  EXPECT_EQ(rest_->Call("POST", "/v1/admin/tenants/" + tenant + "/credits", key, credit).status,
            403);
  Reply credited = rest_->Call("POST", "/v1/admin/tenants/" + tenant + "/credits", admin, credit);
  ASSERT_EQ(credited.status, 200) << credited.raw;
  EXPECT_EQ(credited.body["kind"], "credit");
  EXPECT_EQ(credited.body["reason"], "late start");
  const std::string refund = R"({"amountMicros": "5000000", "reason": "asked for it back"})";
  const std::string refund_path = "/v1/admin/tenants/" + tenant + "/topups/pay-rest-1/refund";
  Reply refunded = rest_->Call("POST", refund_path, admin, refund);
  ASSERT_EQ(refunded.status, 200) << refunded.raw;
  EXPECT_EQ(refunded.body["tenantDeltaMicros"], "-5000000");
  Reply again = rest_->Call("POST", refund_path, admin,
                            R"({"amountMicros": "1000000", "reason": "asked for it back"})");
  EXPECT_EQ(again.status, 409) << again.raw;
  EXPECT_EQ(Reason(again), "IDEMPOTENCY_KEY_REUSED");
  EXPECT_EQ(rest_->Call("POST", "/v1/admin/tenants/" + tenant + "/topups/pay-none/refund", admin,
                        refund).status,
            404);
  balance = rest_->Call("GET", "/v1/balance", key);
  EXPECT_EQ(balance.body["paidMicros"], "23000000");
  bool told = false;
  for (const auto& n : balance.body["notices"]) {
    if (n["kind"] == "topup_refund" &&
        n["message"] == "5.00 CNY of payment 'pay-rest-1' was refunded from the paid wallet: "
                        "asked for it back") {
      told = true;
    }
  }
  EXPECT_TRUE(told) << balance.raw;
  // The audit log names the HTTP client, not svd's in-process channel.
  {
    pqxx::connection c(database_url_);
    pqxx::nontransaction n(c);
    auto peers = n.exec("SELECT DISTINCT peer FROM audit_log WHERE method LIKE '%/TopUp'");
    ASSERT_EQ(peers.size(), 1u);
    EXPECT_EQ(peers[0][0].as<std::string>(), "rest:127.0.0.1");
  }
  rest_->Call("POST", refund_path, admin, refund);  // A replay changes nothing.
  EXPECT_EQ(rest_->Call("GET", "/v1/balance", key).body["paidMicros"], "23000000");
  EXPECT_EQ(rest_->Call("GET", "/v1/usage?startTime=2026-01-01T00:00:00Z", key).status, 200);
  Reply bad_time = rest_->Call("GET", "/v1/usage?startTime=yesterday", key);
  EXPECT_EQ(bad_time.status, 400);
  EXPECT_EQ(rest_->Call("GET", "/v1/invoices", key).status, 200);
  Reply prices = rest_->Call("GET", "/v1/prices", key);
  ASSERT_EQ(prices.status, 200) << prices.raw;
  ASSERT_FALSE(prices.body["prices"].empty()) << prices.raw;
  EXPECT_EQ(prices.body["prices"][0]["itemKind"], "gpu_minute");
  EXPECT_EQ(prices.body["prices"][0]["item"], "RTX 4090");
  EXPECT_EQ(prices.body["prices"][0]["unitPriceMicros"], "33000");
  EXPECT_FALSE(prices.body["prices"][0].contains("untilTime")) << prices.raw;
  EXPECT_EQ(rest_->Call("GET", "/v1/invoices/inv-none", key).status, 404);

  Reply topups = rest_->Call("GET", "/v1/admin/dashboard/topups", admin);
  ASSERT_EQ(topups.status, 200) << topups.raw;
  EXPECT_EQ(topups.body["totalCount"], "1");
  EXPECT_EQ(topups.body["totalMicros"], "25000000");
  ASSERT_EQ(topups.body["topups"].size(), 1u);
  EXPECT_EQ(topups.body["topups"][0]["paymentId"], "pay-rest-1");
  EXPECT_EQ(topups.body["topups"][0]["tenantName"], "rest-money");
  EXPECT_EQ(topups.body["topups"][0]["refundedMicros"], "5000000");
  EXPECT_EQ(topups.body["refundedMicros"], "5000000");
  Reply trials = rest_->Call("GET", "/v1/admin/dashboard/trialGrants", admin);
  ASSERT_EQ(trials.status, 200) << trials.raw;
  bool found = false;
  for (const auto& row : trials.body["tenants"]) {
    if (row["tenantName"] != "rest-money") continue;
    found = true;
    EXPECT_EQ(row["grantedMicros"], "10000000");
    EXPECT_EQ(row["remainingMicros"], "10000000");
    EXPECT_EQ(row["burnedMicros"], "0");
  }
  EXPECT_TRUE(found) << trials.raw;
  Reply fleet = rest_->Call("GET", "/v1/admin/dashboard/fleet", admin);
  ASSERT_EQ(fleet.status, 200);
  EXPECT_EQ(fleet.body["nodes"].size(), 4u);
  EXPECT_EQ(fleet.body["leaves"].size(), 2u);
  Reply revenue = rest_->Call("GET", "/v1/admin/dashboard/revenue?granularity=REVENUE_GRANULARITY_MONTH",
                              admin);
  ASSERT_EQ(revenue.status, 200) << revenue.raw;
  ASSERT_FALSE(revenue.body["points"].empty());
  EXPECT_EQ(revenue.body["points"].back()["topupsMicros"], "25000000");
  EXPECT_EQ(revenue.body["points"].back()["topupRefundsMicros"], "5000000");
  EXPECT_EQ(revenue.body["points"].back()["creditsMicros"], "3000000");
  // Nothing was charged: the credit is the period's only expense.
  EXPECT_EQ(revenue.body["points"].back()["netRevenueMicros"], "-3000000") << revenue.raw;
  Reply bad = rest_->Call("GET", "/v1/admin/dashboard/revenue?granularity=WEEKLY", admin);
  EXPECT_EQ(bad.status, 400);
}

// The fleet view's GPU utilization comes from the agents' telemetry: the
// node running an 8-GPU instance reports its GPUs busy (the simulated
// agents report 97% +- jitter for held GPUs, 0% for idle ones), the idle
// nodes report 0%, and the hourly series has the current hour.
TEST(RestFleetUtilizationTest, HeatmapAndSeriesFollowTelemetry) {
  SvdOptions options{CreateTestDatabase(), 3, 1,
                     {"--agent-telemetry-interval-ms", "200", "--sla-checkpoint-interval-ms",
                      "300"}};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  Rest rest(svd.http_port());
  const std::string key = CreateTenant(svd, "rest-util");
  Reply created = rest.Call("POST", "/v1/instances", key,
                            R"({"instance": {"gpuCount": 8}, "requestId": "util-1"})");
  ASSERT_EQ(created.status, 200) << created.raw;
  json running = WaitForState(rest, key, created.body["id"], "RUNNING");
  ASSERT_EQ(running["placement"].size(), 1u);
  const std::string busy_node = running["placement"][0]["nodeName"];

  json fleet;
  bool seen = false;
  int busy = -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    Reply r = rest.Call("GET", "/v1/admin/dashboard/fleet", svd.admin_key());
    ASSERT_EQ(r.status, 200) << r.raw;
    fleet = r.body;
    int idle_seen = 0;
    busy = -1;
    for (const auto& n : fleet["nodes"]) {
      const int pct = n.value("gpuUtilizationPct", 0);
      if (n["nodeName"] == busy_node) {
        busy = pct;
      } else if (pct == 0) {
        ++idle_seen;  // proto3 JSON leaves 0 out; -1 (no samples) is present
      }
    }
    // The node's hour also holds its idle samples from before the start.
    seen = busy >= 50 && idle_seen == 2 && !fleet["utilizationSeries"].empty();
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(seen) << fleet.dump();
  // One busy node of three: the fleet's mean lies between the idle nodes'
  // and the busy one's.
  const int fleet_pct = fleet.value("gpuUtilizationPct", 0);
  EXPECT_GT(fleet_pct, 0) << fleet.dump();
  EXPECT_LT(fleet_pct, busy) << fleet.dump();
  ASSERT_EQ(fleet["leaves"].size(), 1u);
  EXPECT_EQ(fleet["leaves"][0].value("gpuUtilizationPct", 0), fleet_pct);
  EXPECT_GT(std::stoll(fleet["utilizationSeries"].back()["sampleCount"].get<std::string>()), 0);

  Reply bad = rest.Call("GET", "/v1/admin/dashboard/fleet?seriesHours=100000", svd.admin_key());
  EXPECT_EQ(bad.status, 400) << bad.raw;
  EXPECT_EQ(rest.Call("GET", "/v1/admin/dashboard/fleet", key).status, 403);
}

// The REST path shares the gRPC rate limits: over the key's burst, 429 with
// Retry-After and the RATE_LIMITED reason.
TEST(RestRateLimitTest, SameLimitsAsGrpc) {
  SvdOptions options{CreateTestDatabase(), 0, 1,
                     {"--rate-limit-key-rps", "0.5", "--rate-limit-key-burst", "3"}};
  SvdProcess svd(options);
  ASSERT_TRUE(svd.Start());
  const std::string key = CreateTenant(svd, "rest-limited");
  Rest rest(svd.http_port());
  int ok = 0;
  Reply limited;
  for (int i = 0; i < 6; ++i) {
    Reply r = rest.Call("GET", "/v1/account", key);
    if (r.status == 200) ++ok;
    if (r.status == 429) limited = r;
  }
  EXPECT_EQ(ok, 3);
  ASSERT_EQ(limited.status, 429);
  EXPECT_EQ(Reason(limited), "RATE_LIMITED");
  EXPECT_FALSE(limited.retry_after.empty());
}

}  // namespace
}  // namespace sv::testing
