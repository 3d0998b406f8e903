// svctl whoami and svctl admin ...
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <type_traits>

#include "CLI/CLI.hpp"
#include "cli/commands.h"
#include "sv/v1/account.grpc.pb.h"
#include "sv/v1/admin.grpc.pb.h"

namespace sv::cli {

void AddAccountCommands(CLI::App& app, Action* action) {
  auto* whoami = app.add_subcommand("whoami", "Show the caller's user and tenant");
  whoami->callback([=] {
    *action = [](Session& s) {
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::AccountService::Stub stub(s.channel);
      v1::Account account;
      grpc::Status status =
          stub.GetCurrentAccount(s.Context().get(), v1::GetCurrentAccountRequest(), &account);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(account, std::cout);
      } else {
        PrintAccount(account, std::cout);
      }
      return kExitOk;
    };
  });
}

namespace {

// Runs one AdminService call with the admin key: `fill` fills the request
// (or fails with an exit code), and the answer is printed as JSON or with
// `print`.
template <typename Request, typename Response, typename Print>
Action AdminServiceCall(std::function<int(Session&, Request*)> fill,
                        grpc::Status (v1::AdminService::Stub::*rpc)(grpc::ClientContext*,
                                                                    const Request&, Response*),
                        Print print) {
  return [=](Session& s) {
    s.flags.admin = true;
    std::string error;
    if (!s.Connect(&error)) return Fail(error);
    Request request;
    if (int rc = fill(s, &request); rc != kExitOk) return rc;
    v1::AdminService::Stub stub(s.channel);
    Response response;
    grpc::Status status = (stub.*rpc)(s.Context().get(), request, &response);
    if (!status.ok()) return FailRpc(status, s);
    if (s.format() == Format::kJson) {
      PrintJson(response, std::cout);
    } else {
      print(response);
    }
    return kExitOk;
  };
}

// svctl admin tenant|suspend|resume: resolves the tenant and fills
// `Request` (its tenant_id, and `reason` when given).
template <typename Request, typename Response, typename Print>
Action TenantCall(std::shared_ptr<std::string> tenant, std::shared_ptr<std::string> reason,
                  grpc::Status (v1::AdminService::Stub::*rpc)(grpc::ClientContext*,
                                                              const Request&, Response*),
                  Print print) {
  return AdminServiceCall<Request>(
      [=](Session& s, Request* request) {
        if constexpr (!std::is_same_v<Request, v1::GetTenantRequest>) {
          request->set_reason(*reason);
        }
        return ResolveTenant(s, *tenant, request->mutable_tenant_id());
      },
      rpc, print);
}

// "tenant acme (ten-...) <what>".
void SayTenant(const v1::Tenant& t, const std::string& what) {
  std::cout << "tenant " << t.name() << " (" << t.id() << ") " << what << "\n";
}

void AddTenantStandingCommands(CLI::App& admin, Action* action) {
  auto tenant = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto* show = admin.add_subcommand("tenant", "Show a tenant and its suspensions");
  show->add_option("tenant", *tenant, "Tenant id or name")->required();
  show->callback([=] {
    *action = TenantCall(tenant, reason, &v1::AdminService::Stub::GetTenant,
                         [](const v1::TenantStanding& r) { PrintTenantStanding(r, std::cout); });
  });
  auto* suspend = admin.add_subcommand(
      "suspend", "Suspend a tenant: stop its instances, refuse its creates and starts");
  auto* resume = admin.add_subcommand(
      "resume", "Lift a tenant's suspension (its stopped instances stay stopped)");
  for (auto* c : {suspend, resume}) {
    c->add_option("tenant", *tenant, "Tenant id or name")->required();
    c->add_option("--reason", *reason, "Why; the tenant is shown it")->required();
  }
  suspend->callback([=] {
    *action = TenantCall(tenant, reason, &v1::AdminService::Stub::SuspendTenant,
                         [](const v1::SuspendTenantResponse& r) {
                           SayTenant(r.tenant(),
                                     (r.newly_suspended() ? "suspended; "
                                                          : "was already suspended; ") +
                                         std::to_string(r.instances_stopped()) +
                                         " instance(s) stopped");
                         });
  });
  resume->callback([=] {
    *action = TenantCall(tenant, reason, &v1::AdminService::Stub::ResumeTenant,
                         [](const v1::ResumeTenantResponse& r) {
                           SayTenant(r.tenant(), r.was_suspended() ? "resumed"
                                                                   : "was not suspended");
                         });
  });
}

// svctl admin operators list|add|remove.
void AddOperatorCommands(CLI::App& admin, Action* action) {
  auto* operators = admin.add_subcommand("operators", "The platform's operators");
  operators->require_subcommand(1);
  auto* list = operators->add_subcommand("list", "List the operators");
  list->callback([=] {
    *action = AdminServiceCall<v1::ListOperatorsRequest>(
        [](Session&, v1::ListOperatorsRequest*) { return kExitOk; },
        &v1::AdminService::Stub::ListOperators,
        [](const v1::ListOperatorsResponse& r) {
          std::vector<std::vector<std::string>> rows = {
              {"USER ID", "EMAIL", "ACCESS", "ADDED", "ACTIVE KEYS", "NOTE"}};
          for (const auto& o : r.operators()) {
            rows.push_back({o.user_id(), o.email(), o.read_only() ? "read-only" : "full",
                            FormatTime(o.create_time()), std::to_string(o.active_key_count()),
                            o.bootstrap() ? "svd's --admin-key-file" : ""});
          }
          PrintTable(rows, std::cout);
        });
  });
  auto email = std::make_shared<std::string>();
  auto* add = operators->add_subcommand(
      "add", "Make a new operator account and print its first API key (shown once)");
  add->add_option("email", *email, "The operator's e-mail address")->required();
  auto read_only = std::make_shared<bool>(false);
  add->add_flag("--read-only", *read_only,
                "Support or audit staff: reads what operators read, changes nothing but its "
                "own API keys");
  add->callback([=] {
    *action = AdminServiceCall<v1::AddOperatorRequest>(
        [=](Session&, v1::AddOperatorRequest* r) {
          r->set_email(*email);
          r->set_read_only(*read_only);
          return kExitOk;
        },
        &v1::AdminService::Stub::AddOperator, [](const v1::AddOperatorResponse& r) {
          std::cout << (r.operator_user().read_only() ? "read-only operator " : "operator ")
                    << r.operator_user().email() << " ("
                    << r.operator_user().user_id() << ") added; its API key, shown once:\n"
                    << r.api_key() << "\n";
        });
  });
  auto user_id = std::make_shared<std::string>();
  auto reason = std::make_shared<std::string>();
  auto* remove = operators->add_subcommand(
      "remove", "Take an operator's role away and revoke its keys at once");
  remove->add_option("user_id", *user_id, "The operator's user id (usr-...)")->required();
  remove->add_option("--reason", *reason, "Why; kept with the change")->required();
  remove->callback([=] {
    *action = AdminServiceCall<v1::RemoveOperatorRequest>(
        [=](Session&, v1::RemoveOperatorRequest* r) {
          r->set_user_id(*user_id);
          r->set_reason(*reason);
          return kExitOk;
        },
        &v1::AdminService::Stub::RemoveOperator, [=](const v1::RemoveOperatorResponse& r) {
          std::cout << "operator " << *user_id << " removed; " << r.keys_revoked()
                    << " key(s) revoked\n";
        });
  });
}

}  // namespace

void AddAdminCommands(CLI::App& app, Action* action) {
  auto* admin = app.add_subcommand("admin", "Operator commands (they use the admin key)");
  admin->require_subcommand(1);
  auto name = std::make_shared<std::string>();
  auto email = std::make_shared<std::string>();
  auto* create_tenant = admin->add_subcommand("create-tenant", "Create a tenant and its owner");
  create_tenant->add_option("name", *name, "Tenant name")->required();
  create_tenant->add_option("--owner-email", *email, "Owner's e-mail")->required();
  create_tenant->callback([=] {
    *action = [=](Session& s) {
      s.flags.admin = true;
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::AdminService::Stub stub(s.channel);
      v1::CreateTenantRequest request;
      request.set_name(*name);
      request.set_owner_email(*email);
      v1::CreateTenantResponse response;
      grpc::Status status = stub.CreateTenant(s.Context().get(), request, &response);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(response, std::cout);
      return kExitOk;
    };
  });
  AddTenantStandingCommands(*admin, action);
  AddOperatorCommands(*admin, action);
}

}  // namespace sv::cli
