// svctl keys, svctl users, svctl audit and svctl spend-cap (docs/security.md).
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "google/protobuf/util/time_util.h"
#include "sv/v1/security.grpc.pb.h"

namespace sv::cli {
namespace {

using google::protobuf::util::TimeUtil;

bool ParseRole(const std::string& text, v1::TenantRole* role) {
  for (auto r : {v1::TENANT_ROLE_VIEWER, v1::TENANT_ROLE_BILLING, v1::TENANT_ROLE_MEMBER,
                 v1::TENANT_ROLE_OWNER}) {
    if (text == RoleText(r)) {
      *role = r;
      return true;
    }
  }
  return false;
}

// Connects and runs one unary call of `Stub`; prints JSON or `table`.
template <typename Stub, typename Request, typename Response, typename Call, typename Table>
int Run(Session& s, const Request& request, Call call, Table table) {
  std::string error;
  if (!s.Connect(&error)) return Fail(error);
  Stub stub(s.channel);
  Response response;
  grpc::Status status = (stub.*call)(s.Context().get(), request, &response);
  if (!status.ok()) return FailRpc(status, s);
  if (s.format() == Format::kJson) {
    PrintJson(response, std::cout);
  } else {
    table(response);
  }
  return kExitOk;
}

void PrintKeys(const google::protobuf::RepeatedPtrField<v1::ApiKey>& keys) {
  std::vector<std::vector<std::string>> rows{
      {"ID", "USER", "NAME", "SCOPE", "CREATED", "EXPIRES", "REVOKED"}};
  for (const auto& k : keys) {
    rows.push_back({k.id(), k.user_email(), k.name().empty() ? "-" : k.name(),
                    ScopeText(k.scope()),
                    FormatTime(k.create_time()), FormatTime(k.expire_time()),
                    FormatTime(k.revoke_time())});
  }
  PrintTable(rows, std::cout);
}

void PrintNewKey(const v1::CreateApiKeyResponse& r) {
  std::cout << "key id:  " << r.key().id() << "\n"
            << "secret:  " << r.secret() << "\n"
            << "This secret is shown only now; store it safely.\n";
}

void AddKeyCommands(CLI::App& app, Action* action) {
  auto* keys = app.add_subcommand("keys", "Your API keys: create, list, revoke, rotate");
  keys->require_subcommand(1);

  auto create = std::make_shared<v1::CreateApiKeyRequest>();
  auto read_only = std::make_shared<bool>(false);
  auto ttl_days = std::make_shared<int>(0);
  auto* c = keys->add_subcommand("create", "Create a key (the secret is shown once)");
  c->add_option("--name", *create->mutable_name(), "A label for people");
  c->add_flag("--read-only", *read_only, "Only read calls");
  c->add_option("--ttl-days", *ttl_days, "Expires after this many days (0: never)")
      ->check(CLI::Range(0, 730));
  c->callback([=] {
    *action = [=](Session& s) {
      v1::CreateApiKeyRequest request = *create;
      request.set_scope(*read_only ? v1::KEY_SCOPE_READ_ONLY : v1::KEY_SCOPE_FULL);
      request.set_ttl_seconds(int64_t{*ttl_days} * 86400);
      return Run<v1::ApiKeyService::Stub, v1::CreateApiKeyRequest, v1::CreateApiKeyResponse>(
          s, request, &v1::ApiKeyService::Stub::CreateApiKey, PrintNewKey);
    };
  });

  auto all = std::make_shared<bool>(false);
  auto* l = keys->add_subcommand("list", "List your keys (--all: every user's; owners)");
  l->add_flag("--all", *all, "Every key of the tenant");
  l->callback([=] {
    *action = [=](Session& s) {
      v1::ListApiKeysRequest request;
      request.set_all_users(*all);
      return Run<v1::ApiKeyService::Stub, v1::ListApiKeysRequest, v1::ListApiKeysResponse>(
          s, request, &v1::ApiKeyService::Stub::ListApiKeys,
          [](const v1::ListApiKeysResponse& r) { PrintKeys(r.keys()); });
    };
  });

  auto revoke_id = std::make_shared<std::string>();
  auto* r = keys->add_subcommand("revoke", "Revoke a key at once");
  r->add_option("id", *revoke_id, "Key id (key-...)")->required();
  r->callback([=] {
    *action = [=](Session& s) {
      v1::RevokeApiKeyRequest request;
      request.set_id(*revoke_id);
      return Run<v1::ApiKeyService::Stub, v1::RevokeApiKeyRequest, v1::ApiKey>(
          s, request, &v1::ApiKeyService::Stub::RevokeApiKey,
          [](const v1::ApiKey& k) { std::cout << "revoked " << k.id() << "\n"; });
    };
  });

  auto rotate_id = std::make_shared<std::string>();
  auto overlap = std::make_shared<int64_t>(0);
  auto* o = keys->add_subcommand("rotate", "Replace a key with a new secret");
  o->add_option("id", *rotate_id, "Key id (key-...)")->required();
  o->add_option("--overlap-seconds", *overlap,
                "The old key keeps working this long (0: revoked at once)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400}));
  o->callback([=] {
    *action = [=](Session& s) {
      v1::RotateApiKeyRequest request;
      request.set_id(*rotate_id);
      request.set_overlap_seconds(*overlap);
      return Run<v1::ApiKeyService::Stub, v1::RotateApiKeyRequest, v1::CreateApiKeyResponse>(
          s, request, &v1::ApiKeyService::Stub::RotateApiKey, PrintNewKey);
    };
  });
}

void PrintUsers(const v1::ListUsersResponse& r) {
  std::vector<std::vector<std::string>> rows{{"ID", "EMAIL", "ROLE", "ADDED"}};
  for (const auto& u : r.users()) {
    rows.push_back({u.id(), u.email(), RoleText(u.role()), FormatTime(u.create_time())});
  }
  PrintTable(rows, std::cout);
}

void AddUserCommands(CLI::App& app, Action* action) {
  auto* users = app.add_subcommand("users", "Members of your organisation (owners manage)");
  users->require_subcommand(1);
  users->add_subcommand("list", "List the members")->callback([=] {
    *action = [=](Session& s) {
      return Run<v1::UserService::Stub, v1::ListUsersRequest, v1::ListUsersResponse>(
          s, v1::ListUsersRequest(), &v1::UserService::Stub::ListUsers, PrintUsers);
    };
  });

  auto email = std::make_shared<std::string>();
  auto add_role = std::make_shared<std::string>("member");
  auto* a = users->add_subcommand("add", "Add a member; prints its first API key once");
  a->add_option("email", *email, "E-mail")->required();
  a->add_option("--role", *add_role, "owner, member, billing or viewer")
      ->check(CLI::IsMember({"owner", "member", "billing", "viewer"}))
      ->capture_default_str();
  a->callback([=] {
    *action = [=](Session& s) {
      v1::AddUserRequest request;
      request.set_email(*email);
      v1::TenantRole role;
      ParseRole(*add_role, &role);
      request.set_role(role);
      return Run<v1::UserService::Stub, v1::AddUserRequest, v1::AddUserResponse>(
          s, request, &v1::UserService::Stub::AddUser, [](const v1::AddUserResponse& r) {
            std::cout << "added " << r.user().email() << " (" << r.user().id() << ") as "
                      << RoleText(r.user().role()) << "\n";
            PrintNewKey(r.first_key());
          });
    };
  });

  auto user_id = std::make_shared<std::string>();
  auto new_role = std::make_shared<std::string>();
  auto* sr = users->add_subcommand("set-role", "Change a member's role");
  sr->add_option("user", *user_id, "User id (usr-...)")->required();
  sr->add_option("role", *new_role, "owner, member, billing or viewer")
      ->required()
      ->check(CLI::IsMember({"owner", "member", "billing", "viewer"}));
  sr->callback([=] {
    *action = [=](Session& s) {
      v1::SetUserRoleRequest request;
      request.set_user_id(*user_id);
      v1::TenantRole role;
      ParseRole(*new_role, &role);
      request.set_role(role);
      return Run<v1::UserService::Stub, v1::SetUserRoleRequest, v1::User>(
          s, request, &v1::UserService::Stub::SetUserRole, [](const v1::User& u) {
            std::cout << u.email() << " is now " << RoleText(u.role()) << "\n";
          });
    };
  });

  auto remove_id = std::make_shared<std::string>();
  auto* rm = users->add_subcommand("remove", "Remove a member and revoke its keys");
  rm->add_option("user", *remove_id, "User id (usr-...)")->required();
  rm->callback([=] {
    *action = [=](Session& s) {
      v1::RemoveUserRequest request;
      request.set_user_id(*remove_id);
      return Run<v1::UserService::Stub, v1::RemoveUserRequest, v1::RemoveUserResponse>(
          s, request, &v1::UserService::Stub::RemoveUser,
          [=](const v1::RemoveUserResponse&) { std::cout << "removed " << *remove_id << "\n"; });
    };
  });
}

void AddAuditCommand(CLI::App& app, Action* action) {
  auto request = std::make_shared<v1::ListAuditEntriesRequest>();
  auto admin = std::make_shared<bool>(false);
  auto* audit = app.add_subcommand(
      "audit", "Mutating calls of your tenant, newest first (owners; --admin: every tenant)");
  audit->add_option("--tenant", *request->mutable_tenant_id(), "Tenant id or name (admin only)");
  auto limit = std::make_shared<int>(50);
  audit->add_option("--limit", *limit, "Entries to show (1..1000)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  audit->add_option("--page-token", *request->mutable_page_token(), "Continue a listing");
  audit->add_flag("--admin", *admin, "Use the admin key (every tenant)");
  audit->callback([=] {
    *action = [=](Session& s) {
      s.flags.admin = *admin;
      v1::ListAuditEntriesRequest r = *request;
      r.set_page_size(*limit);
      if (*admin && !r.tenant_id().empty()) {
        std::string error;
        if (!s.Connect(&error)) return Fail(error);
        if (int rc = ResolveTenant(s, request->tenant_id(), r.mutable_tenant_id());
            rc != kExitOk) {
          return rc;
        }
      }
      return Run<v1::AuditService::Stub, v1::ListAuditEntriesRequest,
                 v1::ListAuditEntriesResponse>(
          s, r, &v1::AuditService::Stub::ListAuditEntries,
          [](const v1::ListAuditEntriesResponse& resp) {
            std::vector<std::vector<std::string>> rows{
                {"TIME", "TENANT", "USER", "METHOD", "REQUEST_ID", "RESULT"}};
            for (const auto& e : resp.entries()) {
              std::string method = e.method().substr(e.method().rfind('/') + 1);
              std::string result = e.code();
              if (!e.reason().empty()) result += " (" + e.reason() + ")";
              rows.push_back({FormatTime(e.time()), e.tenant_id(), e.user_email(), method,
                              e.request_id().empty() ? "-" : e.request_id(), result});
            }
            PrintTable(rows, std::cout);
            if (!resp.next_page_token().empty()) {
              std::cout << "more: --page-token " << resp.next_page_token() << "\n";
            }
          });
    };
  });
}

void PrintCap(const v1::SpendCap& c) {
  std::cout << "tenant:       " << c.tenant_id() << "\n"
            << "monthly cap:  "
            << (c.enabled() ? Yuan(c.monthly_cap_micros()) : "none") << "\n"
            << "spent (month): " << Yuan(c.month_spent_micros()) << "\n";
}

void AddSpendCapCommands(CLI::App& app, Action* action) {
  auto* cap = app.add_subcommand("spend-cap", "The tenant's optional monthly spend cap");
  cap->require_subcommand(1);
  cap->add_subcommand("get", "Show the cap and this month's spend")->callback([=] {
    *action = [=](Session& s) {
      return Run<v1::BudgetService::Stub, v1::GetSpendCapRequest, v1::SpendCap>(
          s, v1::GetSpendCapRequest(), &v1::BudgetService::Stub::GetSpendCap, PrintCap);
    };
  });
  auto micros = std::make_shared<int64_t>(0);
  auto* set = cap->add_subcommand("set", "Set the cap (owners); creates stop at it");
  set->add_option("micros", *micros, "Monthly cap in micro-yuan (1 CNY = 1,000,000)")
      ->required()
      ->check(CLI::Range(int64_t{0}, int64_t{1'000'000'000'000'000}));
  set->callback([=] {
    *action = [=](Session& s) {
      v1::SetSpendCapRequest request;
      request.mutable_cap()->set_enabled(true);
      request.mutable_cap()->set_monthly_cap_micros(*micros);
      return Run<v1::BudgetService::Stub, v1::SetSpendCapRequest, v1::SpendCap>(
          s, request, &v1::BudgetService::Stub::SetSpendCap, PrintCap);
    };
  });
  cap->add_subcommand("clear", "Remove the cap (owners)")->callback([=] {
    *action = [=](Session& s) {
      v1::SetSpendCapRequest request;
      request.mutable_cap()->set_enabled(false);
      return Run<v1::BudgetService::Stub, v1::SetSpendCapRequest, v1::SpendCap>(
          s, request, &v1::BudgetService::Stub::SetSpendCap, PrintCap);
    };
  });
}

}  // namespace

void AddSecurityCommands(CLI::App& app, Action* action) {
  AddKeyCommands(app, action);
  AddUserCommands(app, action);
  AddAuditCommand(app, action);
  AddSpendCapCommands(app, action);
}

}  // namespace sv::cli
