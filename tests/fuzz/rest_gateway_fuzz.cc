// libFuzzer target: the REST gateway's request handling (server/rest_gateway.h)
// over svd's real route table. The first byte picks the HTTP method; then
// come the request target up to a newline (split at '?' and decoded with
// httplib's own functions, as svd's HTTP server does), the Authorization
// header up to the next newline, and the body (the rest).
// RestGateway::Handle matches the route, fills path fields, turns the query
// into JSON, parses the body, and calls the method over an in-process gRPC
// channel whose generic service answers OK with an empty response (so the
// printing path runs too). Nothing may crash, and every answer is an HTTP
// status with a JSON body; an error body has a code and a reason.
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "fuzz_input.h"
#include "nlohmann/json.hpp"
#include "server/rest_gateway.h"

namespace {

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

// Answers every method OK with an empty message (every field default).
class EmptyAnswers final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor final : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() {
        grpc::Slice empty;  // Zero bytes: every field default.
        response_ = grpc::ByteBuffer(&empty, 1);
        StartRead(&request_);
      }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        StartWrite(&response_);
      }
      void OnWriteDone(bool) override { Finish(grpc::Status::OK); }
      void OnDone() override { delete this; }

     private:
      grpc::ByteBuffer request_;
      grpc::ByteBuffer response_;
    };
    return new Reactor();
  }
};

struct Fixture {
  EmptyAnswers service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<sv::server::RestGateway> gateway;
};

Fixture& Get() {
  static Fixture* fixture = [] {
    auto* f = new Fixture();
    grpc::ServerBuilder builder;
    builder.RegisterCallbackGenericService(&f->service);
    f->server = builder.BuildAndStart();
    Check(f->server != nullptr);
    auto gateway = sv::server::RestGateway::Create(
        sv::server::RestRoutes(), f->server->InProcessChannel(grpc::ChannelArguments()));
    Check(gateway.ok());  // The route table fits the descriptors.
    f->gateway = std::move(*gateway);
    return f;
  }();
  return *fixture;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* kMethods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"};
  if (size < 1) return 0;
  Fixture& f = Get();
  sv::server::RestRequest request;
  request.method = kMethods[data[0] % 6];
  ++data;
  --size;
  const std::string target = sv::fuzz::TakeField(data, size, '\n');
  request.authorization = sv::fuzz::TakeField(data, size, '\n');
  request.body.assign(reinterpret_cast<const char*>(data), size);
  const size_t question = target.find('?');
  request.path = httplib::detail::decode_url(target.substr(0, question), false);
  if (question != std::string::npos) {
    httplib::Params params;
    httplib::detail::parse_query_text(target.substr(question + 1), params);
    request.query.insert(params.begin(), params.end());
  }
  request.client_address = "127.0.0.1";
  sv::server::RestResponse response = f.gateway->Handle(request);
  Check(response.status >= 200 && response.status <= 599);
  Check(nlohmann::json::accept(response.body));
  if (response.status != 200) {
    auto body = nlohmann::json::parse(response.body);
    Check(body.is_object() && body.contains("code") && body.contains("reason"));
  }
  return 0;
}
