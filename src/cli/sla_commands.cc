// svctl sla <instance>; svctl admin sla-report and sla-override. Money is
// printed from int64 micro-yuan without floating point.
#include <fstream>
#include <iostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include "sv/v1/sla.grpc.pb.h"

namespace sv::cli {
namespace {

std::string Hour(const google::protobuf::Timestamp& t) {
  return absl::FormatTime("%Y-%m-%d %H:00Z", absl::FromUnixSeconds(t.seconds()),
                          absl::UTCTimeZone());
}

std::string Minute(const google::protobuf::Timestamp& t) {
  return absl::FormatTime("%H:%M", absl::FromUnixSeconds(t.seconds()), absl::UTCTimeZone());
}

std::string Share(int usable, int slots) {
  if (slots == 0) return "-";
  const int64_t bp = int64_t{usable} * 10000 / slots;
  return absl::StrFormat("%d.%d%%", bp / 100, (bp % 100) / 10);
}

std::string Rate(int64_t bytes_per_second) {
  return absl::StrFormat("%d.%02d GB/s", bytes_per_second / 1'000'000'000,
                         (bytes_per_second % 1'000'000'000) / 10'000'000);
}

std::string Micros(int64_t ns) { return absl::StrFormat("%d.%02d us", ns / 1000, (ns % 1000) / 10); }

std::string Breached(const v1::SlaWindow& w) {
  if (w.state() == v1::OPEN) return "(open)";
  std::string out;
  for (const auto& v : w.verdicts()) {
    if (!v.breached()) continue;
    absl::StrAppend(&out, out.empty() ? "" : ",", v1::SlaMetric_Name(v.definition().metric()));
  }
  return out.empty() ? "none" : out;
}

void PrintWindow(const v1::SlaWindow& w, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"instance", w.instance_id()},
      {"hour", Hour(w.hour_start_time())},
      {"state", v1::SlaWindowState_Name(w.state())},
      {"GPUs", std::to_string(w.gpu_count())},
  };
  if (w.state() == v1::JUDGED) {
    rows.push_back({"billed", Minute(w.billed_start_time()) + "-" + Minute(w.billed_end_time())});
    rows.push_back({"rent", Yuan(w.rent_micros())});
  } else if (w.has_billed_start_time()) {
    rows.push_back({"billed so far",
                    Minute(w.billed_start_time()) + "-" + Minute(w.billed_end_time())});
    rows.push_back({"rent so far", Yuan(w.rent_micros())});
  } else {
    rows.push_back({"billed so far", "nothing yet"});
  }
  rows.push_back({"GPU slots usable", absl::StrCat(w.slots_usable(), " of ", w.slots(), " (",
                                                   Share(w.slots_usable(), w.slots()), "), ",
                                                   w.slots_reported(), " reported")});
  rows.push_back({"storage writes", absl::StrCat(w.storage_probe_count(), " probes, mean ",
                                                 Rate(w.storage_mean_bytes_per_second()),
                                                 ", min ",
                                                 Rate(w.storage_min_bytes_per_second()))});
  rows.push_back({"fabric latency", absl::StrCat(w.latency_sample_count(), " probes, p99 ",
                                                 Micros(w.latency_p99_ns()))});
  std::string nodes;
  for (const auto& n : w.node_names()) absl::StrAppend(&nodes, nodes.empty() ? "" : ", ", n);
  rows.push_back({"nodes", nodes.empty() ? "-" : nodes});
  if (w.late_samples_ignored() > 0) {
    rows.push_back({"late samples ignored", std::to_string(w.late_samples_ignored())});
  }
  if (w.state() == v1::JUDGED) rows.push_back({"refunded", Yuan(w.refund_micros_total())});
  PrintTable(rows, out);
  if (w.verdicts_size() == 0) return;
  out << "\n";
  std::vector<std::vector<std::string>> verdicts = {{"VERDICT", "REFUND", "TRANSFER", "WHY"}};
  for (const auto& v : w.verdicts()) {
    verdicts.push_back({v.breached() ? "BREACHED" : "met",
                        v.refund_micros() > 0 ? Yuan(v.refund_micros()) : "-",
                        v.refund_transfer_id() > 0 ? v.refund_idempotency_key() : "-",
                        v.explanation()});
  }
  PrintTable(verdicts, out);
}

bool ParseHour(const std::string& text, google::protobuf::Timestamp* out) {
  absl::Time t;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, text, &t, &error)) return false;
  out->set_seconds(absl::ToUnixSeconds(t));
  return true;
}

void AddTenantCommand(CLI::App& app, Action* action) {
  auto instance = std::make_shared<std::string>();
  auto hour = std::make_shared<std::string>();
  auto page_size = std::make_shared<int>(24);
  auto* sla = app.add_subcommand(
      "sla", "SLA windows of an instance: hourly evidence, verdicts and refunds");
  sla->add_option("instance", *instance, "Instance id or name")->required();
  sla->add_option("--hour", *hour, "One hour in detail, RFC 3339 (e.g. 2026-11-30T10:00:00Z)");
  sla->add_option("--page-size", *page_size, "Hours to list (at most 1000)")
      ->check(CLI::Range(1, 1000));
  sla->callback([=] {
    *action = [=](Session& s) {
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      std::string id;
      if (int rc = ResolveInstance(s, *instance, &id); rc != kExitOk) return rc;
      auto stub = v1::SlaService::NewStub(s.channel);
      if (!hour->empty()) {
        v1::GetSlaWindowRequest request;
        request.set_instance_id(id);
        if (!ParseHour(*hour, request.mutable_hour_start_time())) {
          return Fail("--hour must be an RFC 3339 time on a whole hour");
        }
        v1::SlaWindow window;
        grpc::Status status = stub->GetSlaWindow(s.Context().get(), request, &window);
        if (!status.ok()) return FailRpc(status, s);
        if (s.format() == Format::kJson) {
          PrintJson(window, std::cout);
        } else {
          PrintWindow(window, std::cout);
        }
        return kExitOk;
      }
      v1::ListSlaWindowsRequest request;
      request.set_instance_id(id);
      request.set_page_size(*page_size);
      v1::ListSlaWindowsResponse response;
      grpc::Status status = stub->ListSlaWindows(s.Context().get(), request, &response);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(response, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {
          {"HOUR", "STATE", "RENT", "GPU USABLE", "STORAGE MEAN", "LATENCY P99", "BREACHED",
           "REFUND"}};
      for (const auto& w : response.windows()) {
        rows.push_back({Hour(w.hour_start_time()), v1::SlaWindowState_Name(w.state()),
                        w.has_billed_start_time() ? Yuan(w.rent_micros()) : "-",
                        Share(w.slots_usable(), w.slots()),
                        Rate(w.storage_mean_bytes_per_second()), Micros(w.latency_p99_ns()),
                        Breached(w),
                        w.state() == v1::JUDGED ? Yuan(w.refund_micros_total()) : "-"});
      }
      PrintTable(rows, std::cout);
      if (response.windows_size() == 0) std::cout << "(no SLA windows yet)\n";
      return kExitOk;
    };
  });
}

// JSON overrides: [{"metric": "gpu_usable", "threshold": 9900, ...}].
bool ParseOverrides(const std::string& text, v1::SetSlaOverridesRequest* out,
                    std::string* error) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
  if (doc.is_discarded() || !doc.is_array()) {
    *error = "the overrides file must be a JSON array";
    return false;
  }
  for (const auto& item : doc) {
    if (!item.is_object()) {
      *error = "each override must be an object";
      return false;
    }
    // Each field of the type it must have: nlohmann's value() throws on
    // another (svctl aborted), and an int field took a wrapped number.
    for (const char* key : {"metric", "aggregation", "comparison"}) {
      if (item.contains(key) && !item[key].is_string()) {
        *error = std::string(key) + " must be a string";
        return false;
      }
    }
    if (item.contains("refund_basis_points") &&
        (!item["refund_basis_points"].is_number_integer() ||
         item["refund_basis_points"].get<int64_t>() < 0 ||
         item["refund_basis_points"].get<int64_t>() > 10000)) {
      *error = "refund_basis_points must be an integer from 0 to 10000";
      return false;
    }
    auto* d = out->add_definitions();
    const std::string metric = item.value("metric", "");
    if (metric == "gpu_usable") {
      d->set_metric(v1::GPU_USABLE);
      d->set_aggregation(v1::SHARE_OF_TIME);
      d->set_comparison(v1::AT_LEAST);
    } else if (metric == "storage_write") {
      d->set_metric(v1::STORAGE_WRITE);
      d->set_aggregation(v1::MEAN);
      d->set_comparison(v1::AT_LEAST);
    } else if (metric == "network_latency") {
      d->set_metric(v1::NETWORK_LATENCY);
      d->set_aggregation(v1::P99);
      d->set_comparison(v1::AT_MOST);
    } else {
      *error = "metric must be gpu_usable, storage_write or network_latency";
      return false;
    }
    const std::string aggregation = item.value("aggregation", "");
    if (aggregation == "mean") d->set_aggregation(v1::MEAN);
    if (aggregation == "minimum") d->set_aggregation(v1::MINIMUM);
    const std::string comparison = item.value("comparison", "");
    if (comparison == "at_least") d->set_comparison(v1::AT_LEAST);
    if (comparison == "at_most") d->set_comparison(v1::AT_MOST);
    if (!item.contains("threshold") || !item["threshold"].is_number_integer()) {
      *error = "threshold must be an integer";
      return false;
    }
    d->set_threshold(item["threshold"].get<int64_t>());
    d->set_refund_basis_points(item.value("refund_basis_points", 1000));
  }
  return true;
}

void AddAdminCommandsForSla(CLI::App& app, Action* action) {
  CLI::App* admin = app.get_subcommand("admin");
  auto from = std::make_shared<std::string>(), to = std::make_shared<std::string>();
  auto* report = admin->add_subcommand(
      "sla-report", "SLA breaches by metric, node and leaf switch, and the total refunded");
  report->add_option("--from", *from, "Hours from, RFC 3339 (default: 30 days ago)");
  report->add_option("--to", *to, "Hours before, RFC 3339 (default: now)");
  report->callback([=] {
    *action = [=](Session& s) {
      v1::GetSlaReportRequest request;
      if (!from->empty() && !ParseHour(*from, request.mutable_start_time())) {
        return Fail("--from must be an RFC 3339 time");
      }
      if (!to->empty() && !ParseHour(*to, request.mutable_end_time())) {
        return Fail("--to must be an RFC 3339 time");
      }
      s.flags.admin = true;
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      v1::GetSlaReportResponse response;
      grpc::Status status =
          v1::SlaAdminService::NewStub(s.channel)->GetSlaReport(s.Context().get(), request,
                                                                &response);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(response, std::cout);
        return kExitOk;
      }
      PrintTable({{"windows judged", std::to_string(response.windows_judged())},
                  {"windows breached", std::to_string(response.windows_breached())},
                  {"refunded", Yuan(response.refunded_micros_total())},
                  {"late samples ignored", std::to_string(response.late_samples_ignored())}},
                 std::cout);
      auto section = [](const char* title, const auto& rows) {
        std::vector<std::vector<std::string>> table = {{title, "BREACHES", "REFUNDED"}};
        for (const auto& r : rows) {
          table.push_back({r.key(), std::to_string(r.breaches()), Yuan(r.refund_micros())});
        }
        std::cout << "\n";
        PrintTable(table, std::cout);
      };
      section("METRIC", response.by_metric());
      section("NODE", response.by_node());
      section("LEAF SWITCH", response.by_leaf_switch());
      return kExitOk;
    };
  });

  auto overrides = std::make_shared<v1::SetSlaOverridesRequest>();
  auto file = std::make_shared<std::string>();
  auto clear = std::make_shared<bool>(false);
  auto* set = admin->add_subcommand(
      "sla-override", "Set a tenant's SLA overrides (enterprise contracts) from a JSON file");
  set->add_option("tenant", *overrides->mutable_tenant_id(), "Tenant id or name")->required();
  set->add_option("--file", *file,
                  "JSON array, e.g. [{\"metric\": \"gpu_usable\", \"threshold\": 9900, "
                  "\"refund_basis_points\": 1500}]");
  set->add_flag("--clear", *clear, "Remove the tenant's overrides");
  set->callback([=] {
    *action = [=](Session& s) {
      if (file->empty() == !*clear) return Fail("give either --file or --clear");
      if (!file->empty()) {
        std::ifstream in(*file);
        if (!in) return Fail("cannot read " + *file);
        std::stringstream text;
        text << in.rdbuf();
        std::string error;
        if (!ParseOverrides(text.str(), overrides.get(), &error)) return Fail(error);
      }
      s.flags.admin = true;
      std::string error;
      if (!s.Connect(&error)) return Fail(error);
      if (int rc = ResolveTenant(s, overrides->tenant_id(), overrides->mutable_tenant_id());
          rc != kExitOk) {
        return rc;
      }
      v1::SetSlaOverridesResponse response;
      grpc::Status status = v1::SlaAdminService::NewStub(s.channel)->SetSlaOverrides(
          s.Context().get(), *overrides, &response);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(response, std::cout);
      return kExitOk;
    };
  });
}

}  // namespace

void AddSlaCommands(CLI::App& app, Action* action) {
  AddTenantCommand(app, action);
  AddAdminCommandsForSla(app, action);
}

}  // namespace sv::cli
