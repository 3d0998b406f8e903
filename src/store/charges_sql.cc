#include "store/charges_sql.h"

#include "absl/strings/str_cat.h"

namespace sv::store {

std::string TenantChargesSql(const std::string& tenant_id, const std::string& lo,
                             const std::string& hi) {
  return absl::StrCat("sv_tenant_charges((", tenant_id, ")::text, (", lo, ")::bigint, (", hi,
                      ")::bigint)");
}

std::string TenantSpentSinceSql(const std::string& tenant_id, const std::string& since_minute) {
  return absl::StrCat("sv_tenant_spent_since((", tenant_id, ")::text, (", since_minute,
                      ")::bigint)");
}

}  // namespace sv::store
