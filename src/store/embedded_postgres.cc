#include "store/embedded_postgres.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <pqxx/pqxx>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ids.h"
#include "common/status.h"
#include "store/database.h"
#include "spdlog/spdlog.h"

namespace sv::store {
namespace {

namespace fs = std::filesystem;

std::string FindPostgresBinDir() {
  std::vector<std::string> candidates;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    fs::path bin = entry.path() / "bin";
    if (fs::exists(bin / "initdb") && fs::exists(bin / "pg_ctl")) {
      candidates.push_back(bin.string());
    }
  }
  if (candidates.empty()) return "";
  // Prefer 15, the version sv is built and tested against.
  for (const auto& c : candidates) {
    if (c.find("/15/") != std::string::npos) return c;
  }
  std::sort(candidates.begin(), candidates.end());
  return candidates.back();
}

bool IsRoot() { return geteuid() == 0; }

absl::Status ChownToPostgres(const std::string& path) {
  struct passwd* pw = getpwnam("postgres");
  if (pw == nullptr) {
    return Error(absl::StatusCode::kFailedPrecondition, "NO_POSTGRES_USER",
                 "running as root needs the 'postgres' system user "
                 "(apt-get install postgresql-15)");
  }
  std::error_code ec;
  if (chown(path.c_str(), pw->pw_uid, pw->pw_gid) != 0) {
    return absl::InternalError(absl::StrCat("chown ", path, " failed"));
  }
  for (const auto& entry : fs::recursive_directory_iterator(path, ec)) {
    lchown(entry.path().c_str(), pw->pw_uid, pw->pw_gid);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunProgram(const std::vector<std::string>& argv,
                        const std::string& log_path, int* exit_code) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    int fd = log_path.empty()
                 ? open("/dev/null", O_WRONLY)
                 : open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    int null_in = open("/dev/null", O_RDONLY);
    if (null_in >= 0) dup2(null_in, STDIN_FILENO);
    // Start in "/" so that a helper running as another user never trips on
    // a working folder it may not read.
    if (chdir("/") != 0) _exit(126);
    execvp(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return absl::InternalError("waitpid failed");
  }
  *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return absl::OkStatus();
}

int PickFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

EmbeddedPostgres::EmbeddedPostgres(EmbeddedPostgresOptions options)
    : options_(std::move(options)) {}

EmbeddedPostgres::~EmbeddedPostgres() {
  if (running_) {
    absl::Status status = Stop();
    if (!status.ok()) spdlog::warn("postgres: stop failed: {}", status.ToString());
  }
}

std::vector<std::string> EmbeddedPostgres::AsOwner(std::vector<std::string> argv) const {
  if (!IsRoot()) return argv;
  std::vector<std::string> wrapped = {"runuser", "-u", "postgres", "--"};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

absl::Status EmbeddedPostgres::Init() {
  std::error_code ec;
  fs::create_directories(options_.data_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create ", options_.data_dir, ": ", ec.message()));
  }
  chmod(options_.data_dir.c_str(), 0700);
  if (IsRoot()) {
    SV_RETURN_IF_ERROR(ChownToPostgres(options_.data_dir));
    int code = 0;
    SV_RETURN_IF_ERROR(RunProgram(
        {"runuser", "-u", "postgres", "--", "test", "-w", options_.data_dir}, "", &code));
    if (code != 0) {
      // The folder sits under a parent that the postgres user cannot enter
      // (e.g. /root). Keep the cluster in a system folder named after it.
      std::string fallback = absl::StrCat("/var/lib/sv/",
                                          Sha256Hex(options_.data_dir).substr(0, 16), "/pg");
      spdlog::warn("postgres: user 'postgres' cannot reach {}; keeping the cluster in {}",
                   options_.data_dir, fallback);
      options_.data_dir = fallback;
      fs::create_directories(fallback, ec);
      chmod("/var/lib/sv", 0755);
      chmod(fs::path(fallback).parent_path().c_str(), 0755);
      chmod(fallback.c_str(), 0700);
      SV_RETURN_IF_ERROR(ChownToPostgres(fallback));
    }
  }
  if (fs::exists(fs::path(options_.data_dir) / "PG_VERSION")) return absl::OkStatus();
  spdlog::info("postgres: initialising a new cluster in {}", options_.data_dir);
  int code = 0;
  std::vector<std::string> argv = {bin_dir_ + "/initdb", "-D", options_.data_dir,
                                    "-U", "postgres", "-A", "trust", "-E", "UTF8",
                                    "--no-locale"};
  if (!options_.durable) argv.push_back("--no-sync");
  SV_RETURN_IF_ERROR(RunProgram(AsOwner(argv), "", &code));
  if (code != 0) {
    return Error(absl::StatusCode::kFailedPrecondition, "INITDB_FAILED",
                 absl::StrCat("initdb failed (exit ", code, ") in ", options_.data_dir,
                              "; as root, the 'postgres' user must be able to "
                              "reach that folder"));
  }
  return absl::OkStatus();
}

absl::Status EmbeddedPostgres::Start() {
  bin_dir_ = FindPostgresBinDir();
  if (bin_dir_.empty()) {
    return Error(absl::StatusCode::kFailedPrecondition, "POSTGRES_NOT_INSTALLED",
                 "no PostgreSQL server binaries under /usr/lib/postgresql "
                 "(apt-get install postgresql-15)");
  }
  options_.data_dir = fs::absolute(options_.data_dir).lexically_normal().string();
  SV_RETURN_IF_ERROR(Init());
  const std::string log_path = options_.data_dir + "/server.log";
  int code = 0;
  // A server left behind by a process that died without stopping it owns
  // this folder; it is ours, so stop it before starting afresh.
  SV_RETURN_IF_ERROR(RunProgram(
      AsOwner({bin_dir_ + "/pg_ctl", "-D", options_.data_dir, "status"}), "", &code));
  if (code == 0) {
    spdlog::warn("postgres: a server is already running on {}; stopping it",
                 options_.data_dir);
    SV_RETURN_IF_ERROR(RunProgram(AsOwner({bin_dir_ + "/pg_ctl", "-D", options_.data_dir,
                                           "-m", "fast", "-w", "stop"}),
                                  "", &code));
  }
  port_ = options_.port != 0 ? options_.port : PickFreePort();
  std::vector<std::string> server_opts = {
      "-p", std::to_string(port_), "-c", "listen_addresses=127.0.0.1",
      "-k", options_.data_dir};
  if (!options_.durable) {
    for (const char* s : {"fsync=off", "synchronous_commit=off", "full_page_writes=off"}) {
      server_opts.push_back("-c");
      server_opts.push_back(s);
    }
  }
  for (const auto& s : options_.settings) {
    server_opts.push_back("-c");
    server_opts.push_back(s);
  }
  SV_RETURN_IF_ERROR(RunProgram(
      AsOwner({bin_dir_ + "/pg_ctl", "-D", options_.data_dir, "-l", log_path, "-w",
               "-t", "60", "-o", absl::StrJoin(server_opts, " "), "start"}),
      "", &code));
  if (code != 0) {
    return Error(absl::StatusCode::kUnavailable, "POSTGRES_START_FAILED",
                 absl::StrCat("PostgreSQL did not start (exit ", code, "); see ",
                              log_path));
  }
  running_ = true;
  try {
    pqxx::connection admin(absl::StrCat("host=127.0.0.1 port=", port_,
                                        " user=postgres dbname=postgres"));
    pqxx::nontransaction txn(admin);
    auto r = txn.exec_params("SELECT 1 FROM pg_database WHERE datname = $1",
                             options_.database);
    if (r.empty()) txn.exec("CREATE DATABASE " + txn.quote_name(options_.database));
  } catch (...) {
    return StatusFromCurrentException();
  }
  spdlog::info("postgres: running on 127.0.0.1:{} with data in {}", port_,
               options_.data_dir);
  return absl::OkStatus();
}

absl::Status EmbeddedPostgres::Stop() {
  if (!running_) return absl::OkStatus();
  int code = 0;
  SV_RETURN_IF_ERROR(RunProgram(AsOwner({bin_dir_ + "/pg_ctl", "-D", options_.data_dir,
                                         "-m", "fast", "-w", "-t", "60", "stop"}),
                                "", &code));
  running_ = false;
  if (code != 0) return absl::InternalError(absl::StrCat("pg_ctl stop exited ", code));
  spdlog::info("postgres: stopped");
  return absl::OkStatus();
}

std::string EmbeddedPostgres::url() const {
  return absl::StrCat("host=127.0.0.1 port=", port_, " user=postgres dbname=",
                      options_.database);
}

}  // namespace sv::store
