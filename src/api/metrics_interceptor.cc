#include "api/metrics_interceptor.h"

#include <chrono>
#include <string>

#include "api/errors.h"
#include "metrics/metrics.h"

namespace sv::api {
namespace {

using grpc::experimental::InterceptionHookPoints;

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit MetricsInterceptor(grpc::experimental::ServerRpcInfo* info)
      : method_(info->method() != nullptr ? info->method() : "unknown"),
        start_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
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
