#include "store/node_resources.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "common/status.h"
#include "store/agent_store.h"
#include "store/database.h"
#include "store/marketplace_store.h"
#include "store/sql_arrays.h"

namespace sv::store {
namespace {

// Hands out a node port to every declared port of the instances that has
// none on this node yet: the lowest free ports of the node's range. The
// advisory lock serializes allocations per node across svd replicas; the
// primary key (node_id, node_port) would refuse a duplicate regardless.
void AllocatePorts(pqxx::work& txn, const std::string& node_id, const std::string& ids,
                   absl::Time now) {
  const pqxx::row missing = ExecPrepared(txn, "sv_agent_ports_missing",
      "SELECT count(*) FROM instance_ports p WHERE p.instance_id = ANY($2::text[]) "
      "AND NOT EXISTS (SELECT 1 FROM node_port_bindings b WHERE b.node_id = $1 "
      "AND b.instance_id = p.instance_id AND b.container_port = p.container_port "
      "AND b.protocol = p.protocol)",
      node_id, ids)[0];
  if (missing[0].as<int64_t>() == 0) return;
  txn.exec_params("SELECT pg_advisory_xact_lock(hashtextextended('node-ports:' || $1, 0))",
                  node_id);
  const auto bound = txn.exec_params(R"sql(
    WITH node AS (SELECT node_port_min AS lo, node_port_max AS hi FROM nodes WHERE id = $1),
    need AS (
      SELECT p.instance_id, p.container_port, p.protocol,
             row_number() OVER (ORDER BY p.instance_id, p.container_port, p.protocol) AS n
      FROM instance_ports p
      WHERE p.instance_id = ANY($2::text[])
        AND NOT EXISTS (SELECT 1 FROM node_port_bindings b WHERE b.node_id = $1
                        AND b.instance_id = p.instance_id
                        AND b.container_port = p.container_port AND b.protocol = p.protocol)
    ), free AS (
      SELECT port, row_number() OVER (ORDER BY port) AS n
      FROM node, generate_series(node.lo, node.hi) AS port
      WHERE NOT EXISTS (SELECT 1 FROM node_port_bindings b
                        WHERE b.node_id = $1 AND b.node_port = port)
    )
    INSERT INTO node_port_bindings (node_id, node_port, instance_id, container_port, protocol,
                                    bound_at)
    SELECT $1, f.port, need.instance_id, need.container_port, need.protocol, $3::timestamptz
    FROM need JOIN free f USING (n))sql",
                  node_id, ids, SqlTime(now));
  // Registration keeps every node's range at kNodePortsMin or more, so this
  // is an invariant broken elsewhere (a range edited in the database).
  if (static_cast<int64_t>(bound.affected_rows()) < missing[0].as<int64_t>()) {
    spdlog::error("store: node {} ran out of node ports: {} of {} declared ports bound", node_id,
                  bound.affected_rows(), missing[0].as<int64_t>());
  }
}

}  // namespace

absl::Status LoadAssignmentResources(pqxx::work& txn, const std::string& node_id,
                                     absl::Time now, std::vector<AgentAssignment>& desired) {
  if (desired.empty()) return absl::OkStatus();
  std::map<std::string, AgentAssignment*> by_id;
  std::vector<std::string> id_list;
  for (auto& a : desired) {
    by_id[a.instance_id] = &a;
    id_list.push_back(a.instance_id);
  }
  const std::string ids = TextArrayLiteral(id_list);
  AllocatePorts(txn, node_id, ids, now);
  for (const auto& row : ExecPrepared(txn, "sv_agent_port_bindings",
           "SELECT instance_id, container_port, node_port, protocol FROM node_port_bindings "
           "WHERE node_id = $1 AND instance_id = ANY($2::text[]) "
           "ORDER BY instance_id, container_port, protocol",
           node_id, ids)) {
    by_id[row[0].as<std::string>()]->ports.push_back(
        {row[1].as<int>(), row[2].as<int>(), row[3].as<std::string>()});
  }
  // A node-local volume placed for the first time lives on this node from
  // now on; one that lives elsewhere is not mounted, and says why.
  ExecPrepared(txn, "sv_agent_local_volumes_place",
      "UPDATE volumes v SET node_id = $1, updated_at = $3::timestamptz "
      "FROM volume_attachments a WHERE a.volume_id = v.id AND a.instance_id = ANY($2::text[]) "
      "AND v.kind = 'node_local' AND v.node_id IS NULL",
      node_id, ids, SqlTime(now));
  ExecPrepared(txn, "sv_agent_local_volumes_elsewhere",
      "UPDATE volume_attachments a SET reason = 'the node-local volume lives on node ' || "
      "v.node_id || ', not on the node the instance runs on' "
      "FROM volumes v WHERE v.id = a.volume_id AND a.instance_id = ANY($2::text[]) "
      "AND v.kind = 'node_local' AND v.node_id <> $1 AND a.reason = ''",
      node_id, ids);
  for (const auto& row : ExecPrepared(txn, "sv_agent_volume_mounts",
           "SELECT a.instance_id, a.volume_id, a.mount_path, a.read_only "
           "FROM volume_attachments a JOIN volumes v ON v.id = a.volume_id "
           "WHERE a.instance_id = ANY($2::text[]) AND a.state IN ('attaching', 'attached') "
           "AND (v.kind = 'network' OR v.node_id = $1) ORDER BY a.instance_id, a.mount_path",
           node_id, ids)) {
    const std::string volume_id = row[1].as<std::string>();
    by_id[row[0].as<std::string>()]->mounts.push_back(
        {volume_id, absl::StrCat(kVolumeHostRoot, volume_id), row[2].as<std::string>(),
         row[3].as<bool>()});
  }
  for (const auto& row : ExecPrepared(txn, "sv_agent_library_mounts",
           "SELECT instance_id, name FROM instance_library_mounts "
           "WHERE instance_id = ANY($1::text[]) ORDER BY instance_id, name",
           ids)) {
    const std::string name = row[1].as<std::string>();
    by_id[row[0].as<std::string>()]->mounts.push_back(
        {"", absl::StrCat(kLibraryHostRoot, name), absl::StrCat(kLibraryMountRoot, name), true});
  }
  for (const auto& row : ExecPrepared(txn, "sv_agent_ssh_keys",
           "SELECT i.id, k.public_key FROM instances i JOIN ssh_keys k "
           "ON k.tenant_id = i.tenant_id WHERE i.id = ANY($1::text[]) "
           "ORDER BY i.id, k.created_at, k.id",
           ids)) {
    by_id[row[0].as<std::string>()]->authorized_keys.push_back(row[1].as<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ConfirmMounts(pqxx::work& txn, const std::string& node_id,
                           const std::string& instance_id,
                           const std::vector<ReportedMount>& mounts, const std::string& error,
                           absl::Time now) {
  auto held = txn.exec_params(
      "SELECT 1 FROM instances i WHERE i.id = $1 AND EXISTS (SELECT 1 FROM gpu_reservations r "
      "WHERE r.instance_id = i.id AND r.node_id = $2) FOR UPDATE",
      instance_id, node_id);
  if (held.empty()) {
    return Error(absl::StatusCode::kNotFound, "UNKNOWN_INSTANCE",
                 absl::StrCat("instance ", instance_id, " holds no GPU on node ", node_id));
  }
  std::vector<std::string> volumes, targets;
  for (const auto& m : mounts) {
    if (!m.volume_id.empty()) volumes.push_back(m.volume_id);
    targets.push_back(m.target);
  }
  const std::string mounted = TextArrayLiteral(volumes);
  // This node has done its part of an attach (mounted) or a detach (gone).
  txn.exec_params(
      "UPDATE volume_attachments SET confirmed_nodes = array_append(confirmed_nodes, $2) "
      "WHERE instance_id = $1 AND NOT ($2 = ANY(confirmed_nodes)) AND "
      "((state = 'attaching' AND volume_id = ANY($3::text[])) OR "
      " (state = 'detaching' AND NOT (volume_id = ANY($3::text[]))))",
      instance_id, node_id, mounted);
  // Done when every node holding the instance did.
  const char* kAllNodes =
      "NOT EXISTS (SELECT 1 FROM gpu_reservations r WHERE r.instance_id = $1 "
      "AND NOT (r.node_id = ANY(confirmed_nodes)))";
  txn.exec_params(absl::StrCat("UPDATE volume_attachments SET state = 'attached', reason = '', "
                               "confirmed_nodes = '{}', confirmed_at = $2::timestamptz "
                               "WHERE instance_id = $1 AND state = 'attaching' AND ",
                               kAllNodes),
                  instance_id, SqlTime(now));
  // ...and no node the instance left may still mount it (migration 0124).
  txn.exec_params(absl::StrCat("DELETE FROM volume_attachments WHERE instance_id = $1 "
                               "AND state = 'detaching' AND cardinality(fenced_nodes) = 0 AND ",
                               kAllNodes),
                  instance_id);
  if (!error.empty()) {
    txn.exec_params(
        "UPDATE volume_attachments SET reason = left($2, 500) WHERE instance_id = $1 "
        "AND state IN ('attaching', 'detaching')",
        instance_id, error);
  }
  txn.exec_params(
      "UPDATE instance_library_mounts SET mounted_nodes = array_append(mounted_nodes, $2) "
      "WHERE instance_id = $1 AND NOT ($2 = ANY(mounted_nodes)) "
      "AND $4 || name = ANY($3::text[])",
      instance_id, node_id, TextArrayLiteral(targets), std::string(kLibraryMountRoot));
  txn.exec_params("SELECT volumes_complete_moves($1::timestamptz)", SqlTime(now));
  return absl::OkStatus();
}

absl::Status ConfirmDetachesOnly(pqxx::work& txn, const std::string& node_id,
                                 const std::string& instance_id,
                                 const std::vector<ReportedMount>& mounted, absl::Time now) {
  std::vector<std::string> volumes;
  for (const auto& m : mounted) volumes.push_back(m.volume_id);
  txn.exec_params(
      "UPDATE volume_attachments SET confirmed_nodes = array_append(confirmed_nodes, $2) "
      "WHERE instance_id = $1 AND NOT ($2 = ANY(confirmed_nodes)) AND state = 'detaching' "
      "AND NOT (volume_id = ANY($3::text[]))",
      instance_id, node_id, TextArrayLiteral(volumes));
  txn.exec_params(
      "DELETE FROM volume_attachments WHERE instance_id = $1 AND state = 'detaching' AND "
      "cardinality(fenced_nodes) = 0 AND NOT EXISTS (SELECT 1 FROM gpu_reservations r WHERE r.instance_id = $1 "
      "AND NOT (r.node_id = ANY(confirmed_nodes)))",
      instance_id);
  txn.exec_params("SELECT volumes_complete_moves($1::timestamptz)", SqlTime(now));
  return absl::OkStatus();
}

absl::Status SetNodeNetwork(pqxx::work& txn, const std::string& node_id,
                            const std::string& address, int port_min, int port_max) {
  if (port_min != 0 || port_max != 0) {
    if (port_min < 1024 || port_max > 65535 || port_min > port_max) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PORT_RANGE",
                   "node ports must be a range within 1024..65535");
    }
    // A node holds at most one instance per GPU, each with at most
    // kInstancePortsMax ports; a range that holds them all means a port
    // allocation can never come up short, so no declared port is dropped.
    if (port_max - port_min + 1 < kNodePortsMin) {
      return Error(absl::StatusCode::kInvalidArgument, "INVALID_PORT_RANGE",
                   absl::StrCat("a node's port range must hold at least ", kNodePortsMin,
                                " ports (8 instances x ", kInstancePortsMax, ")"));
    }
    txn.exec_params("UPDATE nodes SET node_port_min = $2, node_port_max = $3 WHERE id = $1",
                    node_id, port_min, port_max);
  }
  txn.exec_params("UPDATE nodes SET address = $2 WHERE id = $1", node_id, address);
  return absl::OkStatus();
}

}  // namespace sv::store
