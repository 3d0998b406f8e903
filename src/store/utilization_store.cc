#include "store/utilization_store.h"

#include <pqxx/pqxx>

#include "store/sql_arrays.h"

namespace sv::store {

absl::Status UtilizationStore::Add(const std::string& flush_key,
                                   const std::vector<NodeUtilizationDelta>& deltas,
                                   absl::Time keep_from, absl::Time now) {
  std::vector<std::string> names;
  std::vector<int64_t> hours, sums, counts;
  for (const NodeUtilizationDelta& d : deltas) {
    if (d.sum.sample_count <= 0) continue;
    names.push_back(d.node_name);
    hours.push_back(absl::ToUnixSeconds(d.hour));
    sums.push_back(d.sum.utilization_sum);
    counts.push_back(d.sum.sample_count);
  }
  return db_.Transact([&](pqxx::work& txn) {
    const bool fresh =
        txn.exec_params("INSERT INTO node_utilization_flushes (flush_key, applied_at) "
                        "VALUES ($1, $2::timestamptz) ON CONFLICT DO NOTHING",
                        flush_key, SqlTime(now))
            .affected_rows() == 1;
    if (fresh && !names.empty()) {
      txn.exec_params(R"sql(
INSERT INTO node_gpu_utilization_hourly AS t (node_name, hour, utilization_sum, sample_count)
SELECT name, to_timestamp(hour), s, c
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS d(name, hour, s, c)
ON CONFLICT (node_name, hour) DO UPDATE
  SET utilization_sum = t.utilization_sum + EXCLUDED.utilization_sum,
      sample_count = t.sample_count + EXCLUDED.sample_count
)sql",
                      TextArrayLiteral(names), IntArrayLiteral(hours), IntArrayLiteral(sums),
                      IntArrayLiteral(counts));
    }
    txn.exec_params("DELETE FROM node_gpu_utilization_hourly WHERE hour < $1::timestamptz",
                    SqlTime(keep_from));
    txn.exec_params("DELETE FROM node_utilization_flushes WHERE applied_at < $1::timestamptz",
                    SqlTime(now - absl::Hours(24)));
    return absl::OkStatus();
  });
}

absl::StatusOr<std::map<std::string, UtilizationSum>> UtilizationStore::ByNode(absl::Time from,
                                                                                absl::Time to) {
  std::map<std::string, UtilizationSum> out;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    out.clear();
    for (const auto& row : txn.exec_params(
             "SELECT node_name, sum(utilization_sum)::bigint, sum(sample_count)::bigint "
             "FROM node_gpu_utilization_hourly "
             "WHERE hour >= $1::timestamptz AND hour < $2::timestamptz GROUP BY node_name",
             SqlTime(from), SqlTime(to))) {
      out[row[0].as<std::string>()] = {row[1].as<int64_t>(), row[2].as<int64_t>()};
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<UtilizationPoint>> UtilizationStore::Series(absl::Time from,
                                                                        absl::Time to) {
  std::vector<UtilizationPoint> out;
  absl::Status status = db_.Transact([&](pqxx::work& txn) {
    out.clear();
    for (const auto& row : txn.exec_params(
             "SELECT extract(epoch FROM hour)::bigint, sum(utilization_sum)::bigint, "
             "sum(sample_count)::bigint FROM node_gpu_utilization_hourly "
             "WHERE hour >= $1::timestamptz AND hour < $2::timestamptz "
             "GROUP BY hour ORDER BY hour",
             SqlTime(from), SqlTime(to))) {
      out.push_back({absl::FromUnixSeconds(row[0].as<int64_t>()),
                     {row[1].as<int64_t>(), row[2].as<int64_t>()}});
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

}  // namespace sv::store
