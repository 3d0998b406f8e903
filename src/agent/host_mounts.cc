#include "agent/host_mounts.h"

#include <sys/mount.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace sv::agent {
namespace {

namespace fs = std::filesystem;

absl::Status MountError(const std::string& what, const std::string& path, int err) {
  return Error(absl::StatusCode::kFailedPrecondition, "MOUNT_FAILED",
               absl::StrCat(what, " ", path, ": ", std::strerror(err)));
}

// /proc/self/mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    auto digit = [&](size_t k) { return in[k] >= '0' && in[k] <= '7'; };
    if (in[i] == '\\' && i + 3 < in.size() && digit(i + 1) && digit(i + 2) && digit(i + 3)) {
      out.push_back(static_cast<char>(std::stoi(in.substr(i + 1, 3), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(in[i]);
    }
  }
  return out;
}

size_t Depth(const std::string& rel) {
  return rel.empty() ? 0 : 1 + std::count(rel.begin(), rel.end(), '/');
}

// Removes empty directories under (and including) `dir`, deepest first.
// Never removes a file, so nothing a failed unmount left visible is lost.
void RemoveEmptyDirs(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_directory(ec) && !entry.is_symlink(ec)) RemoveEmptyDirs(entry.path());
  }
  fs::remove(dir, ec);  // Fails harmlessly on a non-empty directory.
}

}  // namespace

std::optional<std::string> HostMounts::HotPath(const std::string& target) {
  const std::string prefix = std::string(kHotMountTarget) + "/";
  if (!absl::StartsWith(target, prefix)) return std::nullopt;
  std::string rel = target.substr(prefix.size());
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  if (rel.empty()) return std::nullopt;
  for (absl::string_view part : absl::StrSplit(rel, '/')) {
    if (part.empty() || part == "." || part == "..") return std::nullopt;
  }
  return rel;
}

std::vector<std::string> HostMounts::MountedPaths(const std::string& instance_id) const {
  const std::string dir = DirOf(instance_id);
  std::set<std::string> paths;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point;
    if (!(fields >> id >> parent >> device >> root >> mount_point)) continue;
    mount_point = Unescape(mount_point);
    if (mount_point == dir) {
      paths.insert("");
    } else if (absl::StartsWith(mount_point, dir + "/")) {
      paths.insert(mount_point.substr(dir.size() + 1));
    }
  }
  return {paths.begin(), paths.end()};
}

absl::StatusOr<std::string> HostMounts::Prepare(const std::string& instance_id) {
  const std::string dir = DirOf(instance_id);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return Error(absl::StatusCode::kFailedPrecondition, "MOUNT_FAILED",
                 absl::StrCat("create ", dir, ": ", ec.message()));
  }
  std::vector<std::string> mounted = MountedPaths(instance_id);
  if (std::find(mounted.begin(), mounted.end(), "") == mounted.end()) {
    if (::mount(dir.c_str(), dir.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return MountError("bind", dir, errno);
    }
  }
  // Shared, so that mounts made under it later reach the container's rslave
  // copy of it.
  if (::mount(nullptr, dir.c_str(), nullptr, MS_SHARED | MS_REC, nullptr) != 0) {
    return MountError("make shared", dir, errno);
  }
  return dir;
}

absl::Status HostMounts::Apply(const std::string& instance_id,
                               const std::vector<VolumeMap>& hot) {
  std::map<std::string, VolumeMap> want;
  for (const VolumeMap& v : hot) {
    std::optional<std::string> rel = HotPath(v.target);
    if (!rel) {
      return Error(absl::StatusCode::kInvalidArgument, "MOUNT_PATH_NOT_HOT",
                   absl::StrCat(v.target, " is not under ", kHotMountTarget));
    }
    if (!want.emplace(*rel, v).second) {
      return Error(absl::StatusCode::kInvalidArgument, "MOUNT_PATH_TWICE",
                   absl::StrCat(v.target, " is mounted twice"));
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  SV_ASSIGN_OR_RETURN(const std::string dir, Prepare(instance_id));
  std::map<std::string, VolumeMap>& known = mounted_[instance_id];

  // Unmount what is not wanted, or wanted differently; deepest first.
  std::vector<std::string> current = MountedPaths(instance_id);
  std::erase(current, std::string());
  std::sort(current.begin(), current.end(), [](const std::string& a, const std::string& b) {
    return Depth(a) > Depth(b);
  });
  std::set<std::string> kept;
  for (const std::string& rel : current) {
    auto w = want.find(rel);
    auto k = known.find(rel);
    // A mount point found without a record (the agent restarted) is taken
    // to be what is wanted there, as the agent takes a running instance to
    // have the mounts svd last asked for.
    const bool same = w != want.end() && (k == known.end() || k->second == w->second);
    if (same) {
      kept.insert(rel);
      continue;
    }
    const std::string path = dir + "/" + rel;
    if (::umount2(path.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
      return MountError("unmount", path, errno);
    }
    known.erase(rel);
    std::error_code ec;
    fs::remove(path, ec);  // Only if empty.
  }

  // Mount what is missing; shallowest first, so nested targets land on top.
  std::vector<std::pair<std::string, VolumeMap>> add;
  for (const auto& [rel, v] : want) {
    if (!kept.count(rel)) add.emplace_back(rel, v);
  }
  std::sort(add.begin(), add.end(),
            [](const auto& a, const auto& b) { return Depth(a.first) < Depth(b.first); });
  std::vector<std::string> done;
  absl::Status status;
  for (const auto& [rel, v] : add) {
    const std::string path = dir + "/" + rel;
    std::error_code ec;
    // As `docker run -v` does, a missing source directory is created.
    fs::create_directories(v.source, ec);
    fs::create_directories(path, ec);
    if (ec) {
      status = Error(absl::StatusCode::kFailedPrecondition, "MOUNT_FAILED",
                     absl::StrCat("create ", path, ": ", ec.message()));
      break;
    }
    status = BindInto(v, path);
    if (!status.ok()) break;
    done.push_back(rel);
    known[rel] = v;
  }
  if (!status.ok()) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      const std::string path = dir + "/" + *it;
      (void)::umount2(path.c_str(), MNT_DETACH);
      known.erase(*it);
    }
  }
  return status;
}

// Read-only is a flag of each mount, and a remount does not propagate: a
// volume made read-only after it reached the container would stay writable
// there. So a read-only volume is bound and made read-only at a private
// staging point first, and that read-only mount is what gets bound under
// the shared directory (a bind copies the flag, and so does propagation).
absl::Status HostMounts::BindInto(const VolumeMap& v, const std::string& path) {
  if (!v.read_only) {
    if (::mount(v.source.c_str(), path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return MountError("bind " + v.source + " on", path, errno);
    }
    return absl::OkStatus();
  }
  const std::string staging = absl::StrCat(root_, "/.staging/", ++staging_seq_);
  std::error_code ec;
  fs::create_directories(staging, ec);
  if (ec) {
    return Error(absl::StatusCode::kFailedPrecondition, "MOUNT_FAILED",
                 absl::StrCat("create ", staging, ": ", ec.message()));
  }
  absl::Status status;
  if (::mount(v.source.c_str(), staging.c_str(), nullptr, MS_BIND, nullptr) != 0) {
    status = MountError("bind " + v.source + " on", staging, errno);
  } else {
    if (::mount(nullptr, staging.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) !=
        0) {
      status = MountError("make read-only", staging, errno);
    } else if (::mount(staging.c_str(), path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      status = MountError("bind " + staging + " on", path, errno);
    }
    (void)::umount2(staging.c_str(), MNT_DETACH);
  }
  fs::remove(staging, ec);
  return status;
}

absl::Status HostMounts::Release(const std::string& instance_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string dir = DirOf(instance_id);
  std::vector<std::string> current = MountedPaths(instance_id);
  std::sort(current.begin(), current.end(), [](const std::string& a, const std::string& b) {
    return Depth(a) > Depth(b);
  });
  for (const std::string& rel : current) {
    const std::string path = rel.empty() ? dir : dir + "/" + rel;
    if (::umount2(path.c_str(), MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT) {
      return MountError("unmount", path, errno);
    }
  }
  mounted_.erase(instance_id);
  if (!MountedPaths(instance_id).empty()) {
    return Error(absl::StatusCode::kFailedPrecondition, "MOUNT_FAILED",
                 absl::StrCat("mounts remain under ", dir));
  }
  RemoveEmptyDirs(dir);
  return absl::OkStatus();
}

}  // namespace sv::agent
