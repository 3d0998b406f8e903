// The OpenAPI 3 document of the REST API, generated from the route table and
// the protobuf descriptors, so it cannot drift from the proto.
#include <google/protobuf/descriptor.h>

#include <cctype>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "server/rest_gateway.h"

namespace sv::server {
namespace {

namespace pb = google::protobuf;
using nlohmann::json;

std::string SchemaRef(const std::string& full_name) {
  return "#/components/schemas/" + full_name;
}

class SchemaBuilder {
 public:
  // The schema of a message, added (with everything it reaches) to `schemas_`.
  json RefTo(const pb::Descriptor* d) {
    if (json special = WellKnown(d); !special.is_null()) return special;
    if (!seen_.count(d->full_name())) {
      seen_.insert(d->full_name());
      json properties = json::object();
      for (int i = 0; i < d->field_count(); ++i) {
        const pb::FieldDescriptor* f = d->field(i);
        properties[f->json_name()] = FieldSchema(f);
      }
      schemas_[d->full_name()] = {{"type", "object"}, {"properties", properties}};
    }
    return {{"$ref", SchemaRef(d->full_name())}};
  }

  json FieldSchema(const pb::FieldDescriptor* f) {
    if (f->is_map()) {
      return {{"type", "object"},
              {"additionalProperties", SingleSchema(f->message_type()->map_value())}};
    }
    json single = SingleSchema(f);
    if (f->is_repeated()) return {{"type", "array"}, {"items", single}};
    return single;
  }

  json SingleSchema(const pb::FieldDescriptor* f) {
    using T = pb::FieldDescriptor;
    switch (f->type()) {
      case T::TYPE_INT32: case T::TYPE_SINT32: case T::TYPE_SFIXED32:
        return {{"type", "integer"}, {"format", "int32"}};
      case T::TYPE_UINT32: case T::TYPE_FIXED32:
        return {{"type", "integer"}, {"format", "int64"}, {"minimum", 0}};
      // The canonical JSON mapping writes 64-bit integers as strings.
      case T::TYPE_INT64: case T::TYPE_SINT64: case T::TYPE_SFIXED64:
      case T::TYPE_UINT64: case T::TYPE_FIXED64:
        return {{"type", "string"}, {"format", "int64"}};
      case T::TYPE_DOUBLE: return {{"type", "number"}, {"format", "double"}};
      case T::TYPE_FLOAT: return {{"type", "number"}, {"format", "float"}};
      case T::TYPE_BOOL: return {{"type", "boolean"}};
      case T::TYPE_STRING: return {{"type", "string"}};
      case T::TYPE_BYTES: return {{"type", "string"}, {"format", "byte"}};
      case T::TYPE_ENUM: {
        json values = json::array();
        for (int i = 0; i < f->enum_type()->value_count(); ++i) {
          values.push_back(f->enum_type()->value(i)->name());
        }
        return {{"type", "string"}, {"enum", values}};
      }
      case T::TYPE_MESSAGE: case T::TYPE_GROUP: return RefTo(f->message_type());
    }
    return json::object();
  }

  json& schemas() { return schemas_; }

 private:
  static json WellKnown(const pb::Descriptor* d) {
    const std::string& n = d->full_name();
    if (n == "google.protobuf.Timestamp") return {{"type", "string"}, {"format", "date-time"}};
    if (n == "google.protobuf.Duration") {
      return {{"type", "string"}, {"pattern", "^-?[0-9]+(\\.[0-9]+)?s$"}};
    }
    if (n == "google.protobuf.FieldMask") return {{"type", "string"}};
    if (n == "google.protobuf.Empty") return {{"type", "object"}};
    if (n == "google.protobuf.Any") {
      return {{"type", "object"},
              {"properties", {{"@type", {{"type", "string"}}}}},
              {"additionalProperties", true}};
    }
    if (n == "google.protobuf.Struct") return {{"type", "object"}};
    return nullptr;
  }

  json schemas_ = json::object();
  std::set<std::string> seen_;
};

// The scalar fields a GET or DELETE takes from the query string: top level,
// not in the path, and Timestamps as RFC 3339 text.
void AddQueryParameters(const pb::Descriptor* request, const std::set<std::string>& in_path,
                        SchemaBuilder& schemas, json& parameters) {
  for (int i = 0; i < request->field_count(); ++i) {
    const pb::FieldDescriptor* f = request->field(i);
    if (in_path.count(f->name())) continue;
    const bool message = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    if (message && f->message_type()->full_name() != "google.protobuf.Timestamp") continue;
    parameters.push_back({{"name", f->json_name()},
                          {"in", "query"},
                          {"required", false},
                          {"schema", schemas.FieldSchema(f)}});
  }
}

}  // namespace

absl::StatusOr<std::string> BuildOpenApi(const std::vector<RestRoute>& routes) {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  SchemaBuilder schemas;
  json paths = json::object();
  for (const RestRoute& r : routes) {
    const pb::MethodDescriptor* method = pool->FindMethodByName(r.rpc);
    if (method == nullptr) return absl::InvalidArgumentError(absl::StrCat("no method ", r.rpc));
    json parameters = json::array();
    std::set<std::string> in_path;
    for (absl::string_view part : absl::StrSplit(r.path, absl::ByAnyChar("/:"))) {
      if (part.size() > 2 && part.front() == '{' && part.back() == '}') {
        const std::string name(part.substr(1, part.size() - 2));
        in_path.insert(name.substr(0, name.find('.')));
        parameters.push_back({{"name", name},
                              {"in", "path"},
                              {"required", true},
                              {"schema", {{"type", "string"}}}});
      }
    }
    json op = {{"operationId", method->service()->name() + "_" + method->name()},
               {"tags", json::array({method->service()->name()})},
               {"summary", method->full_name()},
               {"x-grpc-method", absl::StrCat("/", method->service()->full_name(), "/",
                                             method->name())}};
    const std::string body = r.body;
    if (body.empty()) {
      AddQueryParameters(method->input_type(), in_path, schemas, parameters);
    } else {
      const pb::Descriptor* body_type = method->input_type();
      if (body != "*") {
        const pb::FieldDescriptor* f = body_type->FindFieldByName(body);
        if (f == nullptr || f->message_type() == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(r.path, ": bad body ", body));
        }
        body_type = f->message_type();
      }
      op["requestBody"] = {
          {"required", false},
          {"content", {{"application/json", {{"schema", schemas.RefTo(body_type)}}}}}};
    }
    if (!parameters.empty()) op["parameters"] = parameters;
    op["responses"] = {
        {"200",
         {{"description", "OK"},
          {"content",
           {{"application/json", {{"schema", schemas.RefTo(method->output_type())}}}}}}},
        {"default",
         {{"description", "An error: HTTP status from the gRPC code (docs/rest.md)"},
          {"content",
           {{"application/json", {{"schema", {{"$ref", SchemaRef("sv.rest.Error")}}}}}}}}}};
    std::string lower = r.http_method;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    paths[r.path][lower] = op;
  }
  schemas.schemas()["sv.rest.Error"] = {
      {"type", "object"},
      {"required", {"code", "message", "reason"}},
      {"properties",
       {{"code", {{"type", "string"}, {"description", "gRPC code name, e.g. NOT_FOUND"}}},
        {"message", {{"type", "string"}}},
        {"reason", {{"type", "string"}, {"description", "Machine-readable UPPER_SNAKE_CASE"}}},
        {"details", {{"type", "array"}, {"items", {{"type", "object"}}}}}}}};
  json doc = {
      {"openapi", "3.0.3"},
      {"info",
       {{"title", "sv API"},
        {"version", "v1"},
        {"description",
         "REST/JSON mapping of sv's gRPC API (protobuf canonical JSON). See docs/rest.md."}}},
      {"servers", json::array({{{"url", "/"}}})},
      {"security", json::array({{{"bearerAuth", json::array()}}})},
      {"paths", paths},
      {"components",
       {{"schemas", schemas.schemas()},
        {"securitySchemes",
         {{"bearerAuth", {{"type", "http"}, {"scheme", "bearer"}}}}}}}};
  return doc.dump(1);
}

}  // namespace sv::server
