#include "agent/instance_record.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sv::agent {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  return synced ? absl::OkStatus() : Errno("cannot fsync", path);
}

}  // namespace

absl::StatusOr<InstanceRecord> LoadInstanceRecord(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (!std::filesystem::exists(path)) return InstanceRecord{};
    return Errno("cannot read", path);
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  auto is_int = [](const nlohmann::json& o, const char* key) {
    return o.contains(key) && o[key].is_number_integer();
  };
  if (!doc.is_object() || !doc.contains("runs") || !doc["runs"].is_object() ||
      !doc.contains("ended") || !doc["ended"].is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is not an instance record"));
  }
  InstanceRecord record;
  for (const auto& [id, run] : doc["runs"].items()) {
    if (!run.is_number_integer()) {
      return absl::DataLossError(absl::StrCat(path, ": a malformed run for ", id));
    }
    record.runs[id] = run.get<int64_t>();
  }
  for (const auto& [id, entry] : doc["ended"].items()) {
    if (!entry.is_object() || !is_int(entry, "run") || !is_int(entry, "exit_code") ||
        !is_int(entry, "observed_unix_micros") || !entry.contains("detail") ||
        !entry["detail"].is_string()) {
      return absl::DataLossError(absl::StrCat(path, ": a malformed exit for ", id));
    }
    record.ended[id] = EndedInstance{
        entry["run"].get<int64_t>(), entry["exit_code"].get<int>(),
        entry["detail"].get<std::string>(),
        absl::FromUnixMicros(entry["observed_unix_micros"].get<int64_t>())};
  }
  return record;
}

absl::Status SaveInstanceRecord(const std::string& path, const InstanceRecord& record) {
  nlohmann::json runs = nlohmann::json::object();
  for (const auto& [id, run] : record.runs) runs[id] = run;
  nlohmann::json ended = nlohmann::json::object();
  for (const auto& [id, e] : record.ended) {
    ended[id] = {{"run", e.run},
                   {"exit_code", e.exit_code},
                   {"detail", e.detail},
                   {"observed_unix_micros", absl::ToUnixMicros(e.observed)}};
  }
  const std::filesystem::path target(path);
  const std::filesystem::path dir =
      target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << nlohmann::json{{"runs", runs}, {"ended", ended}}.dump() << "\n";
    out.flush();
    if (!out) return Errno("cannot write", temporary);
  }
  if (absl::Status s = SyncPath(temporary, O_RDONLY); !s.ok()) return s;
  if (::rename(temporary.c_str(), path.c_str()) != 0) return Errno("cannot rename to", path);
  return SyncPath(dir.string(), O_RDONLY | O_DIRECTORY);
}

}  // namespace sv::agent
