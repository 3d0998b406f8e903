#ifndef SV_STORE_SLA_STORE_H_
#define SV_STORE_SLA_STORE_H_

// PostgreSQL side of the SLA monitor (docs/sla.md): checkpoints of open
// instance-hours, judged windows with their evidence and verdicts, the
// judgement cursor, per-tenant overrides and the operators' report.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <memory>
#include <pqxx/pqxx>
#include <pqxx/stream_to>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"

namespace sv::store {

struct SlaCheckpoint {
  std::string instance_id;
  absl::Time hour_start;
  int gpu_count = 0;
  std::string evidence;  // Serialized SlaWindowEvidence.
  std::string replica;
};

// One instance-hour that carried rent, read from the ledger's charges.
struct SlaRent {
  std::string instance_id;
  std::string tenant_id;
  int64_t rent_micros = 0;
  int64_t trial_rent_micros = 0;  // The part of rent_micros paid from trial credit.
  int64_t first_minute = 0;  // Unix minutes charged, first and last.
  int64_t last_minute = 0;
  // The hour's charged minutes and its neighbours, as sla::MinuteBits.
  uint64_t charged_minutes = 0;
  int gpu_count = 1;         // The instance's size now (no evidence: silent).
};

struct SlaOverrideRow {
  std::string tenant_id;
  std::string metric;
  std::string aggregation;
  std::string comparison;
  int64_t threshold = 0;
  int32_t refund_basis_points = 0;
};

struct SlaWindowRow {
  std::string instance_id;
  std::string tenant_id;
  absl::Time hour_start;
  int gpu_count = 0;
  absl::Time billed_from;
  absl::Time billed_to;
  // The charged minutes judged, as sla::MinuteBits; for rows judged before
  // migration 0100, the minutes of [billed_from, billed_to).
  uint64_t charged_minutes = 0;
  int64_t rent_micros = 0;
  std::string evidence;
  std::string verdicts_json;  // [{metric, ..., breached, refund_micros, refund_key, ...}]
  std::vector<std::string> breached_metrics;
  int64_t refund_micros_total = 0;
  std::vector<std::string> node_names;
  int64_t late_samples_ignored = 0;
  absl::Time judged_at;
};

struct SlaReportRow {
  std::string key;
  int64_t breaches = 0;
  int64_t refund_micros = 0;
};

struct SlaReport {
  int64_t windows_judged = 0;
  int64_t windows_breached = 0;
  int64_t refunded_micros_total = 0;
  int64_t late_samples_ignored = 0;
  std::vector<SlaReportRow> by_metric;
  std::vector<SlaReportRow> by_node;
  std::vector<SlaReportRow> by_leaf_switch;
};

class SlaStore {
 public:
  explicit SlaStore(Database& db) : db_(db) {}

  // ---- Checkpoints ---------------------------------------------------------
  // Upserts this replica's windows (each row replaces the previous one).
  absl::Status WriteCheckpoints(const std::string& replica,
                                const std::vector<SlaCheckpoint>& rows, absl::Time now);
  absl::StatusOr<std::vector<SlaCheckpoint>> LoadCheckpoints(const std::string& replica);
  // Every replica's checkpoint of one instance-hour.
  absl::StatusOr<std::vector<SlaCheckpoint>> CheckpointsOf(const std::string& instance_id,
                                                           absl::Time hour_start);
  // The hours any replica holds a checkpoint of for the instance, oldest first.
  absl::StatusOr<std::vector<absl::Time>> CheckpointHoursOf(const std::string& instance_id);
  // Adds late samples to judged windows (those not judged yet keep them in
  // their evidence).
  absl::Status AddLateSamples(
      const std::map<std::pair<std::string, absl::Time>, int64_t>& counts);

  // ---- Overrides -----------------------------------------------------------
  // Replaces the tenant's overrides; NOT_FOUND / UNKNOWN_TENANT.
  absl::Status SetOverrides(const std::string& tenant_id,
                            const std::vector<SlaOverrideRow>& rows, absl::Time now);
  absl::StatusOr<std::vector<SlaOverrideRow>> Overrides(const std::string& tenant_id);

  // ---- Reading -------------------------------------------------------------
  // The instance's tenant and size, if it exists.
  absl::StatusOr<std::optional<std::pair<std::string, int>>> InstanceOwner(
      const std::string& instance_id);
  absl::StatusOr<std::optional<SlaWindowRow>> GetWindow(const std::string& instance_id,
                                                        absl::Time hour_start);
  // Newest first, hours before `before`.
  absl::StatusOr<std::vector<SlaWindowRow>> ListWindows(const std::string& instance_id,
                                                        absl::Time before, int limit);
  absl::StatusOr<SlaReport> Report(absl::Time from, absl::Time to);
  // The instance's minute charges in the hour so far (gpu_count left at 1);
  // nullopt when none is charged yet.
  absl::StatusOr<std::optional<SlaRent>> RentOf(const std::string& instance_id,
                                                absl::Time hour_start);
  absl::StatusOr<std::optional<absl::Time>> JudgedBefore();
  // Every minute before this is billed (billing_cursor); nullopt before the
  // first metering run.
  absl::StatusOr<std::optional<absl::Time>> BilledBefore();

  // ---- Judgement, in the caller's transaction ------------------------------
  // The cursor, locked for this judgement (one judge at a time).
  static std::optional<absl::Time> LockCursor(pqxx::work& txn);
  static void SetCursor(pqxx::work& txn, absl::Time judged_before, absl::Time now);
  static std::vector<SlaRent> ReadRents(pqxx::work& txn, absl::Time hour_start);
  // ReadRents before the minutes around a stop are left out.
  static std::vector<SlaRent> ReadChargedRents(pqxx::work& txn, absl::Time hour_start);
  // Other replicas' checkpoints of the hour (this one's is in memory).
  static std::vector<SlaCheckpoint> ReadCheckpointsOfHour(pqxx::work& txn,
                                                          absl::Time hour_start,
                                                          const std::string& except_replica);
  static std::vector<SlaOverrideRow> ReadAllOverrides(pqxx::work& txn);
  // Instances of the hour already judged (a rerun skips them).
  static std::vector<std::string> JudgedInstances(pqxx::work& txn, absl::Time hour_start);
  // Nodes where the instances hold GPUs now (for windows without evidence).
  static std::map<std::string, std::vector<std::string>> ReservedNodes(
      pqxx::work& txn, const std::vector<std::string>& instance_ids);
  // Writes window records with COPY as they are made. The judge holds the
  // cursor lock and skips judged instance-hours, so no row conflicts.
  class WindowWriter {
   public:
    explicit WindowWriter(pqxx::work& txn);
    void Write(const SlaWindowRow& row);
    void Complete();

   private:
    std::unique_ptr<pqxx::stream_to> stream_;
  };
  static void DeleteCheckpointsBefore(pqxx::work& txn, absl::Time before);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_SLA_STORE_H_
