// svctl keys, users, audit, spend-cap and ssh-keys (docs/security.md), and
// webhook (docs/notifications.md).
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "google/protobuf/util/time_util.h"
#include "sv/v1/security.grpc.pb.h"
#include "sv/v1/webhook.grpc.pb.h"

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

void PrintSshKeys(const v1::ListSshKeysResponse& r) {
  std::vector<std::vector<std::string>> rows{{"ID", "NAME", "FINGERPRINT", "ADDED"}};
  for (const auto& k : r.keys()) {
    rows.push_back({k.id(), k.name(), k.fingerprint(), FormatTime(k.create_time())});
  }
  PrintTable(rows, std::cout);
}

// The public key to add: --key, else --file, else the first of the usual
// ~/.ssh/*.pub files that exists.
bool ReadPublicKey(const std::string& key, const std::string& file, std::string* out,
                   std::string* error) {
  if (!key.empty()) {
    *out = key;
    return true;
  }
  std::vector<std::string> candidates;
  if (!file.empty()) {
    candidates.push_back(file);
  } else if (const char* home = std::getenv("HOME"); home != nullptr) {
    for (const char* name : {"id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub"}) {
      candidates.push_back(std::string(home) + "/.ssh/" + name);
    }
  }
  for (const auto& path : candidates) {
    std::ifstream in(path);
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    *out = text.str();
    // A private key never leaves this machine.
    if (out->find("PRIVATE KEY") != std::string::npos ||
        out->rfind("PuTTY-User-Key-File", 0) == 0) {
      out->clear();
      *error = path + " is a private key; give the .pub file";
      return false;
    }
    return true;
  }
  *error = file.empty() ? "no ~/.ssh/id_ed25519.pub, id_ecdsa.pub or id_rsa.pub; give --file "
                          "or --key (ssh-keygen -t ed25519 makes one)"
                        : "cannot read " + file;
  return false;
}

void AddSshKeyCommands(CLI::App& app, Action* action) {
  auto* keys = app.add_subcommand(
      "ssh-keys", "SSH public keys: every running instance of the tenant accepts them for root");
  keys->require_subcommand(1);

  auto name = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto key = std::make_shared<std::string>();
  auto* a = keys->add_subcommand("add", "Add a public key (default: ~/.ssh/id_ed25519.pub)");
  a->add_option("--name", *name, "Name (default: from the key's comment)");
  a->add_option("--file", *file, "A .pub file");
  a->add_option("--key", *key, "The key itself: \"ssh-ed25519 AAAA... comment\"");
  a->callback([=] {
    *action = [=](Session& s) {
      v1::AddSshKeyRequest request;
      request.set_name(*name);
      std::string error;
      if (!ReadPublicKey(*key, *file, request.mutable_public_key(), &error)) return Fail(error);
      return Run<v1::SshKeyService::Stub, v1::AddSshKeyRequest, v1::SshKey>(
          s, request, &v1::SshKeyService::Stub::AddSshKey, [](const v1::SshKey& k) {
            std::cout << "added " << k.name() << " (" << k.id() << ", " << k.fingerprint()
                      << ")\n";
          });
    };
  });

  auto* l = keys->add_subcommand("list", "List the tenant's SSH keys");
  l->callback([=] {
    *action = [=](Session& s) {
      return Run<v1::SshKeyService::Stub, v1::ListSshKeysRequest, v1::ListSshKeysResponse>(
          s, v1::ListSshKeysRequest(), &v1::SshKeyService::Stub::ListSshKeys, PrintSshKeys);
    };
  });

  auto target = std::make_shared<std::string>();
  auto* d = keys->add_subcommand(
      "delete", "Delete a key: running instances stop accepting it within seconds");
  d->add_option("key", *target, "The key's name or id")->required();
  d->callback([=] {
    *action = [=](Session& s) {
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::SshKeyService::Stub stub(s.channel);
      v1::ListSshKeysResponse listed;
      grpc::Status status =
          stub.ListSshKeys(s.Context().get(), v1::ListSshKeysRequest(), &listed);
      if (!status.ok()) return FailRpc(status, s);
      v1::DeleteSshKeyRequest request;
      request.set_id(*target);  // Unknown names go as ids: svd says it is not found.
      for (const auto& k : listed.keys()) {
        if (k.id() == *target || k.name() == *target) request.set_id(k.id());
      }
      return Run<v1::SshKeyService::Stub, v1::DeleteSshKeyRequest, v1::DeleteSshKeyResponse>(
          s, request, &v1::SshKeyService::Stub::DeleteSshKey,
          [=](const v1::DeleteSshKeyResponse&) { std::cout << "deleted " << *target << "\n"; });
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

void PrintWebhook(const v1::Webhook& w) {
  std::vector<std::vector<std::string>> rows = {{"url:", w.url()},
                                                {"set:", FormatTime(w.create_time()) + " by " +
                                                             w.created_by()}};
  if (!w.secret().empty()) {
    rows.push_back({"secret:", w.secret() + "  (shown once: verify X-Sv-Signature with it)"});
  }
  rows.push_back({"pending:", std::to_string(w.pending_count()) + " notice(s)"});
  rows.push_back({"last delivery:", FormatTime(w.last_delivery_time())});
  if (w.disabled()) {
    rows.push_back({"OFF since:", FormatTime(w.disable_time()) + ", " + w.disabled_reason() +
                                      " (svctl webhook set URL turns it back on)"});
  } else if (w.failed_attempts() > 0) {
    rows.push_back({"failing:", std::to_string(w.failed_attempts()) + " tries since " +
                                    FormatTime(w.failing_since_time()) + ", last: " +
                                    w.last_error() + "; next " +
                                    FormatTime(w.next_attempt_time())});
  }
  PrintTable(rows, std::cout);
}

void AddWebhookCommands(CLI::App& app, Action* action) {
  auto* hook = app.add_subcommand(
      "webhook", "Where svd POSTs the tenant's notices (low credit, stops, refunds...)");
  hook->require_subcommand(1);
  auto url = std::make_shared<std::string>();
  auto* set = hook->add_subcommand("set", "Set or replace the webhook (owners); prints its secret");
  set->add_option("url", *url, "http:// or https:// URL of a public host")->required();
  auto skip_backlog = std::make_shared<bool>(false);
  set->add_flag("--skip-backlog", *skip_backlog,
                "Replacing one: skip the notices not yet delivered, send only new ones");
  set->callback([=] {
    *action = [=](Session& s) {
      v1::SetWebhookRequest request;
      request.set_url(*url);
      request.set_skip_backlog(*skip_backlog);
      return Run<v1::WebhookService::Stub, v1::SetWebhookRequest, v1::Webhook>(
          s, request, &v1::WebhookService::Stub::SetWebhook, PrintWebhook);
    };
  });
  hook->add_subcommand("get", "Show the webhook and how its deliveries go")->callback([=] {
    *action = [=](Session& s) {
      return Run<v1::WebhookService::Stub, v1::GetWebhookRequest, v1::Webhook>(
          s, v1::GetWebhookRequest(), &v1::WebhookService::Stub::GetWebhook, PrintWebhook);
    };
  });
  hook->add_subcommand("test", "Send a signed ping and show the answer (owners)")
      ->callback([=] {
        *action = [=](Session& s) {
          return Run<v1::WebhookService::Stub, v1::TestWebhookRequest, v1::TestWebhookResponse>(
              s, v1::TestWebhookRequest(), &v1::WebhookService::Stub::TestWebhook,
              [](const v1::TestWebhookResponse& r) {
                std::cout << (r.error().empty() ? "delivered: HTTP " +
                                                      std::to_string(r.http_status())
                                                : "failed: " + r.error())
                          << "\n";
              });
        };
      });
  hook->add_subcommand("delete", "Remove the webhook (owners)")->callback([=] {
    *action = [=](Session& s) {
      return Run<v1::WebhookService::Stub, v1::DeleteWebhookRequest, v1::DeleteWebhookResponse>(
          s, v1::DeleteWebhookRequest(), &v1::WebhookService::Stub::DeleteWebhook,
          [](const v1::DeleteWebhookResponse& r) {
            std::cout << (r.deleted() ? "webhook deleted" : "there was no webhook") << "\n";
          });
    };
  });
}

}  // namespace

void AddSecurityCommands(CLI::App& app, Action* action) {
  AddKeyCommands(app, action);
  AddUserCommands(app, action);
  AddAuditCommand(app, action);
  AddSpendCapCommands(app, action);
  AddSshKeyCommands(app, action);
  AddWebhookCommands(app, action);
}

}  // namespace sv::cli
