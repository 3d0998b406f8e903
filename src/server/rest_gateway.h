#ifndef SV_SERVER_REST_GATEWAY_H_
#define SV_SERVER_REST_GATEWAY_H_

// The REST/JSON API (docs/rest.md): a table of routes, each an HTTP verb and
// a path template mapped onto one unary gRPC method. A call is transcoded
// with protobuf's canonical JSON mapping and sent through svd's own gRPC
// server over an in-process channel, so authentication, authorization, rate
// limits, validation and logging are exactly those of the gRPC API.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace grpc {
class ChannelInterface;
class Status;
}  // namespace grpc

namespace httplib {
class Server;
}

namespace sv::server {

// One line of the route table. `path` is a template such as
// "/v1/instances/{id}:stop": a `{field}` segment fills that request field
// (dots reach into nested messages, e.g. {quota.tenant_id}); a `:verb` suffix
// on the last segment names a custom method (AIP-136).
struct RestRoute {
  const char* http_method;  // GET, POST, PUT, PATCH or DELETE.
  const char* path;
  const char* rpc;          // Fully qualified, e.g. "sv.v1.InstanceService.StopInstance".
  // What the JSON body fills: "*" the whole request, a field name that one
  // message field, "" nothing (fields come from the query string instead).
  const char* body;
};

// The routes of svd's public API (rest_routes.cc), and the services that are
// deliberately not on REST (node agents' protocol).
const std::vector<RestRoute>& RestRoutes();
const std::vector<std::string>& RestExemptServices();

// The largest request body REST takes; a larger one gets 413. Below gRPC's
// 4 MiB message limit because JSON is bigger than the wire form.
inline constexpr size_t kRestBodyBytesMax = 1 << 20;

struct RestRequest {
  std::string method;
  std::string path;  // Already percent-decoded.
  std::multimap<std::string, std::string> query;
  std::string authorization;  // The Authorization header, "" when absent.
  std::string client_address;  // The HTTP peer, for the failed-auth limit per client.
  std::string body;
};

struct RestResponse {
  int status = 200;
  std::string body;  // JSON.
  std::vector<std::pair<std::string, std::string>> headers;
};

class RestGateway {
 public:
  // Checks every route against the generated descriptor pool: the method
  // exists and is unary, path fields are scalar fields of the request, the
  // body field is a message field, and no two routes collide. With
  // `require_all_methods` false, a route whose method is not linked into this
  // binary answers 501 (as gRPC would) instead of failing the whole table.
  static absl::StatusOr<std::unique_ptr<RestGateway>> Create(
      std::vector<RestRoute> routes, std::shared_ptr<grpc::ChannelInterface> channel,
      bool require_all_methods = true);
  ~RestGateway();

  RestResponse Handle(const RestRequest& request) const;

  // Serves /v1/... (every route), /v1/openapi.json, and JSON error bodies
  // for errors httplib answers itself (413 and the like).
  void Mount(httplib::Server& server) const;

  const std::string& openapi_json() const { return openapi_json_; }

 private:
  struct CompiledRoute;
  RestGateway();

  std::vector<std::unique_ptr<CompiledRoute>> routes_;
  std::vector<RestRoute> unavailable_;  // Methods not linked into this binary.
  std::shared_ptr<grpc::ChannelInterface> channel_;
  std::string openapi_json_;
};

// The error body and HTTP status REST answers for a gRPC status:
// {"code": "NOT_FOUND", "message": ..., "reason": ..., "details": [...]}.
RestResponse RestErrorFromGrpc(const grpc::Status& status);
RestResponse RestError(int http_status, const std::string& code, const std::string& reason,
                       const std::string& message);
int HttpStatusFromGrpcCode(int grpc_code);

// OpenAPI 3.0 document for the routes, with schemas from the descriptors.
absl::StatusOr<std::string> BuildOpenApi(const std::vector<RestRoute>& routes);

}  // namespace sv::server

#endif  // SV_SERVER_REST_GATEWAY_H_
