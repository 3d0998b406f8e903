// Runtime drivers: docker against a fake docker executable that records its
// arguments, and the process driver with real local processes.

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/host_mounts.h"
#include "agent/runtime_driver.h"

namespace sv::agent {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "sv-agent-unit-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fake docker: appends its arguments, one per line and a "--" line after
// each call, to calls.txt; `ps` prints a canned listing.
std::string WriteFakeDocker(const std::string& dir) {
  const std::string path = dir + "/docker";
  std::ofstream(path) << "#!/bin/sh\n"
                      << "for a in \"$@\"; do printf '%s\\n' \"$a\" >> " << dir
                      << "/calls.txt; done\n"
                      << "echo -- >> " << dir << "/calls.txt\n"
                      << "if [ \"$1\" = ps ]; then\n"
                      << "  printf 'sv-ins-aaa\\trunning\\tUp 5 minutes\\n'\n"
                      << "  printf 'sv-ins-bbb\\texited\\tExited (3) 2 seconds ago\\n'\n"
                      << "  printf 'unrelated\\trunning\\tUp 1 hour\\n'\n"
                      << "fi\n";
  chmod(path.c_str(), 0755);
  return path;
}

// Goal: `docker run` gets the GPUs as a quoted device list, the ports and the
// volumes, in the shape docker documents.
TEST(DockerDriverTest, RunArgumentsCarryGpusPortsAndVolumes) {
  TempDir dir;
  auto driver = NewDockerDriver(WriteFakeDocker(dir.path()));
  RuntimeInstance instance{"ins-abc", {0, 1, 5}, "sv/ubuntu:22.04",
                           {{"/data/vol-1", "/data", false}, {"/models", "/models", true}},
                           {{8080, 80, "tcp"}, {6000, 6000, "udp"}}};
  ASSERT_TRUE(driver->Start(instance).ok());
  EXPECT_EQ(Slurp(dir.path() + "/calls.txt"),
            "run\n-d\n--name\nsv-ins-abc\n--label\nsv.instance=ins-abc\n--gpus\n"
            "\"device=0,1,5\"\n-p\n8080:80/tcp\n-p\n6000:6000/udp\n-v\n/data/vol-1:/data\n"
            "-v\n/models:/models:ro\nsv/ubuntu:22.04\n--\n");
}

// Goal: an instance started with the tenant's SSH keys gets them in a 0600
// file bound read-only at /root/.ssh/authorized_keys; a change rewrites the
// same file (same inode, so the running container's bind shows it), and
// Stop removes it. One started without keys gets no bind (the image's own
// keys stay) and says a later key applies at its next start.
TEST(DockerDriverTest, SshKeysAreBoundAndFollowChanges) {
  TempDir dir;
  const std::string keys_root = dir.path() + "/ssh-keys";
  auto driver = NewDockerDriver(WriteFakeDocker(dir.path()), "", keys_root);
  RuntimeInstance instance{"ins-ssh", {0}, "img", {}, {{30000, 22, "tcp"}}};
  instance.authorized_keys = {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA alice@laptop"};
  ASSERT_TRUE(driver->Start(instance).ok());
  const std::string file = keys_root + "/ins-ssh/authorized_keys";
  EXPECT_EQ(Slurp(dir.path() + "/calls.txt"),
            "run\n-d\n--name\nsv-ins-ssh\n--label\nsv.instance=ins-ssh\n--gpus\n"
            "\"device=0\"\n-p\n30000:22/tcp\n-v\n" + file +
                ":/root/.ssh/authorized_keys:ro\nimg\n--\n");
  EXPECT_NE(Slurp(file).find("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA alice@laptop\n"),
            std::string::npos);
  struct stat before {};
  ASSERT_EQ(stat(file.c_str(), &before), 0);
  EXPECT_EQ(before.st_mode & 0777, 0600u);

  ASSERT_TRUE(driver->SetAuthorizedKeys("ins-ssh", {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB bob"})
                  .ok());
  struct stat after {};
  ASSERT_EQ(stat(file.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(Slurp(file).find("alice"), std::string::npos);
  EXPECT_NE(Slurp(file).find("bob"), std::string::npos);
  ASSERT_TRUE(driver->SetAuthorizedKeys("ins-ssh", {}).ok());  // Every key deleted.
  EXPECT_EQ(Slurp(file).find("ssh-ed25519"), std::string::npos);

  ASSERT_TRUE(driver->Stop("ins-ssh").ok());
  EXPECT_FALSE(fs::exists(keys_root + "/ins-ssh"));

  ASSERT_TRUE(driver->Start({"ins-bare", {1}, "img", {}, {}}).ok());
  EXPECT_EQ(Slurp(dir.path() + "/calls.txt").find("ins-bare/authorized_keys"), std::string::npos);
  EXPECT_EQ(driver->SetAuthorizedKeys("ins-bare", {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB b"})
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(DockerDriverTest, StopRemovesTheContainer) {
  TempDir dir;
  auto driver = NewDockerDriver(WriteFakeDocker(dir.path()));
  ASSERT_TRUE(driver->Stop("ins-abc").ok());
  EXPECT_EQ(Slurp(dir.path() + "/calls.txt"), "rm\n-f\nsv-ins-abc\n--\n");
}

// Goal: the listing names sv's containers only, with exit codes of ended ones.
TEST(DockerDriverTest, ListParsesStatesAndExitCodes) {
  TempDir dir;
  auto driver = NewDockerDriver(WriteFakeDocker(dir.path()));
  auto list = driver->List();
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].instance_id, "ins-aaa");
  EXPECT_TRUE((*list)[0].running);
  EXPECT_EQ((*list)[1].instance_id, "ins-bbb");
  EXPECT_FALSE((*list)[1].running);
  EXPECT_EQ((*list)[1].exit_code, 3);
}

TEST(DockerDriverTest, MissingDockerIsAnError) {
  auto driver = NewDockerDriver("/nonexistent/docker");
  absl::Status status = driver->Start({"ins-abc", {0}, "img", {}, {}});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
}

// Bind mounts need CAP_SYS_ADMIN (CI runs as root); elsewhere the hot-mount
// test is skipped and says why.
bool CanMount(const std::string& dir) {
  fs::create_directories(dir + "/probe-a");
  fs::create_directories(dir + "/probe-b");
  if (::mount((dir + "/probe-a").c_str(), (dir + "/probe-b").c_str(), nullptr, MS_BIND,
              nullptr) != 0) {
    return false;
  }
  ::umount2((dir + "/probe-b").c_str(), MNT_DETACH);
  return true;
}

bool Exists(const std::string& path) { return fs::exists(path); }

// Goal: with the docker driver, volumes under /mnt attach and detach while
// the container runs. The container's /mnt is an rslave bind of the
// instance's host directory (made here exactly as docker makes it for the
// --mount argument the driver passes); hot mounts show up in it and go
// away from it, read-only ones are read-only, a change outside /mnt is
// refused with nothing changed, and Stop releases every mount and leaves
// the volumes' data alone.
TEST(DockerDriverTest, VolumesUnderMntAttachAndDetachWhileRunning) {
  TempDir dir;
  if (!CanMount(dir.path())) GTEST_SKIP() << "bind mounts need CAP_SYS_ADMIN here";
  const std::string root = dir.path() + "/hot";
  const std::string vol_a = dir.path() + "/vol-a", vol_b = dir.path() + "/vol-b";
  const std::string lib = dir.path() + "/lib", container = dir.path() + "/container-mnt";
  fs::create_directories(vol_a);
  fs::create_directories(vol_b);
  fs::create_directories(lib);
  fs::create_directories(container);
  std::ofstream(vol_a + "/a.txt") << "a";
  std::ofstream(vol_b + "/b.txt") << "b";
  struct Unmount {
    std::string path;
    bool armed = false;
    ~Unmount() {
      if (armed) ::umount2(path.c_str(), MNT_DETACH);
    }
  } container_view{container};

  auto driver = NewDockerDriver(WriteFakeDocker(dir.path()), root);
  const VolumeMap a{vol_a, "/mnt/a", false, "vol-a"};
  const VolumeMap b{vol_b, "/mnt/data/b", true, "vol-b"};
  const VolumeMap library{lib, "/public/lib", true, ""};
  ASSERT_TRUE(driver->Start({"ins-hot", {0}, "img", {a, library}, {}}).ok());
  const std::string calls = Slurp(dir.path() + "/calls.txt");
  EXPECT_NE(calls.find("--mount\ntype=bind,source=" + root +
                       "/ins-hot,target=/mnt,bind-propagation=rslave\n"),
            std::string::npos)
      << calls;
  EXPECT_NE(calls.find("-v\n" + lib + ":/public/lib:ro\n"), std::string::npos) << calls;
  EXPECT_EQ(calls.find(vol_a), std::string::npos) << "a hot volume is not a -v bind";

  // docker --mount type=bind: a recursive bind, then rslave.
  ASSERT_EQ(::mount((root + "/ins-hot").c_str(), container.c_str(), nullptr, MS_BIND | MS_REC,
                    nullptr),
            0);
  container_view.armed = true;
  ASSERT_EQ(::mount(nullptr, container.c_str(), nullptr, MS_SLAVE | MS_REC, nullptr), 0);
  EXPECT_EQ(Slurp(container + "/a/a.txt"), "a");

  // Hot attach, read-only, nested below /mnt.
  absl::Status attached = driver->SetVolumes("ins-hot", {a, b, library});
  ASSERT_TRUE(attached.ok()) << attached;
  EXPECT_EQ(Slurp(container + "/data/b/b.txt"), "b");
  std::ofstream write_b(container + "/data/b/new.txt");
  EXPECT_FALSE(write_b.is_open()) << "a read-only volume took a write";

  // Hot detach.
  absl::Status detached = driver->SetVolumes("ins-hot", {b, library});
  ASSERT_TRUE(detached.ok()) << detached;
  EXPECT_FALSE(Exists(container + "/a/a.txt"));
  EXPECT_EQ(Slurp(container + "/data/b/b.txt"), "b");

  // Outside /mnt: refused, and /mnt/data/b stays.
  absl::Status outside = driver->SetVolumes("ins-hot", {b});
  EXPECT_EQ(outside.code(), absl::StatusCode::kFailedPrecondition) << outside;
  EXPECT_EQ(Slurp(container + "/data/b/b.txt"), "b");

  ASSERT_TRUE(driver->Stop("ins-hot").ok());
  EXPECT_TRUE(HostMounts(root).MountedPaths("ins-hot").empty());
  EXPECT_FALSE(Exists(root + "/ins-hot"));
  EXPECT_EQ(Slurp(vol_a + "/a.txt"), "a");
  EXPECT_EQ(Slurp(vol_b + "/b.txt"), "b");
}

// Goal: a tenant's symlink in its /mnt never leads a mount out of it.
// /mnt is the instance's host directory, writable from the container, and
// the agent mounts as root in the host's namespace: a symlink planted at
// /mnt/x -> / and an attach at /mnt/x/root/.ssh used to put the tenant's
// volume over the host's /root/.ssh (and its directories were created
// there), a root shell on the node. Now every part of the path is opened
// without following a symlink and the volume is mounted on what was
// opened; such an attach fails and nothing outside the directory changes.
// A later detach of a mount whose parent was swapped for a symlink does
// not unmount or remove anything outside it either.
TEST(HostMountsTest, SymlinksInTheTenantsMntLeadNowhere) {
  TempDir dir;
  if (!CanMount(dir.path())) GTEST_SKIP() << "bind mounts need CAP_SYS_ADMIN here";
  const std::string root = dir.path() + "/hot", vol = dir.path() + "/vol";
  const std::string host = dir.path() + "/host";  // Stands for the node's /.
  fs::create_directories(vol);
  fs::create_directories(host + "/root");
  std::ofstream(vol + "/authorized_keys") << "ssh-ed25519 AAAA tenant";
  HostMounts mounts(root);
  ASSERT_TRUE(mounts.Prepare("ins-sym").ok());
  const std::string mnt = mounts.DirOf("ins-sym");  // The container's /mnt.
  fs::create_directory_symlink(host, mnt + "/x");
  fs::create_symlink(host + "/root", mnt + "/leaf");

  for (const std::string& target : {"/mnt/x/root/.ssh", "/mnt/x/newdir", "/mnt/leaf"}) {
    absl::Status escaped = mounts.Apply("ins-sym", {{vol, target, false, "vol"}});
    EXPECT_EQ(escaped.code(), absl::StatusCode::kFailedPrecondition) << target << escaped;
    EXPECT_NE(escaped.message().find("symbolic link"), std::string::npos) << escaped;
  }
  EXPECT_FALSE(Exists(host + "/root/.ssh")) << "a directory was made through the link";
  EXPECT_FALSE(Exists(host + "/newdir"));
  EXPECT_FALSE(Exists(host + "/root/authorized_keys")) << "the volume was mounted outside";
  EXPECT_TRUE(mounts.MountedPaths("ins-sym") == std::vector<std::string>{""});

  // A plain path still mounts; then its parent is moved away and replaced
  // by a symlink to the host, and the volume is detached.
  ASSERT_TRUE(mounts.Apply("ins-sym", {{vol, "/mnt/data/keys", false, "vol"}}).ok());
  EXPECT_EQ(Slurp(mnt + "/data/keys/authorized_keys"), "ssh-ed25519 AAAA tenant");
  fs::create_directories(host + "/keys");
  ASSERT_EQ(::mount(vol.c_str(), (host + "/keys").c_str(), nullptr, MS_BIND, nullptr), 0);
  fs::rename(mnt + "/data", mnt + "/moved");
  fs::create_directory_symlink(host, mnt + "/data");
  absl::Status detached = mounts.Apply("ins-sym", {});
  EXPECT_TRUE(detached.ok()) << detached;
  EXPECT_EQ(Slurp(host + "/keys/authorized_keys"), "ssh-ed25519 AAAA tenant")
      << "a host mount was unmounted through the link";
  ::umount2((host + "/keys").c_str(), MNT_DETACH);
  ASSERT_TRUE(mounts.Release("ins-sym").ok());
  EXPECT_TRUE(Exists(host + "/root")) << "an empty host directory was removed";
  EXPECT_TRUE(Exists(host + "/keys"));
  EXPECT_EQ(Slurp(vol + "/authorized_keys"), "ssh-ed25519 AAAA tenant");
}

TEST(HostMountsTest, OnlyPlainPathsUnderMntAreHot) {
  EXPECT_EQ(HostMounts::HotPath("/mnt/data"), "data");
  EXPECT_EQ(HostMounts::HotPath("/mnt/a/b/"), "a/b");
  EXPECT_FALSE(HostMounts::HotPath("/mnt"));
  EXPECT_FALSE(HostMounts::HotPath("/mnt/"));
  EXPECT_FALSE(HostMounts::HotPath("/mntx/a"));
  EXPECT_FALSE(HostMounts::HotPath("/data"));
  EXPECT_FALSE(HostMounts::HotPath("/mnt/../etc"));
  EXPECT_FALSE(HostMounts::HotPath("/mnt/a//b"));
}

std::optional<RuntimeStatus> Find(RuntimeDriver& driver, const std::string& id) {
  auto list = driver.List();
  if (!list.ok()) return std::nullopt;
  for (const auto& s : *list) {
    if (s.instance_id == id) return s;
  }
  return std::nullopt;
}

// Goal: the process driver runs, lists and stops real processes, and keeps
// the exit code of one that ended by itself.
TEST(ProcessDriverTest, StartListStopAndExitCodes) {
  TempDir dir;
  auto driver = NewProcessDriver(dir.path(), "test \"$SV_INSTANCE_ID\" = ins-fail && exit 3; "
                                             "exec sleep 30");
  ASSERT_TRUE(driver->Start({"ins-run", {2, 3}, "img", {}, {}}).ok());
  ASSERT_TRUE(driver->Start({"ins-fail", {4}, "img", {}, {}}).ok());
  auto running = Find(*driver, "ins-run");
  ASSERT_TRUE(running.has_value());
  EXPECT_TRUE(running->running);

  std::optional<RuntimeStatus> failed;
  for (int i = 0; i < 200; ++i) {  // The shell exits within milliseconds.
    failed = Find(*driver, "ins-fail");
    if (failed && !failed->running) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(failed.has_value());
  EXPECT_FALSE(failed->running);
  EXPECT_EQ(failed->exit_code, 3);

  ASSERT_TRUE(driver->Stop("ins-run").ok());
  ASSERT_TRUE(driver->Stop("ins-fail").ok());
  EXPECT_FALSE(Find(*driver, "ins-run").has_value());
  EXPECT_FALSE(Find(*driver, "ins-fail").has_value());
}

// Goal: the process driver names the instance's authorized_keys file in
// SV_SSH_AUTHORIZED_KEYS_FILE, and only when the tenant has keys.
TEST(ProcessDriverTest, SshKeysFileIsNamedInTheEnvironment) {
  TempDir dir;
  auto driver = NewProcessDriver(
      dir.path(), "echo \"keys=${SV_SSH_AUTHORIZED_KEYS_FILE:-none}\"; exec sleep 30");
  RuntimeInstance with{"ins-keys", {0}, "img", {}, {}};
  with.authorized_keys = {"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA alice"};
  ASSERT_TRUE(driver->Start(with).ok());
  ASSERT_TRUE(driver->Start({"ins-none", {1}, "img", {}, {}}).ok());
  const std::string file = dir.path() + "/ssh-keys/ins-keys/authorized_keys";
  std::string with_log, none_log;
  for (int i = 0; i < 300 && (with_log.empty() || none_log.empty()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    with_log = Slurp(dir.path() + "/ins-keys.log");
    none_log = Slurp(dir.path() + "/ins-none.log");
  }
  EXPECT_EQ(with_log, "keys=" + file + "\n");
  EXPECT_EQ(none_log, "keys=none\n");
  EXPECT_NE(Slurp(file).find("alice"), std::string::npos);
  ASSERT_TRUE(driver->Stop("ins-keys").ok());
  ASSERT_TRUE(driver->Stop("ins-none").ok());
  EXPECT_FALSE(fs::exists(file));
}

// Goal: a restarted agent (a new driver on the same folder) finds what runs.
TEST(ProcessDriverTest, NewDriverAdoptsRunningProcesses) {
  TempDir dir;
  auto first = NewProcessDriver(dir.path(), "exec sleep 30");
  ASSERT_TRUE(first->Start({"ins-run", {0}, "img", {}, {}}).ok());
  auto second = NewProcessDriver(dir.path(), "exec sleep 30");
  auto adopted = Find(*second, "ins-run");
  ASSERT_TRUE(adopted.has_value());
  EXPECT_TRUE(adopted->running);
  ASSERT_TRUE(second->Stop("ins-run").ok());
  ASSERT_TRUE(first->Stop("ins-run").ok());  // Reaps the child; a no-op otherwise.
}

}  // namespace
}  // namespace sv::agent
