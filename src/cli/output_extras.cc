#include <ostream>

#include "absl/strings/match.h"
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
  for (const auto& p : i.ports()) {
    // ssh://root@host:port (host in brackets when IPv6) -> the ssh command.
    constexpr absl::string_view kScheme = "ssh://root@";
    const absl::string_view url = p.url();
    const size_t colon = url.rfind(':');
    if (!absl::StartsWith(url, kScheme) || colon <= kScheme.size()) continue;
    absl::string_view host = url.substr(kScheme.size(), colon - kScheme.size());
    if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
      host = host.substr(1, host.size() - 2);
    }
    rows.push_back({"ssh:", absl::StrCat("ssh -p ", url.substr(colon + 1), " root@", host)});
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
