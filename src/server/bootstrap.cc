#include "server/bootstrap.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "api/api_keys.h"
#include "common/ids.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace sv::server {
namespace fs = std::filesystem;

namespace {
constexpr char kWrittenBy[] = "svd --dev";
}  // namespace

namespace {

// Writes `content` to `path` readable by its owner only from the moment it
// exists: created 0600 (and made 0600 if it was there), not written with
// the umask's mode and chmod'ed after, which left a key readable by any
// local user who opened it in between (permissions are checked at open).
absl::Status WritePrivateFile(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  bool ok = ::fchmod(fd, 0600) == 0;
  for (size_t done = 0; ok && done < content.size();) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ::close(fd) == 0 && ok;
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

}  // namespace

absl::StatusOr<std::string> EnsureKeyFromFile(store::Store& store, const Clock& clock,
                                              const std::string& path,
                                              const std::string& tenant_name,
                                              const std::string& email, store::Role role) {
  std::string plaintext;
  if (fs::exists(path)) {
    std::ifstream in(path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    plaintext = std::string(absl::StripAsciiWhitespace(buffer.str()));
  } else {
    std::error_code ec;
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
    plaintext = api::NewApiKey().plaintext;
    SV_RETURN_IF_ERROR(WritePrivateFile(path, plaintext + "\n"));
    spdlog::info("server: wrote a new API key for {} to {}", email, path);
  }
  auto parsed = api::ParseApiKey(plaintext);
  if (!parsed) {
    return Error(absl::StatusCode::kFailedPrecondition, "BAD_KEY_FILE",
                 absl::StrCat(path, " does not hold an sv API key"));
  }
  std::string salt, secret_hash;
  api::HashKey(parsed->secret, &salt, &secret_hash);
  SV_RETURN_IF_ERROR(store.EnsureTenantWithKey(
      {tenant_name, email, role, parsed->key_id, salt, secret_hash}, clock.Now()));
  return plaintext;
}

absl::Status RegisterSimulatedFleet(store::Store& store, const Clock& clock, int count,
                                    int leaves, int pods) {
  leaves = std::max(1, leaves);
  pods = std::max(1, std::min(pods, leaves));
  const int per_leaf = (count + leaves - 1) / leaves;
  const int leaves_per_pod = (leaves + pods - 1) / pods;
  for (int i = 0; i < count; ++i) {
    int leaf = i / per_leaf;
    store::NodeRecord node;
    node.name = absl::StrFormat("sim-node-%03d", i);
    node.zone = "sim-zone-a";
    node.pod = absl::StrCat("pod-", leaf / leaves_per_pod);
    node.leaf_switch = absl::StrCat("leaf-", leaf);
    node.gpu_model = "RTX 4090";
    node.gpu_count = 8;
    node.simulated = true;
    SV_RETURN_IF_ERROR(store.UpsertNode(node, clock.Now()));
  }
  spdlog::info("server: simulated fleet of {} nodes x 8 RTX 4090 on {} leaf switches", count,
               leaves);
  return absl::OkStatus();
}

std::string DefaultSvctlConfigPath() {
  const char* xdg = std::getenv("XDG_CONFIG_HOME");
  if (xdg != nullptr && *xdg != '\0') return absl::StrCat(xdg, "/svctl/config.json");
  const char* home = std::getenv("HOME");
  return absl::StrCat(home != nullptr ? home : ".", "/.config/svctl/config.json");
}

absl::Status WriteSvctlConfig(const std::string& path, const std::string& endpoint,
                              const std::string& token, const std::string& admin_token) {
  if (fs::exists(path)) {
    std::ifstream in(path);
    nlohmann::json existing = nlohmann::json::parse(in, nullptr, false);
    if (existing.is_discarded() || existing.value("written_by", "") != kWrittenBy) {
      spdlog::warn("server: leaving {} alone (not written by svd --dev); use "
                   "SVCTL_ENDPOINT={} and the key in the state folder",
                   path, endpoint);
      return absl::OkStatus();
    }
  }
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  nlohmann::json config = {{"endpoint", endpoint},
                           {"token", token},
                           {"admin_token", admin_token},
                           {"written_by", kWrittenBy}};
  const std::string tmp = path + ".tmp";
  SV_RETURN_IF_ERROR(WritePrivateFile(tmp, config.dump(2) + "\n"));
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot write ", path, ": ", ec.message()));
  spdlog::info("server: svctl is configured in {}", path);
  return absl::OkStatus();
}

}  // namespace sv::server
