#ifndef SV_API_SERVICES_H_
#define SV_API_SERVICES_H_

#include <grpcpp/server_builder.h>

#include <memory>
#include <string>

#include "api/auth.h"
#include "api/validation.h"
#include "api/webhooks.h"
#include "common/clock.h"
#include "control/loops.h"
#include "store/store.h"

namespace sv::billing {
class Billing;
}  // namespace sv::billing

namespace sv::api {

struct ApiDependencies {
  store::Store* store = nullptr;
  const Clock* clock = nullptr;
  control::ControlLoops* loops = nullptr;  // Kicked after creates and deletes.
  AuthOptions auth;
  billing::Billing* billing = nullptr;  // Credit gate and the billing services.
  WebhookOptions webhooks;              // What TestWebhook and SetWebhook allow.
  // Where tenants' private images live (docs/marketplace.md, "Whose images").
  std::string app_registry = kDefaultAppRegistry;
};

// Owns the gRPC service implementations of the public API.
class ApiServices {
 public:
  explicit ApiServices(ApiDependencies deps);
  ~ApiServices();
  void RegisterWith(grpc::ServerBuilder& builder);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sv::api

#endif  // SV_API_SERVICES_H_
