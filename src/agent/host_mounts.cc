#include "agent/host_mounts.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

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

// An owned file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  // Gives up ownership (to fdopendir, say).
  int Release() { return std::exchange(fd_, -1); }
  // The path the kernel resolves to exactly this file, for mount(2) and
  // umount2(2), which take paths.
  std::string ProcPath() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_;
};

absl::Status UnsafePath(const std::string& dir, const std::string& rel, int err) {
  return Error(absl::StatusCode::kFailedPrecondition, "MOUNT_FAILED",
               absl::StrCat("open ", dir, "/", rel, ": ",
                            err == ELOOP || err == ENOTDIR
                                ? "a part of the path is a symbolic link or not a directory"
                                : std::strerror(err)));
}

// Opens `rel` beneath `dir` as an O_PATH descriptor of a directory without
// following a symbolic link in any part of it; with `create`, missing
// parts are made as it goes. `dir` is the instance's directory, which the
// container sees as its /mnt and can fill with symlinks to anywhere on the
// host: every path below it is reached this way, never by name, so no
// mount, mkdir or rmdir of the agent (root, in the host's namespace) ever
// lands outside it.
// `failed_errno`, if given, gets the errno of a failure.
absl::StatusOr<Fd> OpenBeneath(const std::string& dir, const std::string& rel, bool create,
                               int* failed_errno = nullptr) {
  auto fail = [&](const std::string& what, int err) {
    if (failed_errno != nullptr) *failed_errno = err;
    return UnsafePath(dir, what, err);
  };
  Fd fd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return fail("", errno);
  if (rel.empty()) return fd;
  for (absl::string_view part_view : absl::StrSplit(rel, '/')) {
    const std::string part(part_view);
    if (part.empty() || part == "." || part == "..") return fail(rel, EINVAL);
    if (create && ::mkdirat(fd.get(), part.c_str(), 0755) != 0 && errno != EEXIST) {
      return fail(rel, errno);
    }
    Fd next(::openat(fd.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0) return fail(rel, errno);
    struct stat st;
    if (::fstat(next.get(), &st) != 0 || !S_ISDIR(st.st_mode)) return fail(rel, ENOTDIR);
    fd = std::move(next);
  }
  return fd;
}

// Unmounts the mount at `rel` beneath `dir`, reached as OpenBeneath does.
absl::Status UnmountBeneath(const std::string& dir, const std::string& rel) {
  int err = 0;
  auto fd = OpenBeneath(dir, rel, false, &err);
  if (!fd.ok()) {
    // Gone already (ENOENT) is done; a symlink in the way is not.
    if (err == ENOENT) return absl::OkStatus();
    return fd.status();
  }
  if (::umount2(fd->ProcPath().c_str(), MNT_DETACH) != 0 && errno != EINVAL) {
    return MountError("unmount", dir + "/" + rel, errno);
  }
  return absl::OkStatus();
}

// Removes the directory `rel` beneath `dir` if it is empty.
void RemoveEmptyBeneath(const std::string& dir, const std::string& rel) {
  const size_t slash = rel.rfind('/');
  const std::string parent = slash == std::string::npos ? "" : rel.substr(0, slash);
  const std::string name = slash == std::string::npos ? rel : rel.substr(slash + 1);
  auto fd = OpenBeneath(dir, parent, false);
  if (fd.ok()) (void)::unlinkat(fd->get(), name.c_str(), AT_REMOVEDIR);  // Only if empty.
}

// Removes the empty directories inside the directory open as `fd`, deepest
// first, never following a symbolic link; returns whether it is now empty.
bool RemoveEmptyInside(int fd) {
  Fd read(::openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (read.get() < 0) return false;
  DIR* listing = ::fdopendir(read.get());
  if (listing == nullptr) return false;
  (void)read.Release();  // The listing owns it now.
  std::vector<std::string> dirs;
  bool others = false;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    if (entry->d_type == DT_DIR) {
      dirs.push_back(name);
    } else {
      others = true;  // Files and symlinks stay (and keep their parent).
    }
  }
  ::closedir(listing);
  for (const std::string& name : dirs) {
    Fd child(::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (child.get() >= 0 && RemoveEmptyInside(child.get()) &&
        ::unlinkat(fd, name.c_str(), AT_REMOVEDIR) == 0) {
      continue;
    }
    others = true;
  }
  return !others;
}

size_t Depth(const std::string& rel) {
  return rel.empty() ? 0 : 1 + std::count(rel.begin(), rel.end(), '/');
}

// Removes empty directories under (and including) `dir`, deepest first.
// Never removes a file, so nothing a failed unmount left visible is lost,
// and never follows a symbolic link.
void RemoveEmptyDirs(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) return;
  if (RemoveEmptyInside(fd.get())) (void)::rmdir(dir.c_str());
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
    SV_RETURN_IF_ERROR(UnmountBeneath(dir, rel));
    known.erase(rel);
    RemoveEmptyBeneath(dir, rel);
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
    std::error_code ec;
    // As `docker run -v` does, a missing source directory is created (the
    // source is the agent's own volume directory).
    fs::create_directories(v.source, ec);
    auto target = OpenBeneath(dir, rel, true);
    if (!target.ok()) {
      status = target.status();
      break;
    }
    status = BindInto(v, target->ProcPath(), dir + "/" + rel);
    if (!status.ok()) break;
    done.push_back(rel);
    known[rel] = v;
  }
  if (!status.ok()) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {
      (void)UnmountBeneath(dir, *it);
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
absl::Status HostMounts::BindInto(const VolumeMap& v, const std::string& path,
                               const std::string& shown) {
  if (!v.read_only) {
    if (::mount(v.source.c_str(), path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return MountError("bind " + v.source + " on", shown, errno);
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
      status = MountError("bind " + staging + " on", shown, errno);
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
  for (const std::string& rel : current) SV_RETURN_IF_ERROR(UnmountBeneath(dir, rel));
  mounted_.erase(instance_id);
  if (!MountedPaths(instance_id).empty()) {
    return Error(absl::StatusCode::kFailedPrecondition, "MOUNT_FAILED",
                 absl::StrCat("mounts remain under ", dir));
  }
  RemoveEmptyDirs(dir);
  return absl::OkStatus();
}

}  // namespace sv::agent
