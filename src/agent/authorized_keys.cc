#include "agent/authorized_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace sv::agent {
namespace {

namespace fs = std::filesystem;

absl::Status WriteFailed(const std::string& path, const char* what) {
  return Error(absl::StatusCode::kInternal, "AUTHORIZED_KEYS_WRITE_FAILED",
               absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteInPlace(const std::string& path, const std::vector<std::string>& keys,
                          int extra_flags) {
  std::string text = "# Written by svagent: the tenant's SSH keys (svctl ssh-keys).\n";
  for (const auto& k : keys) absl::StrAppend(&text, k, "\n");
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC | extra_flags, 0600);
  if (fd < 0) return WriteFailed(path, "open");
  // Truncating keeps the inode: a container's bind mount of the file sees
  // the new content.
  bool ok = ftruncate(fd, 0) == 0 && fchmod(fd, 0600) == 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  ok = ok && fsync(fd) == 0;
  const int saved = errno;
  close(fd);
  errno = saved;
  return ok ? absl::OkStatus() : WriteFailed(path, "write");
}

// svd's ids are "ins-..."; anything that could leave the root is refused.
absl::Status CheckId(const std::string& instance_id) {
  if (instance_id.empty() || instance_id.find('/') != std::string::npos ||
      instance_id.front() == '.') {
    return Error(absl::StatusCode::kInvalidArgument, "INVALID_INSTANCE_ID",
                 absl::StrCat("instance id \"", instance_id.substr(0, 64), "\" is not a file name"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string AuthorizedKeysFiles::PathOf(const std::string& instance_id) const {
  return absl::StrCat(root_, "/", instance_id, "/authorized_keys");
}

absl::StatusOr<std::string> AuthorizedKeysFiles::Write(
    const std::string& instance_id, const std::vector<std::string>& keys) const {
  SV_RETURN_IF_ERROR(CheckId(instance_id));
  const std::string dir = absl::StrCat(root_, "/", instance_id);
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return Error(absl::StatusCode::kInternal, "AUTHORIZED_KEYS_WRITE_FAILED",
                 absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  chmod(dir.c_str(), 0700);
  const std::string path = PathOf(instance_id);
  SV_RETURN_IF_ERROR(WriteInPlace(path, keys, O_CREAT));
  return path;
}

absl::Status AuthorizedKeysFiles::Update(const std::string& instance_id,
                                         const std::vector<std::string>& keys) const {
  SV_RETURN_IF_ERROR(CheckId(instance_id));
  const std::string path = PathOf(instance_id);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return Error(absl::StatusCode::kFailedPrecondition, "NO_AUTHORIZED_KEYS_FILE",
                 "the instance was started without SSH keys; keys added since apply at its "
                 "next start");
  }
  return WriteInPlace(path, keys, 0);
}

void AuthorizedKeysFiles::Remove(const std::string& instance_id) const {
  if (!CheckId(instance_id).ok()) return;
  std::error_code ignored;
  fs::remove_all(absl::StrCat(root_, "/", instance_id), ignored);
}

}  // namespace sv::agent
