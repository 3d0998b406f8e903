#ifndef SV_CLI_OUTPUT_H_
#define SV_CLI_OUTPUT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "sv/v1/account.pb.h"
#include "sv/v1/admin.pb.h"
#include "sv/v1/instance.pb.h"

namespace sv::cli {

enum class Format { kTable, kJson };

void PrintJson(const google::protobuf::Message& message, std::ostream& out);
void PrintInstanceDetail(const v1::Instance& instance, std::ostream& out);
// One instance on stdout: its details, or JSON with --output json.
void ShowInstance(const v1::Instance& instance, Format format);
// Ports with their URLs, library mounts, volumes and app (output_extras.cc).
void PrintInstanceExtras(const v1::Instance& instance, std::ostream& out);
void PrintInstanceTable(const std::vector<v1::Instance>& instances, std::ostream& out);
// Every tenant's instances (svctl admin instances): with the tenant and reason.
void PrintFleetInstanceTable(const std::vector<v1::Instance>& instances, std::ostream& out);
void PrintAccount(const v1::Account& account, std::ostream& out);
// svctl admin tenant: the tenant, whether it is suspended, its suspensions.
void PrintTenantStanding(const v1::TenantStanding& standing, std::ostream& out);
// Columns padded to the widest cell; the first row is the header.
void PrintTable(const std::vector<std::vector<std::string>>& rows, std::ostream& out);

// Money for people: 12345678 micro-yuan -> "12.345678 CNY".
std::string Yuan(int64_t micros);
// "2026-12-04 19:09:00 UTC", or with milliseconds "2026-12-04 19:09:00.125
// UTC"; "-" for an unset time.
enum class TimePrecision { kSeconds, kMilliseconds };
std::string FormatTime(const google::protobuf::Timestamp& t,
                       TimePrecision precision = TimePrecision::kSeconds);
// A tenant role as svctl writes and reads it: viewer, billing, member,
// owner ("-" for none).
std::string RoleText(v1::TenantRole role);
// An API key's scope: "read-only" or "full".
std::string ScopeText(v1::KeyScope scope);

// "12.5" (CNY) -> 12500000 micro-yuan; at most six decimals, no sign or
// exponent. False for anything else.
bool ParseYuan(const std::string& text, int64_t* micros);
// The error for text ParseYuan refused: "<what> must be a CNY amount like
// 100 or 12.50 (...), got '<text>'".
std::string YuanSyntaxError(const std::string& what, const std::string& text);

// "RUNNING", "PENDING", ...
std::string StateName(v1::InstanceState state);

}  // namespace sv::cli

#endif  // SV_CLI_OUTPUT_H_
