#ifndef SV_API_METRICS_INTERCEPTOR_H_
#define SV_API_METRICS_INTERCEPTOR_H_

#include <grpcpp/support/server_interceptor.h>

namespace sv::api {

// Counts every RPC by method and status code, and records its latency, in
// the default metrics registry. Installed on the server builder, it covers
// every service without touching their code.
class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace sv::api

#endif  // SV_API_METRICS_INTERCEPTOR_H_
