#include "server/rest_gateway.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/impl/rpc_method.h>
#include <httplib.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "api/errors.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "sv/v1/error.pb.h"

namespace sv::server {

namespace pb = google::protobuf;

namespace {

constexpr absl::Duration kCallDeadline = absl::Seconds(30);
constexpr size_t kAuthorizationBytesMax = 4096;
constexpr size_t kQueryParamsMax = 64;

}  // namespace

// One `{field.path}` or literal segment of a path template. Outside the
// anonymous namespace because RestGateway::CompiledRoute holds them.
struct RouteSegment {
  std::string literal;
  std::vector<const pb::FieldDescriptor*> field_path;  // Empty for a literal.
  std::string field_name;                               // As written in the template.
};

namespace {

bool IsScalar(const pb::FieldDescriptor* f) {
  return !f->is_repeated() && f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE;
}

bool IsWellKnownString(const pb::Descriptor* d) {
  const std::string& name = d->full_name();
  return name == "google.protobuf.Timestamp" || name == "google.protobuf.Duration" ||
         name == "google.protobuf.FieldMask";
}

// Resolves "a.b.c" against a message, by proto or JSON names.
absl::StatusOr<std::vector<const pb::FieldDescriptor*>> ResolveFieldPath(
    const pb::Descriptor* message, const std::string& path) {
  std::vector<const pb::FieldDescriptor*> out;
  const pb::Descriptor* current = message;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (current == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a field"));
    }
    const std::string name(part);
    const pb::FieldDescriptor* field = current->FindFieldByName(name);
    if (field == nullptr) field = current->FindFieldByCamelcaseName(name);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is not a field of ", message->full_name()));
    }
    out.push_back(field);
    current = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !field->is_repeated()
                  ? field->message_type()
                  : nullptr;
  }
  return out;
}

// The nested JSON object where a field path's value goes.
nlohmann::json& JsonSlot(nlohmann::json& root,
                         const std::vector<const pb::FieldDescriptor*>& field_path) {
  nlohmann::json* node = &root;
  for (const auto* field : field_path) node = &(*node)[field->name()];
  return *node;
}

std::string MessageOf(const pb::util::Status& status) {
  return std::string(status.message().data(), status.message().size());
}

// Whether a path has the shape of a template, for routes whose method this
// binary lacks (no descriptors to resolve their fields).
bool RoughMatch(const std::string& path_template, const std::vector<std::string>& parts) {
  std::vector<std::string> want = absl::StrSplit(path_template.substr(1), '/');
  if (want.size() != parts.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i].find('{') == std::string::npos && want[i] != parts[i]) return false;
  }
  return true;
}

// Header values must be printable ASCII before they may become gRPC
// metadata (the core refuses anything else).
bool IsPrintableAscii(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

struct RestGateway::CompiledRoute {
  RestRoute route;
  std::string http_method;
  std::vector<RouteSegment> segments;
  std::string verb;         // After ':' in the last segment; "" for none.
  std::string grpc_path;    // "/sv.v1.InstanceService/StopInstance"; RpcMethod keeps a pointer.
  const pb::MethodDescriptor* method = nullptr;
  const pb::Message* request_prototype = nullptr;
  const pb::Message* response_prototype = nullptr;
  const pb::FieldDescriptor* body_field = nullptr;  // When body names a field.
  bool takes_body = false;

  // Fills `path_fields` (JSON) when the path matches.
  bool Match(const std::vector<std::string>& parts, nlohmann::json* path_fields) const {
    if (parts.size() != segments.size()) return false;
    nlohmann::json fields = nlohmann::json::object();
    for (size_t i = 0; i < parts.size(); ++i) {
      std::string part = parts[i];
      const bool last = i + 1 == parts.size();
      if (last && !verb.empty()) {
        const std::string suffix = ":" + verb;
        if (part.size() <= suffix.size() ||
            part.compare(part.size() - suffix.size(), suffix.size(), suffix) != 0) {
          return false;
        }
        part.resize(part.size() - suffix.size());
      }
      const RouteSegment& s = segments[i];
      if (s.field_path.empty()) {
        if (part != s.literal) return false;
      } else {
        // Only a plain route's last segment may hold a colon (an image
        // "name:version"); elsewhere it would be a custom method.
        const bool colon_ok = last && verb.empty();
        if (part.empty() || (!colon_ok && part.find(':') != std::string::npos)) return false;
        JsonSlot(fields, s.field_path) = part;
      }
    }
    *path_fields = std::move(fields);
    return true;
  }
};

RestGateway::RestGateway() = default;
RestGateway::~RestGateway() = default;

absl::StatusOr<std::unique_ptr<RestGateway>> RestGateway::Create(
    std::vector<RestRoute> routes, std::shared_ptr<grpc::ChannelInterface> channel,
    bool require_all_methods) {
  std::unique_ptr<RestGateway> gateway(new RestGateway());
  gateway->channel_ = std::move(channel);
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  pb::MessageFactory* factory = pb::MessageFactory::generated_factory();
  std::set<std::string> seen;
  for (const RestRoute& r : routes) {
    auto c = std::make_unique<CompiledRoute>();
    c->route = r;
    c->http_method = r.http_method;
    const std::string where = absl::StrCat(r.http_method, " ", r.path);
    static const std::set<std::string> kMethods = {"GET", "POST", "PUT", "PATCH", "DELETE"};
    if (!kMethods.count(c->http_method)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown HTTP method"));
    }
    c->method = pool->FindMethodByName(r.rpc);
    if (c->method == nullptr && !require_all_methods) {
      spdlog::warn("rest: {} -> {} is not in this binary; it answers 501", where, r.rpc);
      gateway->unavailable_.push_back(r);
      continue;
    }
    if (c->method == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no gRPC method ", r.rpc));
    }
    if (c->method->client_streaming() || c->method->server_streaming()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", r.rpc, " is streaming"));
    }
    c->grpc_path = absl::StrCat("/", c->method->service()->full_name(), "/", c->method->name());
    c->request_prototype = factory->GetPrototype(c->method->input_type());
    c->response_prototype = factory->GetPrototype(c->method->output_type());
    const std::string path = r.path;
    if (path.size() < 2 || path[0] != '/' || path.find("//") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": malformed path template"));
    }
    std::vector<std::string> parts = absl::StrSplit(path.substr(1), '/');
    std::string& last = parts.back();
    const size_t brace = last.rfind('}');
    const size_t colon = last.find(':', brace == std::string::npos ? 0 : brace);
    if (colon != std::string::npos) {
      c->verb = last.substr(colon + 1);
      last.resize(colon);
    }
    std::set<std::string> path_fields;
    for (const std::string& part : parts) {
      RouteSegment s;
      if (part.size() > 2 && part.front() == '{' && part.back() == '}') {
        s.field_name = part.substr(1, part.size() - 2);
        auto field_path = ResolveFieldPath(c->method->input_type(), s.field_name);
        if (!field_path.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": ", field_path.status().message()));
        }
        if (!IsScalar(field_path->back())) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": path field ", s.field_name, " is not a scalar"));
        }
        s.field_path = *field_path;
        path_fields.insert(s.field_name);
      } else if (part.empty() || part.find_first_of("{}:") != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": malformed segment '", part, "'"));
      } else {
        s.literal = part;
      }
      c->segments.push_back(std::move(s));
    }
    const std::string body = r.body;
    c->takes_body = !body.empty();
    if (c->takes_body && (c->http_method == "GET" || c->http_method == "DELETE")) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": GET and DELETE take no body"));
    }
    if (!body.empty() && body != "*") {
      c->body_field = c->method->input_type()->FindFieldByName(body);
      if (c->body_field == nullptr || c->body_field->is_repeated() ||
          c->body_field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": body '", body, "' is not a message field"));
      }
    }
    // Two routes collide when they differ only in the names of variables.
    std::string shape = c->http_method + " ";
    for (const RouteSegment& s : c->segments) {
      absl::StrAppend(&shape, "/", s.field_path.empty() ? s.literal : "*");
    }
    absl::StrAppend(&shape, ":", c->verb);
    if (!seen.insert(shape).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": collides with another route"));
    }
    gateway->routes_.push_back(std::move(c));
  }
  std::vector<RestRoute> served;
  for (const auto& c : gateway->routes_) served.push_back(c->route);
  auto openapi = BuildOpenApi(served);
  if (!openapi.ok()) return openapi.status();
  gateway->openapi_json_ = *std::move(openapi);
  return gateway;
}

namespace {

// Query parameters become a JSON object that the canonical JSON parser then
// reads, so types and enums are checked exactly as in a body.
absl::StatusOr<nlohmann::json> QueryToJson(const pb::Descriptor* message,
                                           const std::multimap<std::string, std::string>& query) {
  nlohmann::json out = nlohmann::json::object();
  if (query.size() > kQueryParamsMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kQueryParamsMax, " query parameters"));
  }
  for (auto it = query.begin(); it != query.end(); it = query.upper_bound(it->first)) {
    const std::string& key = it->first;
    auto field_path = ResolveFieldPath(message, key);
    if (!field_path.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown query parameter '", key, "'"));
    }
    const pb::FieldDescriptor* field = field_path->back();
    // A well-known type is one JSON string (a Timestamp's RFC 3339 text):
    // `startTime.seconds` is no parameter, and with `startTime` beside it
    // made the JSON below index into a string (a 500 before this check).
    for (size_t i = 0; i + 1 < field_path->size(); ++i) {
      const pb::FieldDescriptor* outer = (*field_path)[i];
      if (outer->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE &&
          IsWellKnownString(outer->message_type())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "query parameter '", key, "' reaches inside ", outer->json_name(),
            ", which is given whole as a string"));
      }
    }
    const bool message_typed = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    if (message_typed && !IsWellKnownString(field->message_type())) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter '", key, "' is a message; send it in a body"));
    }
    auto range = query.equal_range(key);
    std::vector<nlohmann::json> values;
    for (auto v = range.first; v != range.second; ++v) {
      if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_BOOL) {
        if (v->second != "true" && v->second != "false") {
          return absl::InvalidArgumentError(
              absl::StrCat("query parameter '", key, "' must be true or false"));
        }
        values.emplace_back(v->second == "true");
      } else {
        values.emplace_back(v->second);
      }
    }
    if (field->is_repeated()) {
      JsonSlot(out, *field_path) = values;
    } else if (values.size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat("query parameter '", key, "' repeated"));
    } else {
      JsonSlot(out, *field_path) = values.front();
    }
  }
  return out;
}

// Parses JSON into a request with the canonical mapping; unknown fields are
// errors, as they are for gRPC clients that send fields we do not have.
RestResponse* ParseInto(const std::string& json, pb::Message* message, RestResponse* error) {
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  pb::util::Status status = pb::util::JsonStringToMessage(json, message, options);
  if (status.ok()) return nullptr;
  const std::string text = MessageOf(status);
  const bool unknown = text.find("Cannot find field") != std::string::npos;
  *error = RestError(400, "INVALID_ARGUMENT", unknown ? "UNKNOWN_FIELD" : "INVALID_JSON_FIELD",
                     "the request does not fit " + message->GetDescriptor()->full_name() + ": " +
                         text);
  return error;
}

}  // namespace

RestResponse RestGateway::Handle(const RestRequest& request) const {
  std::vector<std::string> parts;
  if (request.path.size() < 2 || request.path[0] != '/') {
    return RestError(404, "NOT_FOUND", "ROUTE_NOT_FOUND", "no such route");
  }
  parts = absl::StrSplit(request.path.substr(1), '/');
  const CompiledRoute* route = nullptr;
  nlohmann::json path_fields;
  std::vector<std::string> allowed;
  // Custom methods (":verb") first, so that "/v1/x/{id}:stop" is never read
  // as the id "{id}:stop" of a plain route.
  std::vector<const CompiledRoute*> order;
  for (const auto& r : routes_) if (!r->verb.empty()) order.push_back(r.get());
  for (const auto& r : routes_) if (r->verb.empty()) order.push_back(r.get());
  for (const CompiledRoute* r : order) {
    nlohmann::json fields;
    if (!r->Match(parts, &fields)) continue;
    if (r->http_method != request.method) {
      allowed.push_back(r->http_method);
      continue;
    }
    route = r;
    path_fields = std::move(fields);
    break;
  }
  if (route == nullptr) {
    for (const RestRoute& r : unavailable_) {
      if (request.method == r.http_method && RoughMatch(r.path, parts)) {
        return RestError(501, "UNIMPLEMENTED", "UNIMPLEMENTED",
                         absl::StrCat(r.rpc, " is not served by this svd"));
      }
    }
    if (allowed.empty()) {
      return RestError(404, "NOT_FOUND", "ROUTE_NOT_FOUND",
                       absl::StrCat("no route for ", request.method, " ", request.path,
                                    "; see /v1/openapi.json"));
    }
    RestResponse response = RestError(405, "UNIMPLEMENTED", "METHOD_NOT_ALLOWED",
                                      absl::StrCat(request.method, " is not allowed on ",
                                                   request.path));
    std::string allow;
    for (const auto& m : allowed) absl::StrAppend(&allow, allow.empty() ? "" : ", ", m);
    response.headers.emplace_back("Allow", allow);
    return response;
  }

  std::unique_ptr<pb::Message> message(route->request_prototype->New());
  RestResponse error;
  if (!route->takes_body) {
    if (!request.body.empty()) {
      return RestError(400, "INVALID_ARGUMENT", "UNEXPECTED_BODY",
                       absl::StrCat(request.method, " ", route->route.path,
                                    " takes no body; send fields as query parameters"));
    }
  } else {
    std::string body = request.body.empty() ? "{}" : request.body;
    if (!nlohmann::json::accept(body)) {
      return RestError(400, "INVALID_ARGUMENT", "MALFORMED_JSON", "the body is not valid JSON");
    }
    if (route->body_field != nullptr) {
      body = absl::StrCat("{\"", route->body_field->name(), "\":", body, "}");
    }
    if (ParseInto(body, message.get(), &error) != nullptr) return error;
  }
  auto query = QueryToJson(route->method->input_type(), request.query);
  if (!query.ok()) {
    return RestError(400, "INVALID_ARGUMENT", "INVALID_QUERY", std::string(query.status().message()));
  }
  // Path fields win over the same fields in the body or the query.
  query->merge_patch(path_fields);
  if (!query->empty()) {
    std::unique_ptr<pb::Message> overlay(route->request_prototype->New());
    // Path segments and query values are whatever bytes the client
    // percent-encoded; JSON (and proto3 strings) take only UTF-8.
    std::string overlay_json;
    try {
      overlay_json = query->dump();
    } catch (const nlohmann::json::type_error&) {
      return RestError(400, "INVALID_ARGUMENT", "INVALID_UTF8",
                       "path and query parameters must be UTF-8");
    }
    if (ParseInto(overlay_json, overlay.get(), &error) != nullptr) return error;
    message->MergeFrom(*overlay);
  }

  if (request.authorization.size() > kAuthorizationBytesMax ||
      !IsPrintableAscii(request.authorization)) {
    return RestError(401, "UNAUTHENTICATED", "MALFORMED_CREDENTIALS",
                     "the Authorization header must be 'Bearer <api key>'");
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(kCallDeadline));
  if (!request.authorization.empty()) context.AddMetadata("authorization", request.authorization);
  if (!request.client_address.empty() && IsPrintableAscii(request.client_address)) {
    context.AddMetadata("x-sv-rest-client", request.client_address);
  }
  std::unique_ptr<pb::Message> response(route->response_prototype->New());
  grpc::internal::RpcMethod method(route->grpc_path.c_str(), grpc::internal::RpcMethod::NORMAL_RPC);
  grpc::Status status = grpc::internal::BlockingUnaryCall<pb::Message, pb::Message>(
      channel_.get(), method, &context, *message, response.get());
  if (!status.ok()) return RestErrorFromGrpc(status);

  pb::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  RestResponse ok;
  pb::util::Status printed = pb::util::MessageToJsonString(*response, &ok.body, print);
  if (!printed.ok()) {
    spdlog::error("rest: cannot print {}: {}", response->GetDescriptor()->full_name(),
                  MessageOf(printed));
    return RestError(500, "INTERNAL", "INTERNAL", "cannot render the response");
  }
  return ok;
}

int HttpStatusFromGrpcCode(int grpc_code) {
  // google.rpc.Code's documented HTTP mapping (as in grpc-gateway).
  switch (static_cast<grpc::StatusCode>(grpc_code)) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::CANCELLED: return 499;
    case grpc::StatusCode::INVALID_ARGUMENT: return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::ALREADY_EXISTS: return 409;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::FAILED_PRECONDITION: return 400;
    case grpc::StatusCode::ABORTED: return 409;
    case grpc::StatusCode::OUT_OF_RANGE: return 400;
    case grpc::StatusCode::UNIMPLEMENTED: return 501;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    default: return 500;
  }
}

RestResponse RestError(int http_status, const std::string& code, const std::string& reason,
                       const std::string& message) {
  RestResponse response;
  response.status = http_status;
  nlohmann::json body = {{"code", code},
                         {"message", message},
                         {"reason", reason},
                         {"details", nlohmann::json::array()}};
  // A message may quote what the client sent (a path, an id): bytes that
  // are not UTF-8 become U+FFFD instead of throwing.
  response.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return response;
}

RestResponse RestErrorFromGrpc(const grpc::Status& status) {
  const int code = static_cast<int>(status.error_code());
  std::string reason = api::ReasonOf(status);
  if (reason.empty()) reason = api::GrpcCodeName(status.error_code());
  nlohmann::json body = {{"code", api::GrpcCodeName(status.error_code())},
                         {"message", status.error_message()},
                         {"reason", reason},
                         {"details", nlohmann::json::array()}};
  RestResponse response;
  response.status = HttpStatusFromGrpcCode(code);
  v1::RpcStatus details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const auto& any : details.details()) {
      std::string json;
      if (pb::util::MessageToJsonString(any, &json).ok() && nlohmann::json::accept(json)) {
        body["details"].push_back(nlohmann::json::parse(json));
      }
      v1::RetryInfo retry;
      if (any.UnpackTo(&retry)) {
        const int64_t ms = retry.retry_delay().seconds() * 1000 + retry.retry_delay().nanos() / 1'000'000;
        response.headers.emplace_back("Retry-After", std::to_string((ms + 999) / 1000));
      }
    }
  }
  // A message may quote what the client sent (a path, an id): bytes that
  // are not UTF-8 become U+FFFD instead of throwing.
  response.body = body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return response;
}

void RestGateway::Mount(httplib::Server& server) const {
  server.Get("/v1/openapi.json", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(openapi_json_, "application/json");
  });
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    RestRequest request;
    request.method = req.method;
    request.path = req.path;
    // The URL's query string only. httplib adds the pairs of a form-encoded
    // body to req.params too, and `curl -d '{...}'` labels its JSON body
    // application/x-www-form-urlencoded: the body would come back as an
    // unknown query parameter. The body is read as JSON whatever its label.
    if (const size_t mark = req.target.find('?'); mark != std::string::npos) {
      httplib::detail::parse_query_text(req.target.substr(mark + 1), request.query);
    }
    request.authorization = req.get_header_value("Authorization");
    request.body = req.body;
    request.client_address = req.remote_addr;
    RestResponse response = Handle(request);
    res.status = response.status;
    for (const auto& [name, value] : response.headers) res.set_header(name, value);
    res.set_header("Cache-Control", "no-store");
    res.set_content(response.body, "application/json");
  };
  const char* kPattern = R"(/v1/.*)";
  server.Get(kPattern, handler);
  server.Post(kPattern, handler);
  server.Put(kPattern, handler);
  server.Patch(kPattern, handler);
  server.Delete(kPattern, handler);
  // httplib answers some errors itself (413 for a body over the limit, 400
  // for a malformed request); give them the same JSON error body.
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    RestResponse error;
    if (res.status == 413 &&
        req.get_header_value("Content-Type").rfind("application/x-www-form-urlencoded", 0) == 0) {
      // httplib's own, lower limit for form-encoded bodies.
      error = RestError(413, "RESOURCE_EXHAUSTED", "BODY_TOO_LARGE",
                        absl::StrCat("a body labelled application/x-www-form-urlencoded is at most ",
                                     CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH,
                                     " bytes; send JSON as application/json (up to ",
                                     kRestBodyBytesMax, " bytes)"));
    } else if (res.status == 413) {
      error = RestError(413, "RESOURCE_EXHAUSTED", "BODY_TOO_LARGE",
                        absl::StrCat("request bodies are at most ", kRestBodyBytesMax, " bytes"));
    } else if (res.status == 404) {
      error = RestError(404, "NOT_FOUND", "ROUTE_NOT_FOUND", "no such route");
    } else {
      error = RestError(res.status, res.status >= 500 ? "INTERNAL" : "INVALID_ARGUMENT",
                        "BAD_HTTP_REQUEST", "the HTTP request was not understood");
    }
    res.set_content(error.body, "application/json");
  });
}

}  // namespace sv::server
