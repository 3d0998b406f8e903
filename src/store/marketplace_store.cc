#include "store/marketplace_store.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/ids.h"
#include "common/money.h"
#include "common/status.h"
#include "store/security_store.h"
#include "store/sql_arrays.h"

namespace sv::store {
namespace {

const std::string kLibraryColumns =
    "name, kind, size_bytes, source, description, " + MicrosOf("created_at");

LibraryItemRecord LibraryFromRow(const pqxx::row& r) {
  return {r[0].as<std::string>(), r[1].as<std::string>(), r[2].as<int64_t>(),
          r[3].as<std::string>(), r[4].as<std::string>(), TimeFromMicros(r[5].as<int64_t>())};
}

const std::string kImageColumns =
    "id, publisher_tenant_id, name, version, image, description, ports::text, gpu_count, "
    "price_per_hour_micros, listed, " + MicrosOf("created_at") +
    ", EXISTS (SELECT 1 FROM tenant_suspensions s WHERE s.tenant_id = "
    "marketplace_images.publisher_tenant_id AND s.resumed_at IS NULL)";

ImageRecord ImageFromRow(const pqxx::row& r) {
  ImageRecord i;
  i.id = r[0].as<std::string>();
  i.publisher_tenant_id = r[1].as<std::string>();
  i.name = r[2].as<std::string>();
  i.version = r[3].as<std::string>();
  i.image = r[4].as<std::string>();
  i.description = r[5].as<std::string>();
  std::string ports = r[6].as<std::string>();  // "{7860,8000}"
  for (absl::string_view part :
       absl::StrSplit(ports.substr(1, ports.size() - 2), ',', absl::SkipEmpty())) {
    int port = 0;
    if (absl::SimpleAtoi(part, &port)) i.ports.push_back(port);
  }
  i.gpu_count = r[7].as<int>();
  i.price_per_hour_micros = r[8].as<int64_t>();
  i.listed = r[9].as<bool>();
  i.created_at = TimeFromMicros(r[10].as<int64_t>());
  i.publisher_suspended = r[11].as<bool>();
  return i;
}

absl::Status ImageNotFound(const std::string& ref) {
  return Error(absl::StatusCode::kNotFound, "IMAGE_NOT_FOUND",
               absl::StrCat("no marketplace image '", ref, "'"));
}

// The publisher's payable account, opened on first use.
int64_t PayableAccount(pqxx::work& txn, const std::string& publisher_tenant_id) {
  txn.exec_params(
      "INSERT INTO ledger_accounts (tenant_id, kind, owner) "
      "VALUES (NULL, 'publisher_payable', $1) ON CONFLICT DO NOTHING",
      publisher_tenant_id);
  return txn.exec_params1(
      "SELECT id FROM ledger_accounts WHERE tenant_id IS NULL AND kind = 'publisher_payable' "
      "AND owner = $1",
      publisher_tenant_id)[0].as<int64_t>();
}

}  // namespace

absl::Status InsertInstanceExtras(pqxx::work& txn, const std::string& instance_id,
                                  const InstanceExtras& extras) {
  for (const auto& p : extras.ports) {
    txn.exec_params(
        "INSERT INTO instance_ports (instance_id, container_port, protocol) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING",
        instance_id, p.container_port, p.protocol);
  }
  for (const auto& name : extras.library_mounts) {
    auto item = txn.exec_params(
        "SELECT 1 FROM library_items WHERE name = $1 AND deleted_at IS NULL", name);
    if (item.empty()) {
      return Error(absl::StatusCode::kInvalidArgument, "UNKNOWN_LIBRARY_ITEM",
                   absl::StrCat("'", name, "' is not in the public library; see svctl library "
                                "list"));
    }
    txn.exec_params(
        "INSERT INTO instance_library_mounts (instance_id, name) VALUES ($1, $2) "
        "ON CONFLICT DO NOTHING",
        instance_id, name);
  }
  if (!extras.app_image_id.empty()) {
    auto image = txn.exec_params(
        "SELECT publisher_tenant_id, price_per_hour_micros FROM marketplace_images "
        "WHERE id = $1 AND listed",
        extras.app_image_id);
    if (image.empty()) return ImageNotFound(extras.app_image_id);
    // The API checked the publisher before this transaction; a suspension
    // that committed since is seen here (it update-locks the publisher's
    // row, which this share lock waits for). One that comes later finds
    // the instance launched, as every instance launched before it.
    const std::string publisher = image[0][0].as<std::string>();
    txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR KEY SHARE", publisher);
    if (!txn.exec_params("SELECT 1 FROM tenant_suspensions WHERE tenant_id = $1 "
                         "AND resumed_at IS NULL",
                         publisher)
             .empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "PUBLISHER_SUSPENDED",
                   absl::StrCat("image ", extras.app_image_id,
                                " is not offered while its publisher is suspended"));
    }
    txn.exec_params(
        "INSERT INTO instance_apps (instance_id, image_id, publisher_tenant_id, "
        "price_per_hour_micros) VALUES ($1, $2, $3, $4)",
        instance_id, extras.app_image_id, image[0][0].as<std::string>(),
        image[0][1].as<int64_t>());
  }
  return absl::OkStatus();
}

// ---- Library ---------------------------------------------------------------

absl::StatusOr<LibraryItemRecord> MarketplaceStore::CreateLibraryItem(
    const LibraryItemRecord& item, absl::Time now) {
  LibraryItemRecord result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto existing = txn.exec_params(
        "SELECT " + kLibraryColumns + ", deleted_at IS NOT NULL FROM library_items "
        "WHERE name = $1 FOR UPDATE",
        item.name);
    if (!existing.empty()) {
      LibraryItemRecord e = LibraryFromRow(existing[0]);
      const bool same = e.kind == item.kind && e.size_bytes == item.size_bytes &&
                        e.source == item.source && e.description == item.description;
      if (existing[0][6].as<bool>()) {
        // A removed name may be published again, with new content.
        txn.exec_params(
            "UPDATE library_items SET kind = $2, size_bytes = $3, source = $4, "
            "description = $5, created_at = $6::timestamptz, deleted_at = NULL WHERE name = $1",
            item.name, item.kind, item.size_bytes, item.source, item.description,
            SqlTime(now));
      } else if (!same) {
        return Error(absl::StatusCode::kAlreadyExists, "LIBRARY_ITEM_EXISTS",
                     absl::StrCat("the library already has '", item.name,
                                  "' with other content"));
      }
    } else {
      txn.exec_params(
          "INSERT INTO library_items (name, kind, size_bytes, source, description, created_at) "
          "VALUES ($1, $2, $3, $4, $5, $6::timestamptz)",
          item.name, item.kind, item.size_bytes, item.source, item.description, SqlTime(now));
    }
    result = LibraryFromRow(txn.exec_params1(
        "SELECT " + kLibraryColumns + " FROM library_items WHERE name = $1", item.name));
    return absl::OkStatus();
  }));
  return result;
}

absl::Status MarketplaceStore::DeleteLibraryItem(const std::string& name, absl::Time now) {
  return db_.Transact([&](pqxx::work& txn) -> absl::Status {
    auto done = txn.exec_params(
        "UPDATE library_items SET deleted_at = coalesce(deleted_at, $2::timestamptz) "
        "WHERE name = $1 RETURNING name",
        name, SqlTime(now));
    if (done.empty()) {
      return Error(absl::StatusCode::kNotFound, "LIBRARY_ITEM_NOT_FOUND",
                   absl::StrCat("'", name, "' is not in the public library"));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::vector<LibraryItemRecord>> MarketplaceStore::ListLibraryItems(
    const std::string& after_name, int limit) {
  std::vector<LibraryItemRecord> list;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    list.clear();
    for (const auto& r : txn.exec_params("SELECT " + kLibraryColumns +
                                             " FROM library_items WHERE deleted_at IS NULL "
                                             "AND name > $1 ORDER BY name LIMIT $2",
                                         after_name, limit)) {
      list.push_back(LibraryFromRow(r));
    }
    return absl::OkStatus();
  }));
  return list;
}

absl::StatusOr<LibraryItemRecord> MarketplaceStore::GetLibraryItem(const std::string& name) {
  std::optional<LibraryItemRecord> found;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    found.reset();
    auto rows = txn.exec_params("SELECT " + kLibraryColumns +
                                    " FROM library_items WHERE name = $1 AND deleted_at IS NULL",
                                name);
    if (!rows.empty()) found = LibraryFromRow(rows[0]);
    return absl::OkStatus();
  }));
  if (!found) {
    return Error(absl::StatusCode::kNotFound, "LIBRARY_ITEM_NOT_FOUND",
                 absl::StrCat("'", name, "' is not in the public library"));
  }
  return *found;
}

// ---- Images ----------------------------------------------------------------

absl::StatusOr<ImageRecord> MarketplaceStore::RegisterImage(
    const std::string& publisher_tenant_id, const ImageRecord& image,
    const std::string& request_id, absl::Time now) {
  ImageRecord result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // Two registrations of one request (a retry racing its original), or
    // of one app name, wait for each other, so the second sees the first's
    // row: both used to find nothing, and the second's INSERT failed on a
    // unique key (INTERNAL), or two publishers both took one name. Always
    // in this order.
    txn.exec_params("SELECT pg_advisory_xact_lock(hashtextextended('image-request:' || $1 || "
                    "':' || $2, 0))",
                    publisher_tenant_id, request_id);
    txn.exec_params("SELECT pg_advisory_xact_lock(hashtextextended('image-name:' || $1, 0))",
                    image.name);
    auto retry = txn.exec_params("SELECT " + kImageColumns +
                                     " FROM marketplace_images WHERE publisher_tenant_id = $1 "
                                     "AND request_id = $2",
                                 publisher_tenant_id, request_id);
    if (!retry.empty()) {
      ImageRecord e = ImageFromRow(retry[0]);
      if (e.name != image.name || e.version != image.version || e.image != image.image ||
          e.ports != image.ports || e.gpu_count != image.gpu_count ||
          e.price_per_hour_micros != image.price_per_hour_micros ||
          e.description != image.description) {
        return Error(absl::StatusCode::kAlreadyExists, "REQUEST_ID_REUSED",
                     absl::StrCat("request_id '", request_id, "' was already used for image ",
                                  e.id, " with different parameters"));
      }
      result = e;
      return absl::OkStatus();
    }
    // A suspended tenant publishes nothing new (a share lock: a suspension,
    // which updates-locks the row, waits for this or is seen by it).
    txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR KEY SHARE", publisher_tenant_id);
    SV_RETURN_IF_ERROR(CheckNotSuspended(txn, publisher_tenant_id));
    auto taken = txn.exec_params(
        "SELECT id FROM marketplace_images WHERE name = $1 AND version = $2", image.name,
        image.version);
    if (!taken.empty()) {
      return Error(absl::StatusCode::kAlreadyExists, "IMAGE_VERSION_EXISTS",
                   absl::StrCat(image.name, ":", image.version, " is already registered as ",
                                taken[0][0].as<std::string>(), "; versions are immutable"));
    }
    auto owner = txn.exec_params(
        "SELECT publisher_tenant_id FROM marketplace_images WHERE name = $1 LIMIT 1",
        image.name);
    if (!owner.empty() && owner[0][0].as<std::string>() != publisher_tenant_id) {
      return Error(absl::StatusCode::kAlreadyExists, "IMAGE_NAME_TAKEN",
                   absl::StrCat("the app name '", image.name, "' belongs to another publisher"));
    }
    PayableAccount(txn, publisher_tenant_id);
    const std::string id = NewId("img");
    txn.exec_params(
        "INSERT INTO marketplace_images (id, publisher_tenant_id, name, version, image, "
        "description, ports, gpu_count, price_per_hour_micros, request_id, created_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7::integer[], $8, $9, $10, $11::timestamptz)",
        id, publisher_tenant_id, image.name, image.version, image.image, image.description,
        IntArrayLiteral(image.ports), image.gpu_count, image.price_per_hour_micros, request_id,
        SqlTime(now));
    result = ImageFromRow(txn.exec_params1(
        "SELECT " + kImageColumns + " FROM marketplace_images WHERE id = $1", id));
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<ImageRecord> MarketplaceStore::ResolveImage(const std::string& ref) {
  std::optional<ImageRecord> found;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    found.reset();
    pqxx::result rows;
    const auto colon = ref.find(':');
    if (ref.rfind("img-", 0) == 0) {
      rows = txn.exec_params(
          "SELECT " + kImageColumns + " FROM marketplace_images WHERE id = $1", ref);
    } else if (colon != std::string::npos) {
      rows = txn.exec_params("SELECT " + kImageColumns +
                                 " FROM marketplace_images WHERE name = $1 AND version = $2",
                             ref.substr(0, colon), ref.substr(colon + 1));
    } else {
      rows = txn.exec_params("SELECT " + kImageColumns +
                                 " FROM marketplace_images WHERE name = $1 AND listed "
                                 "ORDER BY created_at DESC, id DESC LIMIT 1",
                             ref);
    }
    if (!rows.empty()) found = ImageFromRow(rows[0]);
    return absl::OkStatus();
  }));
  if (!found) return ImageNotFound(ref);
  return *found;
}

absl::StatusOr<std::optional<MarketplaceStore::EarlierCreate>> MarketplaceStore::EarlierCreateOf(
    const std::string& tenant_id, const std::string& request_id) {
  std::optional<EarlierCreate> found;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    found.reset();
    auto created = txn.exec_params(
        "SELECT i.id, a.image_id FROM instances i LEFT JOIN instance_apps a "
        "ON a.instance_id = i.id WHERE i.tenant_id = $1 AND i.request_id = $2",
        tenant_id, request_id);
    if (created.empty()) return absl::OkStatus();
    found = EarlierCreate{created[0][0].as<std::string>(), std::nullopt};
    if (created[0][1].is_null()) return absl::OkStatus();
    auto rows = txn.exec_params(
        "SELECT " + kImageColumns + " FROM marketplace_images WHERE id = $1",
        created[0][1].as<std::string>());
    if (!rows.empty()) found->image = ImageFromRow(rows[0]);
    return absl::OkStatus();
  }));
  return found;
}

absl::StatusOr<std::vector<ImageRecord>> MarketplaceStore::ListImages(
    const std::string& publisher_tenant_id, const std::string& after_id, int limit) {
  std::vector<ImageRecord> list;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    list.clear();
    for (const auto& r : txn.exec_params(
             "SELECT " + kImageColumns +
                 " FROM marketplace_images WHERE id > $1 AND "
                 "(CASE WHEN $2 = '' THEN listed AND NOT EXISTS (SELECT 1 FROM "
                 "tenant_suspensions s WHERE s.tenant_id = publisher_tenant_id "
                 "AND s.resumed_at IS NULL) ELSE publisher_tenant_id = $2 END) "
                 "ORDER BY id LIMIT $3",
             after_id, publisher_tenant_id, limit)) {
      list.push_back(ImageFromRow(r));
    }
    return absl::OkStatus();
  }));
  return list;
}

absl::StatusOr<ImageRecord> MarketplaceStore::DelistImage(const std::string& publisher_tenant_id,
                                                          const std::string& id) {
  std::optional<ImageRecord> found;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    found.reset();
    auto rows = txn.exec_params("UPDATE marketplace_images SET listed = false WHERE id = $1 "
                                "AND publisher_tenant_id = $2 RETURNING " + kImageColumns,
                                id, publisher_tenant_id);
    if (!rows.empty()) found = ImageFromRow(rows[0]);
    return absl::OkStatus();
  }));
  if (!found) return ImageNotFound(id);
  return *found;
}

// ---- Publishers --------------------------------------------------------------

absl::StatusOr<EarningsReport> MarketplaceStore::Earnings(const std::string& publisher_tenant_id,
                                                          absl::Time from, absl::Time to) {
  EarningsReport report;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    report = EarningsReport{publisher_tenant_id};
    const int64_t payable = PayableAccount(txn, publisher_tenant_id);
    const int64_t from_minute = absl::ToUnixSeconds(from) / 60;
    const int64_t to_minute = (absl::ToUnixSeconds(to) + 59) / 60;
    for (const auto& r : txn.exec_params(
             "SELECT mi.id, mi.name, mi.version, count(DISTINCT t.idempotency_key), "
             "sum(t.amount_micros)::bigint, "
             "coalesce(sum(t.amount_micros) FILTER (WHERE t.to_account_id = $2), 0)::bigint "
             "FROM ledger_transfers t JOIN instance_apps ia ON ia.instance_id = t.instance_id "
             "JOIN marketplace_images mi ON mi.id = ia.image_id "
             "WHERE t.kind = 'app_fee' AND ia.publisher_tenant_id = $1 "
             "AND t.usage_minute >= $3 AND t.usage_minute < $4 "
             "GROUP BY mi.id, mi.name, mi.version ORDER BY mi.name, mi.version",
             publisher_tenant_id, payable, from_minute, to_minute)) {
      ImageEarningsRow row{r[0].as<std::string>(), r[1].as<std::string>(),
                           r[2].as<std::string>(), r[3].as<int64_t>(), r[4].as<int64_t>(),
                           r[5].as<int64_t>()};
      report.fees_micros += row.fees_micros;
      report.publisher_share_micros += row.publisher_share_micros;
      report.images.push_back(std::move(row));
    }
    report.paid_out_micros =
        txn.exec_params1("SELECT coalesce(sum(amount_micros), 0)::bigint FROM publisher_payouts "
                         "WHERE publisher_tenant_id = $1 AND at >= $2::timestamptz "
                         "AND at < $3::timestamptz",
                         publisher_tenant_id, SqlTime(from), SqlTime(to))[0]
            .as<int64_t>();
    report.payable_balance_micros =
        txn.exec_params1("SELECT balance_micros FROM ledger_accounts WHERE id = $1", payable)[0]
            .as<int64_t>();
    return absl::OkStatus();
  }));
  return report;
}

absl::StatusOr<PayoutRecord> MarketplaceStore::RecordPayout(
    const std::string& publisher_tenant_id, int64_t amount_micros, const std::string& reference,
    const std::string& note, absl::Time now) {
  PayoutRecord result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    if (txn.exec_params("SELECT 1 FROM tenants WHERE id = $1", publisher_tenant_id).empty()) {
      return Error(absl::StatusCode::kNotFound, "TENANT_NOT_FOUND",
                   absl::StrCat("tenant ", publisher_tenant_id, " not found"));
    }
    const int64_t payable = PayableAccount(txn, publisher_tenant_id);
    auto balance = txn.exec_params1(
        "SELECT balance_micros FROM ledger_accounts WHERE id = $1 FOR UPDATE", payable);
    auto existing = txn.exec_params(
        "SELECT publisher_tenant_id, amount_micros, note, " + MicrosOf("at") +
            " FROM publisher_payouts WHERE reference = $1",
        reference);
    if (!existing.empty()) {
      PayoutRecord e{reference, existing[0][0].as<std::string>(), existing[0][1].as<int64_t>(),
                     existing[0][2].as<std::string>(),
                     TimeFromMicros(existing[0][3].as<int64_t>())};
      if (e.publisher_tenant_id != publisher_tenant_id || e.amount_micros != amount_micros) {
        return Error(absl::StatusCode::kAlreadyExists, "IDEMPOTENCY_KEY_REUSED",
                     absl::StrCat("payout reference '", reference, "' was already used for ",
                                  Yuan(e.amount_micros), " to ", e.publisher_tenant_id));
      }
      result = e;
      return absl::OkStatus();
    }
    // A suspended publisher (fraud, abuse) is owed what it is owed, but
    // nothing leaves until an operator resumes it.
    auto suspended = txn.exec_params(
        "SELECT reason FROM tenant_suspensions WHERE tenant_id = $1 AND resumed_at IS NULL",
        publisher_tenant_id);
    if (!suspended.empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "PUBLISHER_SUSPENDED",
                   absl::StrCat("tenant ", publisher_tenant_id, " is suspended (",
                                suspended[0][0].as<std::string>(),
                                "); payouts are held until an operator resumes it"));
    }
    if (balance[0].as<int64_t>() < amount_micros) {
      return Error(absl::StatusCode::kFailedPrecondition, "INSUFFICIENT_PAYABLE",
                   absl::StrCat("the publisher is owed ", Yuan(balance[0].as<int64_t>()),
                                ", less than the payout of ", Yuan(amount_micros)));
    }
    const int64_t clearing = txn.exec1(
        "SELECT id FROM ledger_accounts WHERE tenant_id IS NULL AND kind = 'payment_clearing' "
        "AND owner = ''")[0].as<int64_t>();
    txn.exec_params(
        "INSERT INTO ledger_transfers (idempotency_key, leg, content_hash, from_account_id, "
        "to_account_id, amount_micros, kind, tenant_id, at) VALUES ('payout:' || $1::text, 0, "
        "md5($1::text || '|' || $2::text || '|' || $3::bigint::text), $4::bigint, $5::bigint, "
        "$3::bigint, 'payout', $2::text, $6::timestamptz)",
        reference, publisher_tenant_id, amount_micros, payable, clearing, SqlTime(now));
    txn.exec_params(
        "INSERT INTO publisher_payouts (reference, publisher_tenant_id, amount_micros, note, at) "
        "VALUES ($1, $2, $3, $4, $5::timestamptz)",
        reference, publisher_tenant_id, amount_micros, note, SqlTime(now));
    result = {reference, publisher_tenant_id, amount_micros, note, now};
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<std::vector<PayoutRecord>> MarketplaceStore::ListPayouts(
    const std::string& publisher_tenant_id, const std::string& after_reference, int limit) {
  std::vector<PayoutRecord> list;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    list.clear();
    for (const auto& r : txn.exec_params(
             "SELECT reference, amount_micros, note, " + MicrosOf("at") +
                 " FROM publisher_payouts WHERE publisher_tenant_id = $1 AND reference > $2 "
                 "ORDER BY reference LIMIT $3",
             publisher_tenant_id, after_reference, limit)) {
      list.push_back({r[0].as<std::string>(), publisher_tenant_id, r[1].as<int64_t>(),
                      r[2].as<std::string>(), TimeFromMicros(r[3].as<int64_t>())});
    }
    return absl::OkStatus();
  }));
  return list;
}

absl::StatusOr<std::map<std::string, InstanceExtrasView>> MarketplaceStore::ExtrasOf(
    const std::string& tenant_id, const std::vector<std::string>& instance_ids) {
  std::map<std::string, InstanceExtrasView> out;
  if (instance_ids.empty()) return out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    std::vector<std::string> quoted;
    for (const auto& id : instance_ids) quoted.push_back(txn.quote(id));
    const std::string in = absl::StrCat("(", absl::StrJoin(quoted, ","), ")");
    // One URL per declared port: the binding on the instance's first node.
    for (const auto& r : txn.exec_params(absl::StrCat(
             "SELECT p.instance_id, p.container_port, p.protocol, coalesce(b.node_port, 0), "
             "coalesce(n.address, '') FROM instance_ports p JOIN instances i ON "
             "i.id = p.instance_id AND i.tenant_id = $1 "
             "LEFT JOIN LATERAL (SELECT node_id, node_port FROM node_port_bindings b "
             "  WHERE b.instance_id = p.instance_id AND b.container_port = p.container_port "
             "  AND b.protocol = p.protocol ORDER BY node_id LIMIT 1) b ON true "
             "LEFT JOIN nodes n ON n.id = b.node_id WHERE p.instance_id IN ", in,
             " ORDER BY p.instance_id, p.container_port, p.protocol"), tenant_id)) {
      InstancePortView v{r[1].as<int>(), r[2].as<std::string>(), r[3].as<int>(), ""};
      const std::string address = r[4].as<std::string>();
      if (v.node_port > 0 && !address.empty()) {
        const bool v6 = address.find(':') != std::string::npos;
        // Port 22 over TCP is the instance's SSH server (the tenant's keys are
        // in its authorized_keys): ssh://root@host:port, as ssh(1) takes it.
        const bool ssh = v.container_port == 22 && v.protocol == "tcp";
        v.url = absl::StrCat(v.protocol == "udp" ? "udp://" : ssh ? "ssh://root@" : "http://",
                             v6 ? "[" : "", address, v6 ? "]" : "", ":", v.node_port);
      }
      out[r[0].as<std::string>()].ports.push_back(std::move(v));
    }
    for (const auto& r : txn.exec_params(
             absl::StrCat("SELECT m.instance_id, m.name FROM instance_library_mounts m JOIN "
                          "instances i ON i.id = m.instance_id AND i.tenant_id = $1 "
                          "WHERE m.instance_id IN ", in, " ORDER BY 1, 2"), tenant_id)) {
      out[r[0].as<std::string>()].library_mounts.push_back(r[1].as<std::string>());
    }
    for (const auto& r : txn.exec_params(
             absl::StrCat("SELECT a.instance_id, a.image_id FROM instance_apps a JOIN "
                          "instances i ON i.id = a.instance_id AND i.tenant_id = $1 "
                          "WHERE a.instance_id IN ", in), tenant_id)) {
      out[r[0].as<std::string>()].app_image_id = r[1].as<std::string>();
    }
    for (const auto& r : txn.exec_params(
             absl::StrCat("SELECT instance_id, volume_id FROM volume_attachments "
                          "WHERE tenant_id = $1 AND instance_id IN ", in,
                          " ORDER BY instance_id, mount_path"), tenant_id)) {
      out[r[0].as<std::string>()].volume_ids.push_back(r[1].as<std::string>());
    }
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace sv::store
