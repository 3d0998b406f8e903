#ifndef SV_STORE_INSTANCE_EVENTS_H_
#define SV_STORE_INSTANCE_EVENTS_H_

#include <string>

#include <pqxx/transaction>

#include "absl/time/time.h"

namespace sv::store {

// Appends a transition to the instance's history (instance_events) in the
// caller's transaction, as a prepared statement.
void RecordEvent(pqxx::work& txn, const std::string& instance_id, absl::Time at,
                 const std::string& from, const std::string& to, const std::string& reason);

}  // namespace sv::store

#endif  // SV_STORE_INSTANCE_EVENTS_H_
