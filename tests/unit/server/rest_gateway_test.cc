// The REST gateway's table and answers that need no server: every public
// gRPC method of proto/sv/v1 has a route, the OpenAPI document covers every
// route and resolves, and requests that cannot be transcoded get the right
// HTTP status and reason before any call is made.
#include <google/protobuf/descriptor.h>
#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "api/errors.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "server/rest_gateway.h"

const std::vector<std::string>& SvProtoFiles();  // all_protos.cc, generated.

namespace sv::server {
namespace {

namespace pb = google::protobuf;
using nlohmann::json;

// Every method of every service in proto/sv/v1 has a route, unless its
// service is exempt; every route names a method that exists.
TEST(RestRoutesTest, EveryPublicMethodHasARoute) {
  std::set<std::string> routed;
  for (const RestRoute& r : RestRoutes()) routed.insert(r.rpc);
  const auto& exempt = RestExemptServices();
  std::vector<std::string> missing;
  int methods = 0;
  ASSERT_GE(SvProtoFiles().size(), 6u);
  for (const std::string& file_name : SvProtoFiles()) {
    const pb::FileDescriptor* file = pb::DescriptorPool::generated_pool()->FindFileByName(file_name);
    ASSERT_NE(file, nullptr) << file_name << " is not linked";
    for (int s = 0; s < file->service_count(); ++s) {
      const pb::ServiceDescriptor* service = file->service(s);
      if (std::find(exempt.begin(), exempt.end(), service->full_name()) != exempt.end()) continue;
      for (int m = 0; m < service->method_count(); ++m) {
        ++methods;
        if (!routed.count(service->method(m)->full_name())) {
          missing.push_back(service->method(m)->full_name());
        }
      }
    }
  }
  EXPECT_TRUE(missing.empty()) << "no REST route (add one line to src/server/rest_routes.cc): "
                               << ::testing::PrintToString(missing);
  EXPECT_GT(methods, 30);
  for (const std::string& service : exempt) {
    EXPECT_NE(pb::DescriptorPool::generated_pool()->FindServiceByName(service), nullptr)
        << "exempt service " << service << " does not exist";
  }
  // The strict build of the gateway checks every route against the pool.
  auto gateway = RestGateway::Create(RestRoutes(), nullptr, /*require_all_methods=*/true);
  ASSERT_TRUE(gateway.ok()) << gateway.status();
}

TEST(RestRoutesTest, BadTablesAreRefused) {
  auto create = [](std::vector<RestRoute> routes) {
    return RestGateway::Create(std::move(routes), nullptr, true).status();
  };
  EXPECT_FALSE(create({{"GET", "/v1/x", "sv.v1.Nope.Nothing", ""}}).ok());
  EXPECT_FALSE(create({{"GET", "/v1/x/{nope}", "sv.v1.InstanceService.GetInstance", ""}}).ok());
  EXPECT_FALSE(create({{"GET", "/v1/x", "sv.v1.InstanceService.GetInstance", "*"}}).ok());
  EXPECT_FALSE(create({{"POST", "/v1/x", "sv.v1.InstanceService.CreateInstance", "request_id"}}).ok());
  EXPECT_FALSE(create({{"FETCH", "/v1/x", "sv.v1.InstanceService.GetInstance", ""}}).ok());
  EXPECT_FALSE(create({{"GET", "/v1/a/{id}", "sv.v1.InstanceService.GetInstance", ""},
                       {"GET", "/v1/a/{name}", "sv.v1.InstanceService.GetInstance", ""}})
                   .ok());
  // A streaming method cannot be a REST route.
  EXPECT_FALSE(create({{"POST", "/v1/x", "sv.v1.AgentService.Connect", "*"}}).ok());
  EXPECT_TRUE(create({{"GET", "/v1/a/{id}", "sv.v1.InstanceService.GetInstance", ""}}).ok());
}

// The document is OpenAPI 3, lists every route with its verb, declares every
// path parameter, and every $ref points at a schema it defines.
TEST(OpenApiTest, CoversEveryRouteAndResolves) {
  auto text = BuildOpenApi(RestRoutes());
  ASSERT_TRUE(text.ok()) << text.status();
  json doc = json::parse(*text);
  EXPECT_EQ(doc["openapi"], "3.0.3");
  ASSERT_TRUE(doc["paths"].is_object());
  const json& schemas = doc["components"]["schemas"];
  std::set<std::string> operation_ids;
  for (const RestRoute& r : RestRoutes()) {
    std::string verb = r.http_method;
    std::transform(verb.begin(), verb.end(), verb.begin(), ::tolower);
    ASSERT_TRUE(doc["paths"].contains(r.path)) << r.path;
    ASSERT_TRUE(doc["paths"][r.path].contains(verb)) << r.http_method << " " << r.path;
    const json& op = doc["paths"][r.path][verb];
    EXPECT_TRUE(operation_ids.insert(op["operationId"].get<std::string>()).second)
        << "duplicate operationId " << op["operationId"];
    EXPECT_TRUE(op["responses"].contains("200"));
    EXPECT_TRUE(op["responses"].contains("default"));
    const std::string path = r.path;
    for (size_t open = path.find('{'); open != std::string::npos; open = path.find('{', open + 1)) {
      const std::string name = path.substr(open + 1, path.find('}', open) - open - 1);
      bool declared = false;
      for (const auto& p : op.value("parameters", json::array())) {
        declared |= p["in"] == "path" && p["name"] == name && p["required"] == true;
      }
      EXPECT_TRUE(declared) << r.path << " does not declare {" << name << "}";
    }
    EXPECT_EQ(op.contains("requestBody"), std::string(r.body) != "") << r.path;
  }
  // Every reference resolves.
  int refs = 0;
  std::function<void(const json&)> walk = [&](const json& node) {
    if (node.is_object()) {
      for (auto it = node.begin(); it != node.end(); ++it) {
        if (it.key() == "$ref") {
          ++refs;
          const std::string ref = it.value();
          const std::string prefix = "#/components/schemas/";
          ASSERT_EQ(ref.rfind(prefix, 0), 0u) << ref;
          EXPECT_TRUE(schemas.contains(ref.substr(prefix.size()))) << ref;
        } else {
          walk(it.value());
        }
      }
    } else if (node.is_array()) {
      for (const auto& v : node) walk(v);
    }
  };
  walk(doc);
  EXPECT_GT(refs, 2 * static_cast<int>(RestRoutes().size()));
  // Schemas follow the canonical JSON mapping: lowerCamel names, int64 as
  // strings, enums by name, Timestamps as date-time text.
  const json& instance = schemas["sv.v1.Instance"]["properties"];
  EXPECT_EQ(instance["gpuCount"]["type"], "integer");
  EXPECT_EQ(instance["createTime"]["format"], "date-time");
  EXPECT_EQ(instance["state"]["type"], "string");
  EXPECT_TRUE(instance["state"].contains("enum"));
  EXPECT_EQ(schemas["sv.v1.Balance"]["properties"]["paidMicros"]["type"], "string");
}

class RestHandleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gateway = RestGateway::Create(RestRoutes(), nullptr, true);
    ASSERT_TRUE(gateway.ok()) << gateway.status();
    gateway_ = *std::move(gateway);
  }
  RestResponse Call(const std::string& method, const std::string& path, const std::string& body,
                    std::multimap<std::string, std::string> query = {}) {
    RestRequest request{method, path, std::move(query), "Bearer svk_x", "", body};
    return gateway_->Handle(request);
  }
  static std::string Reason(const RestResponse& r) { return json::parse(r.body)["reason"]; }

  std::unique_ptr<RestGateway> gateway_;
};

// Requests the gateway refuses itself, before any gRPC call.
TEST_F(RestHandleTest, RefusesWhatCannotBeTranscoded) {
  RestResponse r = Call("GET", "/v1/nothing", "");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(Reason(r), "ROUTE_NOT_FOUND");
  r = Call("PATCH", "/v1/instances", "");
  EXPECT_EQ(r.status, 405);
  EXPECT_EQ(Reason(r), "METHOD_NOT_ALLOWED");
  ASSERT_FALSE(r.headers.empty());
  EXPECT_EQ(r.headers[0].first, "Allow");
  EXPECT_NE(r.headers[0].second.find("POST"), std::string::npos);
  r = Call("POST", "/v1/instances", "{\"instance\": {");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "MALFORMED_JSON");
  r = Call("POST", "/v1/instances", R"({"instance": {"gpuCount": 8}, "colour": "red"})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "UNKNOWN_FIELD");
  r = Call("POST", "/v1/instances", R"({"instance": {"gpuCount": "eight"}})");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "INVALID_JSON_FIELD");
  r = Call("POST", "/v1/instances", R"([1, 2])");
  EXPECT_EQ(r.status, 400);
  r = Call("GET", "/v1/instances", "{}");
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "UNEXPECTED_BODY");
  r = Call("GET", "/v1/instances", "", {{"colour", "red"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "INVALID_QUERY");
  r = Call("GET", "/v1/instances", "", {{"showDeleted", "maybe"}});
  EXPECT_EQ(r.status, 400);
  r = Call("GET", "/v1/instances", "", {{"pageSize", "many"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(Reason(r), "INVALID_JSON_FIELD");
  // Control characters never reach gRPC metadata.
  RestRequest bad{"GET", "/v1/instances", {}, "Bearer \x01", "", ""};
  r = gateway_->Handle(bad);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(Reason(r), "MALFORMED_CREDENTIALS");
}

TEST(RestErrorsTest, HttpStatusFollowsTheGrpcCode) {
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::INVALID_ARGUMENT), 400);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::UNAUTHENTICATED), 401);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::PERMISSION_DENIED), 403);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::NOT_FOUND), 404);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::ALREADY_EXISTS), 409);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::FAILED_PRECONDITION), 400);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::RESOURCE_EXHAUSTED), 429);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::UNIMPLEMENTED), 501);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::UNAVAILABLE), 503);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::DEADLINE_EXCEEDED), 504);
  EXPECT_EQ(HttpStatusFromGrpcCode(grpc::StatusCode::INTERNAL), 500);
}

// The body carries the code name, message, reason and the status details;
// a RetryInfo also becomes a Retry-After header.
TEST(RestErrorsTest, ErrorBodyCarriesReasonAndDetails) {
  grpc::Status status = api::ToGrpcStatus(WithRetryAfter(
      Error(absl::StatusCode::kResourceExhausted, "RATE_LIMITED", "slow down"), 1500));
  RestResponse r = RestErrorFromGrpc(status);
  EXPECT_EQ(r.status, 429);
  json body = json::parse(r.body);
  EXPECT_EQ(body["code"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(body["message"], "slow down");
  EXPECT_EQ(body["reason"], "RATE_LIMITED");
  ASSERT_EQ(body["details"].size(), 2u);
  EXPECT_EQ(body["details"][0]["@type"], "type.googleapis.com/sv.v1.ErrorInfo");
  EXPECT_EQ(body["details"][0]["reason"], "RATE_LIMITED");
  EXPECT_EQ(body["details"][1]["@type"], "type.googleapis.com/sv.v1.RetryInfo");
  EXPECT_EQ(body["details"][1]["retryDelay"], "1.500s");
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0], std::make_pair(std::string("Retry-After"), std::string("2")));

  r = RestErrorFromGrpc(grpc::Status(grpc::StatusCode::NOT_FOUND, "gone"));
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(json::parse(r.body)["reason"], "NOT_FOUND");
}

}  // namespace
}  // namespace sv::server
