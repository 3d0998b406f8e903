#include "store/ssh_key_store.h"

#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace sv::store {
namespace {

const std::string kColumns =
    absl::StrCat("id, tenant_id, name, public_key, fingerprint, created_by, ",
                 MicrosOf("created_at"));

SshKeyRow FromRow(const pqxx::row& row) {
  return SshKeyRow{row[0].as<std::string>(), row[1].as<std::string>(), row[2].as<std::string>(),
                   row[3].as<std::string>(), row[4].as<std::string>(), row[5].as<std::string>(),
                   TimeFromMicros(row[6].as<int64_t>())};
}

}  // namespace

absl::StatusOr<SshKeyRow> SshKeyStore::Add(const SshKeyRow& key) {
  SshKeyRow result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // The tenant's row serializes its adds, so the count below holds.
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE", key.tenant_id)
            .empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND", "tenant not found");
    }
    auto same = txn.exec_params(
        absl::StrCat("SELECT ", kColumns, " FROM ssh_keys WHERE tenant_id = $1 "
                     "AND (fingerprint = $2 OR name = $3) ORDER BY fingerprint = $2 DESC"),
        key.tenant_id, key.fingerprint, key.name);
    if (!same.empty()) {
      SshKeyRow found = FromRow(same[0]);
      if (found.fingerprint == key.fingerprint && found.name == key.name) {
        result = std::move(found);
        return absl::OkStatus();
      }
      if (found.fingerprint == key.fingerprint) {
        return Error(absl::StatusCode::kAlreadyExists, "SSH_KEY_EXISTS",
                     absl::StrCat("the tenant has this key already, as ", found.name, " (",
                                  found.id, ")"));
      }
      return Error(absl::StatusCode::kAlreadyExists, "SSH_KEY_NAME_TAKEN",
                   absl::StrCat("the tenant has another key named ", key.name, " (", found.id,
                                "); pick another name or delete that key"));
    }
    if (txn.exec_params("SELECT count(*) FROM ssh_keys WHERE tenant_id = $1", key.tenant_id)[0][0]
            .as<int64_t>() >= kSshKeysPerTenantMax) {
      return Error(absl::StatusCode::kFailedPrecondition, "TOO_MANY_SSH_KEYS",
                   absl::StrCat("a tenant may hold at most ", kSshKeysPerTenantMax,
                                " SSH keys; delete one first"));
    }
    txn.exec_params(
        "INSERT INTO ssh_keys (id, tenant_id, name, public_key, fingerprint, created_by, "
        "created_at) VALUES ($1, $2, $3, $4, $5, $6, $7::timestamptz)",
        key.id, key.tenant_id, key.name, key.public_key, key.fingerprint, key.created_by,
        SqlTime(key.created_at));
    result = key;
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<std::vector<SshKeyRow>> SshKeyStore::List(const std::string& tenant_id) {
  std::vector<SshKeyRow> keys;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    keys.clear();
    for (const auto& row : txn.exec_params(
             absl::StrCat("SELECT ", kColumns, " FROM ssh_keys WHERE tenant_id = $1 "
                          "ORDER BY created_at, id"),
             tenant_id)) {
      keys.push_back(FromRow(row));
    }
    return absl::OkStatus();
  }));
  return keys;
}

absl::StatusOr<SshKeyRow> SshKeyStore::Delete(const std::string& tenant_id,
                                              const std::string& id) {
  SshKeyRow result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto rows = txn.exec_params(
        absl::StrCat("DELETE FROM ssh_keys WHERE tenant_id = $1 AND id = $2 RETURNING ",
                     kColumns),
        tenant_id, id);
    if (rows.empty()) {
      return Error(absl::StatusCode::kNotFound, "SSH_KEY_NOT_FOUND",
                   absl::StrCat("SSH key ", id.substr(0, 64), " not found"));
    }
    result = FromRow(rows[0]);
    return absl::OkStatus();
  }));
  return result;
}

}  // namespace sv::store
