#include "store/volume_store.h"

#include <algorithm>
#include <map>
#include <pqxx/pqxx>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "store/security_store.h"

namespace sv::store {
namespace {

// States in which an instance holds nodes whose agents must confirm a
// mount change; in any other unfinished state a change applies at once
// (the mounts go with the next start).
constexpr char kPlacedStates[] = "('SCHEDULED', 'STARTING', 'RUNNING')";

const std::string kVolumeColumns =
    "id, tenant_id, name, size_gib, kind, read_many, coalesce(node_id, ''), request_id, " +
    MicrosOf("created_at") + ", " + MicrosOf("deleted_at") +
    ", coalesce(move_to_instance_id, ''), unpaid_since_minute";

VolumeRecord VolumeFromRow(const pqxx::row& r) {
  VolumeRecord v;
  v.id = r[0].as<std::string>();
  v.tenant_id = r[1].as<std::string>();
  v.spec.name = r[2].as<std::string>();
  v.spec.size_gib = r[3].as<int>();
  v.spec.kind = r[4].as<std::string>() == "node_local" ? VolumeKind::kNodeLocal
                                                       : VolumeKind::kNetwork;
  v.spec.read_many = r[5].as<bool>();
  v.spec.node_id = r[6].as<std::string>();
  v.request_id = r[7].as<std::string>();
  v.created_at = TimeFromMicros(r[8].as<int64_t>());
  if (!r[9].is_null()) v.deleted_at = TimeFromMicros(r[9].as<int64_t>());
  v.move_to_instance_id = r[10].as<std::string>();
  if (!r[11].is_null()) v.unpaid_since = absl::FromUnixSeconds(r[11].as<int64_t>() * 60);
  return v;
}

void LoadAttachments(pqxx::work& txn, std::vector<VolumeRecord>& volumes) {
  if (volumes.empty()) return;
  std::map<std::string, VolumeRecord*> by_id;
  std::vector<std::string> ids;
  for (auto& v : volumes) {
    by_id[v.id] = &v;
    ids.push_back(txn.quote(v.id));
  }
  for (const auto& r : txn.exec(absl::StrCat(
           "SELECT volume_id, instance_id, read_only, mount_path, state, reason, ",
           MicrosOf("requested_at"), ", ", MicrosOf("confirmed_at"),
           " FROM volume_attachments WHERE volume_id IN (", absl::StrJoin(ids, ","),
           ") ORDER BY volume_id, requested_at, instance_id"))) {
    AttachmentRecord a;
    a.instance_id = r[1].as<std::string>();
    a.read_only = r[2].as<bool>();
    a.mount_path = r[3].as<std::string>();
    const std::string state = r[4].as<std::string>();
    a.state = state == "attached"    ? AttachmentState::kAttached
              : state == "detaching" ? AttachmentState::kDetaching
                                     : AttachmentState::kAttaching;
    a.reason = r[5].as<std::string>();
    a.requested_at = TimeFromMicros(r[6].as<int64_t>());
    if (!r[7].is_null()) a.confirmed_at = TimeFromMicros(r[7].as<int64_t>());
    by_id[r[0].as<std::string>()]->attachments.push_back(std::move(a));
  }
}

absl::Status VolumeNotFound(const std::string& id) {
  return Error(absl::StatusCode::kNotFound, "VOLUME_NOT_FOUND",
               absl::StrCat("volume ", id, " not found"));
}

// Locks and reads a live volume of the tenant.
absl::StatusOr<VolumeRecord> LockVolume(pqxx::work& txn, const std::string& tenant_id,
                                        const std::string& id) {
  auto rows = txn.exec_params("SELECT " + kVolumeColumns +
                                  " FROM volumes WHERE tenant_id = $1 AND id = $2 "
                                  "AND deleted_at IS NULL FOR UPDATE",
                              tenant_id, id);
  if (rows.empty()) return VolumeNotFound(id);
  std::vector<VolumeRecord> v = {VolumeFromRow(rows[0])};
  LoadAttachments(txn, v);
  return v[0];
}

absl::StatusOr<VolumeRecord> Reread(pqxx::work& txn, const std::string& id) {
  auto rows = txn.exec_params("SELECT " + kVolumeColumns + " FROM volumes WHERE id = $1", id);
  std::vector<VolumeRecord> v = {VolumeFromRow(rows[0])};
  LoadAttachments(txn, v);
  return v[0];
}

struct TargetInstance {
  std::string state;
  int gpu_count = 0;
  std::vector<std::string> nodes;  // Nodes holding its GPUs.
  bool placed = false;             // Its agents must confirm mount changes.
};

// Locks an instance of the tenant that may take a volume.
absl::StatusOr<TargetInstance> LockTarget(pqxx::work& txn, const std::string& tenant_id,
                                          const std::string& instance_id) {
  auto rows = txn.exec_params(
      "SELECT state, gpu_count FROM instances WHERE tenant_id = $1 AND id = $2 FOR UPDATE",
      tenant_id,
      instance_id);
  if (rows.empty()) {
    return Error(absl::StatusCode::kNotFound, "INSTANCE_NOT_FOUND",
                 absl::StrCat("instance ", instance_id, " not found"));
  }
  TargetInstance t;
  t.state = rows[0][0].as<std::string>();
  t.gpu_count = rows[0][1].as<int>();
  if (t.state == "DELETED" || t.state == "FAILED") {
    return Error(absl::StatusCode::kFailedPrecondition, "INSTANCE_FINISHED",
                 absl::StrCat("instance ", instance_id, " is ", t.state,
                              "; volumes attach only to live instances"));
  }
  for (const auto& r : txn.exec_params(
           "SELECT DISTINCT node_id FROM gpu_reservations WHERE instance_id = $1 ORDER BY 1",
           instance_id)) {
    t.nodes.push_back(r[0].as<std::string>());
  }
  t.placed = !t.nodes.empty() &&
             (t.state == "SCHEDULED" || t.state == "STARTING" || t.state == "RUNNING");
  return t;
}

absl::StatusOr<std::string> NormalizeMountPath(const VolumeRecord& v, const std::string& path) {
  std::string p = path.empty() ? absl::StrCat("/mnt/", v.spec.name) : path;
  while (p.size() > 2 && p.back() == '/') p.pop_back();  // "/mnt/a/" is "/mnt/a".
  if (p.size() > 255 || p.size() < 2 || p[0] != '/' || absl::StrContains(p, "/..") ||
      absl::StrContains(p, "//") || absl::StartsWith(p, "/public") ||
      p.find_first_of(" :,\t\n\"'\\") != std::string::npos ||
      std::any_of(p.begin(), p.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; })) {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_MOUNT_PATH",
                 "mount_path must be an absolute path of at most 255 characters, without "
                 "'..', spaces, control characters, ':' or ',', and outside /public");
  }
  return p;
}

// Checks that the volume may attach to the instance; binds an unplaced
// node-local volume to the instance's node.
// An instance that holds no node yet (PENDING, STOPPED) is placed on the
// node of its node-local volumes by the scheduler (docs/storage.md), so those
// must agree with each other and the instance must fit on one node.
absl::Status CheckColdPlacement(pqxx::work& txn, const VolumeRecord& v, const TargetInstance& t,
                                const std::string& instance_id) {
  if (t.gpu_count > 8) {
    return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_NODE_MISMATCH",
                 absl::StrCat("volume ", v.id, " is node-local and instance ", instance_id,
                              " is a gang of ", t.gpu_count,
                              " GPUs over several nodes; use a network volume"));
  }
  if (v.spec.node_id.empty()) return absl::OkStatus();
  auto other = txn.exec_params(
      "SELECT v.id, v.node_id FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id "
      "WHERE a.instance_id = $1 AND v.kind = 'node_local' AND v.node_id IS NOT NULL "
      "AND v.node_id <> $2 AND v.id <> $3 LIMIT 1",
      instance_id, v.spec.node_id, v.id);
  if (!other.empty()) {
    return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_NODE_MISMATCH",
                 absl::StrCat("volume ", v.id, " is node-local on node ", v.spec.node_id,
                              " and instance ", instance_id, " already has node-local volume ",
                              other[0][0].as<std::string>(), " on node ",
                              other[0][1].as<std::string>(),
                              "; an instance runs on one node"));
  }
  return absl::OkStatus();
}

absl::Status CheckPlacement(pqxx::work& txn, VolumeRecord& v, const TargetInstance& t,
                            const std::string& instance_id, absl::Time now) {
  if (v.spec.kind != VolumeKind::kNodeLocal) return absl::OkStatus();
  if (t.nodes.empty()) return CheckColdPlacement(txn, v, t, instance_id);
  if (t.nodes.size() > 1) {
    return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_NODE_MISMATCH",
                 absl::StrCat("volume ", v.id, " is node-local and instance ", instance_id,
                              " spans ", t.nodes.size(), " nodes; use a network volume"));
  }
  if (!v.spec.node_id.empty() && v.spec.node_id != t.nodes[0]) {
    return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_NODE_MISMATCH",
                 absl::StrCat("volume ", v.id, " is node-local on node ", v.spec.node_id,
                              " and instance ", instance_id, " runs on node ", t.nodes[0],
                              "; use a network volume or an instance on that node"));
  }
  if (v.spec.node_id.empty()) {
    txn.exec_params("UPDATE volumes SET node_id = $2, updated_at = $3::timestamptz WHERE id = $1",
                    v.id, t.nodes[0], SqlTime(now));
    v.spec.node_id = t.nodes[0];
  }
  return absl::OkStatus();
}

// Whether the (locked) instance has room for one more volume at
// `mount_path`: volumes moving to it count as attached there, so a move
// that completes later never finds its path taken or the limit passed.
// Mount paths may not nest either: the agent mounts each path on its own,
// so a volume inside another was hidden when the outer one was mounted
// over it, and taken off with it when the outer one was detached (a lazy
// unmount takes what is below), while both were reported attached and the
// tenant's writes went into the outer volume or the instance's own disk.
absl::Status CheckRoom(pqxx::work& txn, const std::string& instance_id,
                       const std::string& mount_path) {
  auto count = txn.exec_params1(
      "WITH taken AS (SELECT mount_path AS p FROM volume_attachments WHERE instance_id = $1 "
      "UNION ALL SELECT move_mount_path FROM volumes WHERE move_to_instance_id = $1) "
      "SELECT count(*), (SELECT p FROM taken WHERE p = $2 OR starts_with($2, p || '/') "
      "OR starts_with(p, $2 || '/') ORDER BY p <> $2, p LIMIT 1) FROM taken",
      instance_id, mount_path);
  if (!count[1].is_null()) {
    const std::string taken = count[1].as<std::string>();
    return Error(absl::StatusCode::kFailedPrecondition, "MOUNT_PATH_IN_USE",
                 taken == mount_path
                     ? absl::StrCat("instance ", instance_id, " already has a volume at ",
                                    mount_path, " (attached or moving there)")
                     : absl::StrCat("instance ", instance_id, " has a volume at ", taken,
                                    " (attached or moving there); mount paths may not nest, "
                                    "and ", mount_path, " would"));
  }
  if (count[0].as<int>() >= kInstanceAttachmentsMax) {
    return Error(absl::StatusCode::kResourceExhausted, "TOO_MANY_ATTACHMENTS",
                 absl::StrCat("an instance takes at most ", kInstanceAttachmentsMax, " volumes"));
  }
  return absl::OkStatus();
}

// Whether the instance holds a node, read after its row is locked (shared):
// a stop or move of it that committed meanwhile is seen, so a detach never
// waits for an agent the instance no longer has.
bool PlacedUnderLock(pqxx::work& txn, const std::string& instance_id) {
  txn.exec_params("SELECT 1 FROM instances WHERE id = $1 FOR SHARE", instance_id);
  return !txn.exec_params(absl::StrCat("SELECT 1 FROM instances i WHERE i.id = $1 AND i.state IN ",
                                       kPlacedStates,
                                       " AND EXISTS (SELECT 1 FROM gpu_reservations r "
                                       "WHERE r.instance_id = i.id)"),
                          instance_id)
              .empty();
}

// A volume's life starts or ends at `now`, or at the first minute metering
// has not charged if that is later: storage is charged by the minute up to
// the billing cursor from what the pass saw, so a create or delete stamped
// before minutes already charged (its time read before a pass that went
// past it, a replica's clock behind the leader's) left storage charged for
// minutes it did not live, or never charged for ones it did, and nothing
// corrected either. The share lock waits for a batch in flight.
// A cursor far ahead of `now` is not metering that ran ahead (it stops
// a lag behind the leader's clock) but a database that ran on another clock
// (svd --fake-clock-start, a restore from elsewhere): it is not followed.
absl::Time NotBeforeBilled(pqxx::work& txn, absl::Time now) {
  auto row = txn.exec1("SELECT billed_before_minute FROM billing_cursor WHERE id = 1 FOR SHARE");
  if (row[0].is_null()) return now;
  const absl::Time cursor = absl::FromUnixSeconds(row[0].as<int64_t>() * 60);
  if (cursor - now > absl::Hours(1)) {
    spdlog::warn("store: the billing cursor ({}) is far ahead of this clock ({}); a volume's "
                 "time is stamped by the clock",
                 absl::FormatTime(cursor), absl::FormatTime(now));
    return now;
  }
  return std::max(now, cursor);
}

// Detaches from an instance that holds no node (empty instance_id: every
// attachment of the volume): at once, unless a node the instance left may
// still mount it (migration 0124); that one waits, 'detaching', for the node.
void DetachUnplaced(pqxx::work& txn, const std::string& volume_id,
                    const std::string& instance_id, absl::Time now) {
  txn.exec_params("DELETE FROM volume_attachments WHERE volume_id = $1 "
                  "AND ($2 = '' OR instance_id = $2) AND cardinality(fenced_nodes) = 0",
                  volume_id, instance_id);
  txn.exec_params(
      "UPDATE volume_attachments SET state = 'detaching', confirmed_nodes = '{}', "
      "reason = volume_fence_reason(fenced_nodes), requested_at = $3::timestamptz "
      "WHERE volume_id = $1 AND ($2 = '' OR instance_id = $2)",
      volume_id, instance_id, SqlTime(now));
}

absl::Status InsertAttachment(pqxx::work& txn, const VolumeRecord& v,
                              const std::string& instance_id, const TargetInstance& t,
                              bool read_only, const std::string& mount_path, absl::Time now) {
  SV_RETURN_IF_ERROR(CheckRoom(txn, instance_id, mount_path));
  txn.exec_params(
      "INSERT INTO volume_attachments (volume_id, instance_id, tenant_id, read_only, "
      "mount_path, state, requested_at, confirmed_at) VALUES ($1, $2, $3, $4, $5, $6, "
      "$7::timestamptz, $8::timestamptz)",
      v.id, instance_id, v.tenant_id, read_only, mount_path,
      t.placed ? "attaching" : "attached", SqlTime(now),
      t.placed ? std::optional<std::string>() : std::optional<std::string>(SqlTime(now)));
  return absl::OkStatus();
}

// Refuses a second writer, or any second attachment of a volume that is
// not read-many.
absl::Status CheckWriters(const VolumeRecord& v, bool read_only) {
  for (const auto& a : v.attachments) {
    if (!v.spec.read_many || (!read_only && !a.read_only)) {
      return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_IN_USE",
                   absl::StrCat("volume ", v.id, " is attached to instance ", a.instance_id,
                                v.spec.read_many ? " for writing; one writer at a time"
                                                 : "; detach it first, or create the volume "
                                                   "read-many to share it read-only"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VolumeCreateOutcome> VolumeStore::Create(const std::string& tenant_id,
                                                        const VolumeSpec& spec,
                                                        const std::string& request_id,
                                                        const std::string& fingerprint,
                                                        absl::Time now, const CreateGate& gate) {
  VolumeCreateOutcome outcome;
  VolumeRecord& result = outcome.record;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    outcome = {};
    // First, as metering takes the cursor before the rows it writes.
    const absl::Time created_at = NotBeforeBilled(txn, now);
    // Creates of one tenant queue here, which keeps the volume limit exact.
    txn.exec_params("SELECT 1 FROM tenants WHERE id = $1 FOR UPDATE", tenant_id);
    auto existing = txn.exec_params(
        "SELECT id, request_fingerprint FROM volumes WHERE tenant_id = $1 AND request_id = $2",
        tenant_id, request_id);
    // A retry of a create accepted before a suspension still gets its answer.
    if (existing.empty()) SV_RETURN_IF_ERROR(CheckNotSuspended(txn, tenant_id));
    if (!existing.empty()) {
      if (existing[0][1].as<std::string>() != fingerprint) {
        return Error(absl::StatusCode::kAlreadyExists, "REQUEST_ID_REUSED",
                     absl::StrCat("request_id '", request_id, "' was already used for volume ",
                                  existing[0][0].as<std::string>(),
                                  " with different parameters"));
      }
      SV_ASSIGN_OR_RETURN(result, Reread(txn, existing[0][0].as<std::string>()));
      return absl::OkStatus();
    }
    const int live = txn.exec_params1(
        "SELECT count(*) FROM volumes WHERE tenant_id = $1 AND deleted_at IS NULL",
        tenant_id)[0].as<int>();
    if (live >= kTenantVolumesMax) {
      return Error(absl::StatusCode::kResourceExhausted, "VOLUME_LIMIT_REACHED",
                   absl::StrCat("the tenant already has ", live, " volumes, the most allowed"));
    }
    if (!spec.node_id.empty() &&
        txn.exec_params("SELECT 1 FROM nodes WHERE id = $1 OR name = $1", spec.node_id).empty()) {
      return Error(absl::StatusCode::kInvalidArgument, "UNKNOWN_NODE",
                   absl::StrCat("node ", spec.node_id, " does not exist"));
    }
    const char* kind = spec.kind == VolumeKind::kNodeLocal ? "node_local" : "network";
    if (gate.credit_minutes >= 0) {
      // Storage is charged for as long as the volume lives, paid or not
      // (unpaid minutes are shortfall), so a tenant without credit must
      // not be able to create it. What the tenant is already charged per
      // minute comes first (as in the instance create's gate): its
      // unfinished instances' rent and app fees and its live volumes'
      // storage (sv_committed_rent, migration 0120); without the storage,
      // volume after volume each passed on the same credit (1,000 volumes
      // of 64 TiB on a 10 CNY trial).
      auto row = txn.exec_params1(
          "SELECT (SELECT coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'trial_wallet'), 0) "
          "  + CASE WHEN t.billing_mode = 'postpaid' "
          "    THEN coalesce(max(a.balance_micros + a.credit_limit_micros) "
          "                  FILTER (WHERE a.kind = 'receivable'), 0) "
          "    ELSE coalesce(max(a.balance_micros) FILTER (WHERE a.kind = 'paid_wallet'), 0) END "
          "  FROM tenants t JOIN ledger_accounts a ON a.tenant_id = t.id "
          "  WHERE t.id = $1 GROUP BY t.billing_mode)::bigint, "
          "((SELECT coalesce(sum((s.size_gib::bigint * coalesce((SELECT p.unit_price_micros "
          "   FROM price_book p WHERE p.item_kind = 'storage_gib_hour' "
          "   AND p.item IN (s.kind, '*') AND p.effective_from <= $4::timestamptz "
          "   ORDER BY (p.item = '*'), p.effective_from DESC LIMIT 1), 0) * $5::bigint + 59) "
          "   / 60), 0) FROM (SELECT $2::int AS size_gib, $3::text AS kind) s) "
          " + CASE WHEN $5 > 0 THEN sv_committed_rent($1, $4::timestamptz, '') * $5 "
          "        ELSE 0 END)::bigint",
          tenant_id, spec.size_gib, kind, SqlTime(now), gate.credit_minutes);
      const int64_t available = row[0].is_null() ? 0 : row[0].as<int64_t>();
      const int64_t needed = row[1].as<int64_t>();
      if (available < needed) {
        outcome.refusal = CreateRefusal{"INSUFFICIENT_CREDIT", needed, available};
        return absl::OkStatus();
      }
    }
    if (gate.spend_cap_since_minute >= 0) {
      auto cap = txn.exec_params(
          "SELECT b.monthly_spend_cap_micros, sv_tenant_spent_since(b.tenant_id, $2) "
          "FROM tenant_budgets b WHERE b.tenant_id = $1",
          tenant_id, gate.spend_cap_since_minute);
      if (!cap.empty() && cap[0][1].as<int64_t>() >= cap[0][0].as<int64_t>()) {
        outcome.refusal = CreateRefusal{"SPEND_CAP_REACHED", cap[0][1].as<int64_t>(),
                                        cap[0][0].as<int64_t>()};
        return absl::OkStatus();
      }
    }
    const std::string id = NewId("vol");
    txn.exec_params(
        "INSERT INTO volumes (id, tenant_id, name, size_gib, kind, read_many, node_id, "
        "request_id, request_fingerprint, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, "
        "$6, (SELECT id FROM nodes WHERE id = $7 OR name = $7), $8, $9, $10::timestamptz, "
        "$10::timestamptz)",
        id, tenant_id, spec.name.empty() ? id : spec.name, spec.size_gib, kind, spec.read_many,
        spec.node_id, request_id, fingerprint, SqlTime(created_at));
    SV_ASSIGN_OR_RETURN(result, Reread(txn, id));
    return absl::OkStatus();
  }));
  return outcome;
}

absl::StatusOr<VolumeRecord> VolumeStore::Get(const std::string& tenant_id,
                                              const std::string& id) {
  std::vector<VolumeRecord> found;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    found.clear();
    for (const auto& r : txn.exec_params("SELECT " + kVolumeColumns +
                                             " FROM volumes WHERE tenant_id = $1 AND id = $2",
                                         tenant_id, id)) {
      found.push_back(VolumeFromRow(r));
    }
    LoadAttachments(txn, found);
    return absl::OkStatus();
  }));
  if (found.empty()) return VolumeNotFound(id);
  return found[0];
}

absl::StatusOr<std::vector<VolumeRecord>> VolumeStore::List(
    const std::string& tenant_id, const std::optional<VolumeListCursor>& after, int limit,
    bool show_deleted) {
  std::vector<VolumeRecord> list;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    list.clear();
    const int64_t after_micros = after ? after->created_at_micros : -1;
    const std::string after_id = after ? after->id : "";
    for (const auto& r : txn.exec_params(
             "SELECT " + kVolumeColumns +
                 " FROM volumes WHERE tenant_id = $1 AND ($2 OR deleted_at IS NULL) "
                 "AND (" + MicrosOf("created_at") + ", id) > ($3, $4) "
                 "ORDER BY created_at, id LIMIT $5",
             tenant_id, show_deleted, after_micros, after_id, limit)) {
      list.push_back(VolumeFromRow(r));
    }
    LoadAttachments(txn, list);
    return absl::OkStatus();
  }));
  return list;
}

absl::StatusOr<VolumeRecord> VolumeStore::Delete(const std::string& tenant_id,
                                                 const std::string& id, absl::Time now) {
  VolumeRecord result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    // First, as metering takes the cursor before the volume rows it writes.
    const absl::Time deleted_at = NotBeforeBilled(txn, now);
    SV_ASSIGN_OR_RETURN(VolumeRecord v, LockVolume(txn, tenant_id, id));
    if (!v.attachments.empty() || !v.move_to_instance_id.empty()) {
      std::vector<std::string> users;
      for (const auto& a : v.attachments) users.push_back(a.instance_id);
      if (!v.move_to_instance_id.empty()) users.push_back(v.move_to_instance_id);
      return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_ATTACHED",
                   absl::StrCat("volume ", id, " is attached to instance ",
                                absl::StrJoin(users, ", "), "; detach it before deleting"));
    }
    txn.exec_params(
        "UPDATE volumes SET deleted_at = $2::timestamptz, updated_at = $2::timestamptz "
        "WHERE id = $1",
        id, SqlTime(deleted_at));
    SV_ASSIGN_OR_RETURN(result, Reread(txn, id));
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<VolumeRecord> VolumeStore::Attach(const std::string& tenant_id,
                                                 const std::string& volume_id,
                                                 const std::string& instance_id, bool read_only,
                                                 const std::string& mount_path, absl::Time now) {
  VolumeRecord result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    SV_ASSIGN_OR_RETURN(VolumeRecord v, LockVolume(txn, tenant_id, volume_id));
    SV_ASSIGN_OR_RETURN(std::string path, NormalizeMountPath(v, mount_path));
    SV_ASSIGN_OR_RETURN(TargetInstance t, LockTarget(txn, tenant_id, instance_id));
    for (const auto& a : v.attachments) {
      if (a.instance_id != instance_id) continue;
      if (a.state != AttachmentState::kDetaching && a.read_only == read_only &&
          a.mount_path == path) {
        result = v;  // A retry of this attach.
        return absl::OkStatus();
      }
      return Error(absl::StatusCode::kFailedPrecondition,
                   a.state == AttachmentState::kDetaching ? "VOLUME_BUSY" : "ALREADY_ATTACHED",
                   absl::StrCat("volume ", volume_id, " is already attached to instance ",
                                instance_id,
                                a.state == AttachmentState::kDetaching
                                    ? " and detaching; retry when the detach is confirmed"
                                    : " with other settings"));
    }
    if (!v.move_to_instance_id.empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_BUSY",
                   absl::StrCat("volume ", volume_id, " is moving to instance ",
                                v.move_to_instance_id));
    }
    SV_RETURN_IF_ERROR(CheckWriters(v, read_only));
    SV_RETURN_IF_ERROR(CheckPlacement(txn, v, t, instance_id, now));
    SV_RETURN_IF_ERROR(InsertAttachment(txn, v, instance_id, t, read_only, path, now));
    SV_ASSIGN_OR_RETURN(result, Reread(txn, volume_id));
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<VolumeRecord> VolumeStore::Detach(const std::string& tenant_id,
                                                 const std::string& volume_id,
                                                 const std::string& instance_id,
                                                 absl::Time now) {
  VolumeRecord result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    SV_ASSIGN_OR_RETURN(VolumeRecord v, LockVolume(txn, tenant_id, volume_id));
    const AttachmentRecord* found = nullptr;
    for (const auto& a : v.attachments) {
      if (a.instance_id == instance_id) found = &a;
    }
    if (found == nullptr) {
      return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_NOT_ATTACHED",
                   absl::StrCat("volume ", volume_id, " is not attached to instance ",
                                instance_id));
    }
    if (found->state != AttachmentState::kDetaching) {
      if (!PlacedUnderLock(txn, instance_id)) {
        DetachUnplaced(txn, volume_id, instance_id, now);
        txn.exec_params("SELECT volumes_complete_moves($1::timestamptz)", SqlTime(now));
      } else {
        txn.exec_params(
            "UPDATE volume_attachments SET state = 'detaching', confirmed_nodes = '{}', "
            "reason = '', requested_at = $3::timestamptz "
            "WHERE volume_id = $1 AND instance_id = $2",
            volume_id, instance_id, SqlTime(now));
      }
    }
    SV_ASSIGN_OR_RETURN(result, Reread(txn, volume_id));
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<VolumeRecord> VolumeStore::Move(const std::string& tenant_id,
                                               const std::string& volume_id,
                                               const std::string& to_instance_id,
                                               const std::string& mount_path, absl::Time now) {
  VolumeRecord result;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) -> absl::Status {
    SV_ASSIGN_OR_RETURN(VolumeRecord v, LockVolume(txn, tenant_id, volume_id));
    SV_ASSIGN_OR_RETURN(std::string path, NormalizeMountPath(v, mount_path));
    if (v.attachments.size() != 1 || !v.move_to_instance_id.empty()) {
      return Error(absl::StatusCode::kFailedPrecondition, "VOLUME_NOT_MOVABLE",
                   absl::StrCat("volume ", volume_id, " has ", v.attachments.size(),
                                " attachments", v.move_to_instance_id.empty() ? "" : " and a move",
                                "; a move needs exactly one attachment"));
    }
    const AttachmentRecord from = v.attachments[0];
    if (from.instance_id == to_instance_id) {
      result = v;
      return absl::OkStatus();
    }
    SV_ASSIGN_OR_RETURN(TargetInstance t, LockTarget(txn, tenant_id, to_instance_id));
    SV_RETURN_IF_ERROR(CheckRoom(txn, to_instance_id, path));
    SV_RETURN_IF_ERROR(CheckPlacement(txn, v, t, to_instance_id, now));
    // The move completes (volumes_complete_moves) once the old attachment is
    // gone: at once when the old instance holds no node, else when its agent
    // confirms the unmount, so two instances never mount it for writing.
    txn.exec_params(
        "UPDATE volumes SET move_to_instance_id = $2, move_mount_path = $3, "
        "move_read_only = $5, updated_at = $4::timestamptz WHERE id = $1",
        volume_id, to_instance_id, path, SqlTime(now), from.read_only);
    if (from.state != AttachmentState::kDetaching) {
      if (!PlacedUnderLock(txn, from.instance_id)) {
        DetachUnplaced(txn, volume_id, "", now);
      } else {
        txn.exec_params(
            "UPDATE volume_attachments SET state = 'detaching', confirmed_nodes = '{}', "
            "reason = '', requested_at = $2::timestamptz WHERE volume_id = $1",
            volume_id, SqlTime(now));
      }
    }
    txn.exec_params("SELECT volumes_complete_moves($1::timestamptz)", SqlTime(now));
    SV_ASSIGN_OR_RETURN(result, Reread(txn, volume_id));
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> VolumeStore::AttachedTo(
    const std::string& tenant_id, const std::vector<std::string>& instance_ids) {
  std::vector<std::pair<std::string, std::string>> out;
  if (instance_ids.empty()) return out;
  SV_RETURN_IF_ERROR(db_.Transact([&](pqxx::work& txn) {
    out.clear();
    std::vector<std::string> quoted;
    for (const auto& id : instance_ids) quoted.push_back(txn.quote(id));
    for (const auto& r : txn.exec_params(
             absl::StrCat("SELECT instance_id, volume_id FROM volume_attachments "
                          "WHERE tenant_id = $1 AND instance_id IN (",
                          absl::StrJoin(quoted, ","), ") ORDER BY instance_id, mount_path"),
             tenant_id)) {
      out.emplace_back(r[0].as<std::string>(), r[1].as<std::string>());
    }
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace sv::store
