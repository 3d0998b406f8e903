#include "api/metrics_interceptor.h"

#include <chrono>
#include <string>

#include <google/protobuf/message.h>

#include "api/errors.h"
#include "common/log_context.h"
#include "metrics/metrics.h"

namespace sv::api {
namespace {

using grpc::experimental::InterceptionHookPoints;

// The request's `request_id` field, where its message has one.
std::string RequestIdOf(void* message) {
  if (message == nullptr) return "";
  const auto* m = static_cast<const google::protobuf::Message*>(message);
  const google::protobuf::FieldDescriptor* field =
      m->GetDescriptor()->FindFieldByName("request_id");
  if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING ||
      field->is_repeated()) {
    return "";
  }
  return m->GetReflection()->GetString(*m, field).substr(0, 128);
}

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit MetricsInterceptor(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : "unknown"),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // Only sv's own services: their messages are generated protobuf
    // classes (the health service's are raw byte buffers).
    if (method_.rfind("/sv.v1.", 0) == 0 &&
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      // The handler runs on this thread next (synchronous services): log
      // lines it writes carry the method and the request_id (the tenant is
      // added once authentication knows it).
      logging::Context context;
      context.method = method_;
      context.request_id = RequestIdOf(methods->GetRecvMessage());
      logging::CurrentContext() = std::move(context);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      logging::CurrentContext() = {};
      const grpc::Status status = methods->GetSendStatus();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      auto& registry = metrics::Registry::Default();
      registry.IncrementCounter("sv_grpc_requests_total",
                                "gRPC calls served, by method and status code.",
                                {{"method", method_},
                                 {"code", GrpcCodeName(status.error_code())}});
      registry.ObserveHistogram("sv_grpc_request_duration_seconds",
                                "Time from a call's arrival to its status, by method.",
                                {{"method", method_}}, seconds,
                                metrics::LatencyBoundsSeconds());
    }
    methods->Proceed();
  }

 private:
  std::string method_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

grpc::experimental::Interceptor* MetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new MetricsInterceptor(info);
}

}  // namespace sv::api
