#include <ostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/output.h"

namespace sv::cli {

void PrintInstanceExtras(const v1::Instance& i, std::ostream& out) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& p : i.ports()) {
    rows.push_back({"port:", absl::StrCat(p.container_port(), "/", p.protocol(), " -> ",
                                          p.url().empty() ? "(not placed yet)" : p.url())});
  }
  for (const auto& m : i.library_mounts()) rows.push_back({"mount:", "/public/" + m + " (ro)"});
  if (i.volume_ids_size() > 0) rows.push_back({"volumes:", absl::StrJoin(i.volume_ids(), ", ")});
  if (!i.app_image_id().empty()) rows.push_back({"app:", i.app_image_id()});
  if (i.movable()) rows.push_back({"movable:", "yes (svd may restart it on another node)"});
  if (rows.empty()) return;
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r[0].size());
  for (const auto& r : rows) {
    out << r[0] << std::string(width + 1 - r[0].size(), ' ') << r[1] << "\n";
  }
}

}  // namespace sv::cli
