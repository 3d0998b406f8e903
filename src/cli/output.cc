#include "cli/output.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"

namespace sv::cli {

std::string FormatTime(const google::protobuf::Timestamp& t, TimePrecision precision) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  const absl::Time at =
      absl::FromUnixMicros(google::protobuf::util::TimeUtil::TimestampToMicroseconds(t));
  const char* format = precision == TimePrecision::kMilliseconds ? "%Y-%m-%d %H:%M:%E3S UTC"
                                                                 : "%Y-%m-%d %H:%M:%S UTC";
  return absl::FormatTime(format, at, absl::UTCTimeZone());
}

namespace {

std::string NodesOf(const v1::Instance& instance) {
  std::vector<std::string> parts;
  for (const auto& p : instance.placement()) {
    parts.push_back(absl::StrCat(p.node_name(), "[", absl::StrJoin(p.gpu_indices(), ","), "]"));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, " ");
}

void PrintRows(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out << line << "\n";
  }
}

}  // namespace

std::string StateName(v1::InstanceState state) { return v1::InstanceState_Name(state); }

void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out) {
  PrintRows(rows, out);
}

void PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  out << json;
  if (json.empty() || json.back() != '\n') out << "\n";
}

void ShowInstance(const v1::Instance& instance, Format format) {
  if (format == Format::kJson) {
    PrintJson(instance, std::cout);
  } else {
    PrintInstanceDetail(instance, std::cout);
  }
}

void PrintInstanceDetail(const v1::Instance& i, std::ostream& out) {
  PrintRows({{"id:", i.id()},
             {"name:", i.name()},
             {"state:", StateName(i.state())},
             {"reason:", i.state_reason()},
             {"queue:", i.queue_position() > 0 ? absl::StrCat("position ", i.queue_position())
                                               : "-"},
             {"gpus:", absl::StrCat(i.gpu_count(), " x ", i.gpu_model())},
             {"image:", i.image()},
             {"placement:", NodesOf(i)},
             {"created:", FormatTime(i.create_time())},
             {"updated:", FormatTime(i.update_time())}},
            out);
  PrintInstanceExtras(i, out);
}

void PrintInstanceTable(const std::vector<v1::Instance>& instances, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "GPUS", "STATE", "PLACEMENT", "CREATED"}};
  for (const auto& i : instances) {
    std::string state = StateName(i.state());
    if (i.queue_position() > 0) absl::StrAppend(&state, " #", i.queue_position());
    rows.push_back({i.id(), i.name(), std::to_string(i.gpu_count()), state,
                    NodesOf(i), FormatTime(i.create_time())});
  }
  PrintRows(rows, out);
}

void PrintFleetInstanceTable(const std::vector<v1::Instance>& instances, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"ID", "TENANT", "GPUS", "STATE", "PLACEMENT", "CREATED", "REASON"}};
  for (const auto& i : instances) {
    rows.push_back({i.id(), i.tenant_id(), std::to_string(i.gpu_count()), StateName(i.state()),
                    NodesOf(i), FormatTime(i.create_time()),
                    i.state_reason().empty() ? "-" : i.state_reason()});
  }
  PrintRows(rows, out);
}

std::string RoleText(v1::TenantRole role) {
  switch (role) {
    case v1::TENANT_ROLE_VIEWER: return "viewer";
    case v1::TENANT_ROLE_BILLING: return "billing";
    case v1::TENANT_ROLE_MEMBER: return "member";
    case v1::TENANT_ROLE_OWNER: return "owner";
    default: return "-";
  }
}

std::string ScopeText(v1::KeyScope scope) {
  return scope == v1::KEY_SCOPE_READ_ONLY ? "read-only" : "full";
}

void PrintAccount(const v1::Account& a, std::ostream& out) {
  // The role in the tenant, as `svctl users list` shows it; the platform
  // role only for an operator (every other caller is a plain MEMBER).
  std::vector<std::vector<std::string>> rows = {
      {"user:", absl::StrCat(a.user_email(), " (", a.user_id(), ")")},
      {"tenant:", absl::StrCat(a.tenant_name(), " (", a.tenant_id(), ")")},
      {"role:", RoleText(a.tenant_role())}};
  if (a.role() == v1::OPERATOR) {
    rows.push_back({"operator:", a.read_only_operator() ? "yes, read-only" : "yes"});
  }
  rows.push_back({"api key:", absl::StrCat(a.api_key_id(), " (", ScopeText(a.key_scope()), ")")});
  if (a.tenant_suspended()) {
    rows.push_back({"suspended:", absl::StrCat(a.suspension_reason(),
                                               " (creates and starts are refused)")});
  }
  PrintRows(rows, out);
}

void PrintTenantStanding(const v1::TenantStanding& s, std::ostream& out) {
  const v1::Tenant& t = s.tenant();
  PrintRows({{"tenant:", absl::StrCat(t.name(), " (", t.id(), ")")},
             {"created:", FormatTime(t.create_time())},
             {"status:", t.has_suspension()
                             ? absl::StrCat("SUSPENDED since ",
                                            FormatTime(t.suspension().suspend_time()))
                             : std::string("active")}},
            out);
  if (s.suspensions().empty()) return;
  out << "\n";
  std::vector<std::vector<std::string>> rows = {
      {"SUSPENDED", "BY", "REASON", "RESUMED", "BY", "REASON"}};
  for (const auto& x : s.suspensions()) {
    const bool ended = x.has_resume_time();
    rows.push_back({FormatTime(x.suspend_time()), x.suspended_by(), x.reason(),
                    ended ? FormatTime(x.resume_time()) : "-", ended ? x.resumed_by() : "-",
                    ended ? x.resume_reason() : "-"});
  }
  PrintTable(rows, out);
}

std::string Yuan(int64_t micros) {
  const bool negative = micros < 0;
  const uint64_t abs = negative ? 0 - static_cast<uint64_t>(micros) : micros;
  std::string frac = std::to_string(abs % 1'000'000);
  frac.insert(0, 6 - frac.size(), '0');
  return absl::StrCat(negative ? "-" : "", abs / 1'000'000, ".", frac, " CNY");
}

bool ParseYuan(const std::string& text, int64_t* micros) {
  const size_t dot = text.find('.');
  const std::string whole = text.substr(0, dot);
  std::string frac = dot == std::string::npos ? "" : text.substr(dot + 1);
  if (whole.empty() || frac.size() > 6 || whole.size() > 12) return false;
  for (char c : whole + frac) {
    if (c < '0' || c > '9') return false;
  }
  frac.append(6 - frac.size(), '0');
  int64_t w = 0, f = 0;
  if (!absl::SimpleAtoi(whole, &w) || !absl::SimpleAtoi(frac, &f)) return false;
  *micros = w * 1'000'000 + f;
  return true;
}

std::string YuanSyntaxError(const std::string& what, const std::string& text) {
  return absl::StrCat(what,
                      " must be a CNY amount like 100 or 12.50 (digits, at most 6 decimals, "
                      "no sign or exponent), got '",
                      text.substr(0, 40), "'");
}

}  // namespace sv::cli
