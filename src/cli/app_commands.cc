// svctl library list|get, svctl apps list|get|publish|delist|launch|
// earnings|payouts, svctl admin library add|remove and svctl admin payout
// (docs/marketplace.md).
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "common/ids.h"
#include "sv/v1/instance.grpc.pb.h"
#include "sv/v1/marketplace.grpc.pb.h"

namespace sv::cli {
namespace {

// Connects (as admin when asked) and runs the call.
template <typename Call>
Action Connected(bool admin, Call call) {
  return [admin, call](Session& s) {
    if (admin) s.flags.admin = true;
    std::string error;
    if (!s.Connect(&error)) return Fail(error);
    return call(s);
  };
}

void PrintImages(const v1::ListImagesResponse& list, Format format) {
  if (format == Format::kJson) {
    PrintJson(list, std::cout);
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"ID", "APP", "VERSION", "GPUS", "PORTS", "PRICE/HOUR", "LISTED"}};
  for (const auto& i : list.images()) {
    rows.push_back({i.id(), i.name(), i.version(), std::to_string(i.gpu_count()),
                    absl::StrJoin(i.ports(), ","), Yuan(i.price_per_hour_micros()),
                    i.listed() ? "yes" : "no"});
  }
  PrintTable(rows, std::cout);
}

void AddLibrary(CLI::App& app, Action* action) {
  auto* library = app.add_subcommand("library", "The public library of models and datasets");
  library->require_subcommand(1);
  auto* list = library->add_subcommand("list", "List the public library");
  list->callback([=] {
    *action = Connected(false, [](Session& s) {
      v1::LibraryService::Stub stub(s.channel);
      v1::ListLibraryItemsRequest request;
      v1::ListLibraryItemsResponse all;
      for (int page = 0; page < 1000; ++page) {
        v1::ListLibraryItemsResponse response;
        grpc::Status status = stub.ListLibraryItems(s.Context().get(), request, &response);
        if (!status.ok()) return FailRpc(status, s);
        for (const auto& i : response.items()) *all.add_items() = i;
        if (response.next_page_token().empty()) break;
        request.set_page_token(response.next_page_token());
      }
      if (s.format() == Format::kJson) {
        PrintJson(all, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {{"NAME", "KIND", "SIZE", "MOUNT", "SOURCE"}};
      for (const auto& i : all.items()) {
        rows.push_back({i.name(), i.kind() == v1::MODEL ? "model" : "dataset",
                        absl::StrCat(i.size_bytes() / (1 << 30), " GiB"), "/public/" + i.name(),
                        i.source()});
      }
      PrintTable(rows, std::cout);
      return kExitOk;
    });
  });
  auto name = std::make_shared<std::string>();
  auto* get = library->add_subcommand("get", "Show a library item");
  get->add_option("name", *name, "Item name")->required();
  get->callback([=] {
    *action = Connected(false, [=](Session& s) {
      v1::LibraryService::Stub stub(s.channel);
      v1::GetLibraryItemRequest request;
      request.set_name(*name);
      v1::LibraryItem item;
      grpc::Status status = stub.GetLibraryItem(s.Context().get(), request, &item);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(item, std::cout);
      return kExitOk;
    });
  });
}

void AddAdmin(CLI::App& app, Action* action) {
  CLI::App* admin = app.get_subcommand("admin");
  auto* library = admin->add_subcommand("library", "Manage the public library");
  library->require_subcommand(1);
  auto item = std::make_shared<v1::LibraryItem>();
  auto kind = std::make_shared<std::string>("model");
  auto size_gib = std::make_shared<int64_t>(0);
  auto* add = library->add_subcommand("add", "Publish a model or dataset");
  add->add_option("name", *item->mutable_name(), "Name, e.g. llama-2-70b")->required();
  add->add_option("--kind", *kind, "model or dataset")->check(CLI::IsMember({"model", "dataset"}));
  add->add_option("--size-gib", *size_gib, "Size in GiB");
  add->add_option("--source", *item->mutable_source(), "Where it comes from")->required();
  add->add_option("--description", *item->mutable_description(), "Description");
  add->callback([=] {
    *action = Connected(true, [=](Session& s) {
      v1::LibraryAdminService::Stub stub(s.channel);
      v1::CreateLibraryItemRequest request;
      *request.mutable_item() = *item;
      request.mutable_item()->set_kind(*kind == "model" ? v1::MODEL : v1::DATASET);
      request.mutable_item()->set_size_bytes(*size_gib * (int64_t{1} << 30));
      v1::LibraryItem created;
      grpc::Status status = stub.CreateLibraryItem(s.Context().get(), request, &created);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(created, std::cout);
      return kExitOk;
    });
  });
  auto remove_name = std::make_shared<std::string>();
  auto* rm = library->add_subcommand("remove", "Remove an item (existing mounts stay)");
  rm->add_option("name", *remove_name, "Item name")->required();
  rm->callback([=] {
    *action = Connected(true, [=](Session& s) {
      v1::LibraryAdminService::Stub stub(s.channel);
      v1::DeleteLibraryItemRequest request;
      request.set_name(*remove_name);
      v1::DeleteLibraryItemResponse response;
      grpc::Status status = stub.DeleteLibraryItem(s.Context().get(), request, &response);
      if (!status.ok()) return FailRpc(status, s);
      std::cout << "removed " << *remove_name << "\n";
      return kExitOk;
    });
  });

  auto payout = std::make_shared<v1::RecordPayoutRequest>();
  auto amount = std::make_shared<std::string>();
  auto* pay = admin->add_subcommand("payout", "Record a payout to a publisher");
  pay->add_option("tenant", *payout->mutable_publisher_tenant_id(),
                  "Publisher tenant id or name")
      ->required();
  pay->add_option("amount", *amount, "Amount in CNY, e.g. 100 or 12.50")->required();
  pay->add_option("--reference", *payout->mutable_reference(),
                  "The transfer's reference; a replay with it is a no-op")
      ->required();
  pay->add_option("--note", *payout->mutable_note(), "Note");
  pay->callback([=] {
    *action = Connected(true, [=](Session& s) {
      int64_t micros = 0;
      if (!ParseYuan(*amount, &micros)) return Fail(YuanSyntaxError("amount", *amount));
      v1::RecordPayoutRequest request = *payout;
      request.set_amount_micros(micros);
      if (int rc = ResolveTenant(s, payout->publisher_tenant_id(),
                                 request.mutable_publisher_tenant_id());
          rc != kExitOk) {
        return rc;
      }
      v1::MarketplaceAdminService::Stub stub(s.channel);
      v1::Payout recorded;
      grpc::Status status = stub.RecordPayout(s.Context().get(), request, &recorded);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(recorded, std::cout);
      return kExitOk;
    });
  });
}

struct LaunchArgs {
  std::string app, name, request_id;
  int gpus = 0;
  std::vector<std::string> mounts;
  bool wait = false;
  int wait_s = 300;
};

int RunLaunch(Session& s, const LaunchArgs& a) {
  v1::MarketplaceService::Stub stub(s.channel);
  v1::LaunchAppRequest request;
  request.set_app(a.app);
  request.set_name(a.name);
  request.set_gpu_count(a.gpus);
  for (const auto& m : a.mounts) request.add_library_mounts(m);
  request.set_request_id(a.request_id.empty() ? NewUuid() : a.request_id);
  v1::Instance instance;
  grpc::Status status = stub.LaunchApp(s.Context().get(), request, &instance);
  if (!status.ok()) return FailRpc(status, s);
  v1::InstanceService::Stub instances(s.channel);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.wait_s);
  while (a.wait && instance.state() != v1::RUNNING && instance.state() != v1::FAILED &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    v1::GetInstanceRequest get;
    get.set_id(instance.id());
    status = instances.GetInstance(s.Context().get(), get, &instance);
    if (!status.ok()) return FailRpc(status, s);
  }
  if (s.format() == Format::kJson) {
    PrintJson(instance, std::cout);
  } else {
    PrintInstanceDetail(instance, std::cout);
  }
  if (a.wait && instance.state() != v1::RUNNING) {
    return Fail("app instance " + instance.id() + " is " + StateName(instance.state()) + ": " +
                instance.state_reason());
  }
  return kExitOk;
}

void AddApps(CLI::App& app, Action* action) {
  auto* apps = app.add_subcommand("apps", "The app marketplace: browse, publish, launch");
  apps->require_subcommand(1);

  auto mine = std::make_shared<bool>(false);
  auto* list = apps->add_subcommand("list", "List the marketplace (or --mine)");
  list->add_flag("--mine", *mine, "Only the images my tenant publishes, listed or not");
  list->callback([=] {
    *action = Connected(false, [=](Session& s) {
      v1::MarketplaceService::Stub stub(s.channel);
      v1::ListImagesRequest request;
      request.set_mine(*mine);
      v1::ListImagesResponse all;
      for (int page = 0; page < 1000; ++page) {
        v1::ListImagesResponse response;
        grpc::Status status = stub.ListImages(s.Context().get(), request, &response);
        if (!status.ok()) return FailRpc(status, s);
        for (const auto& i : response.images()) *all.add_images() = i;
        if (response.next_page_token().empty()) break;
        request.set_page_token(response.next_page_token());
      }
      PrintImages(all, s.format());
      return kExitOk;
    });
  });

  auto ref = std::make_shared<std::string>();
  auto* get = apps->add_subcommand("get", "Show an app (id, name or name:version)");
  get->add_option("app", *ref, "App")->required();
  get->callback([=] {
    *action = Connected(false, [=](Session& s) {
      v1::MarketplaceService::Stub stub(s.channel);
      v1::GetImageRequest request;
      request.set_id(*ref);
      v1::MarketplaceImage image;
      grpc::Status status = stub.GetImage(s.Context().get(), request, &image);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(image, std::cout);
      return kExitOk;
    });
  });

  auto image = std::make_shared<v1::MarketplaceImage>();
  auto price = std::make_shared<std::string>("0");
  auto ports = std::make_shared<std::vector<int>>();
  auto request_id = std::make_shared<std::string>();
  auto* publish = apps->add_subcommand("publish", "Register an image as a publisher");
  publish->add_option("name", *image->mutable_name(), "App name")->required();
  publish->add_option("--version", *image->mutable_version(), "Version, e.g. 1.0")->required();
  publish->add_option("--image", *image->mutable_image(),
                      "Container image; a priced app's must be in your namespace of the app "
                      "registry, REGISTRY/TENANT_ID/... (docs/marketplace.md)")
      ->required();
  auto gpus = std::make_shared<int>(1);
  publish->add_option("--gpus", *gpus, "GPUs required");
  publish->add_option("--port", *ports, "Published port (repeatable), e.g. 7860");
  publish->add_option("--price-per-hour", *price, "CNY per hour on top of GPU rent, e.g. 0.6");
  publish->add_option("--description", *image->mutable_description(), "Description");
  publish->add_option("--request-id", *request_id, "Idempotency key (default: a fresh UUID)");
  publish->callback([=] {
    *action = Connected(false, [=](Session& s) {
      int64_t micros = 0;
      if (!ParseYuan(*price, &micros)) {
        return Fail(YuanSyntaxError("--price-per-hour", *price));
      }
      v1::RegisterImageRequest request;
      *request.mutable_image() = *image;
      request.mutable_image()->set_gpu_count(*gpus);
      request.mutable_image()->set_price_per_hour_micros(micros);
      for (int p : *ports) request.mutable_image()->add_ports(p);
      request.set_request_id(request_id->empty() ? NewUuid() : *request_id);
      v1::MarketplaceService::Stub stub(s.channel);
      v1::MarketplaceImage created;
      grpc::Status status = stub.RegisterImage(s.Context().get(), request, &created);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(created, std::cout);
      return kExitOk;
    });
  });

  auto* delist = apps->add_subcommand("delist", "Stop offering an image of yours");
  delist->add_option("id", *ref, "Image id")->required();
  delist->callback([=] {
    *action = Connected(false, [=](Session& s) {
      v1::MarketplaceService::Stub stub(s.channel);
      v1::DelistImageRequest request;
      request.set_id(*ref);
      v1::MarketplaceImage out;
      grpc::Status status = stub.DelistImage(s.Context().get(), request, &out);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(out, std::cout);
      return kExitOk;
    });
  });

  auto launch = std::make_shared<LaunchArgs>();
  auto* l = apps->add_subcommand("launch", "Launch an app as an instance");
  l->add_option("app", launch->app, "App: image id, name or name:version")->required();
  l->add_option("--name", launch->name, "Instance name");
  l->add_option("--gpus", launch->gpus, "GPUs (default: what the app needs)");
  l->add_option("--mount", launch->mounts, "Public library item to mount (repeatable)");
  l->add_option("--request-id", launch->request_id, "Idempotency key");
  l->add_flag("--wait", launch->wait, "Wait until it runs");
  l->add_option("--wait-timeout", launch->wait_s, "How long --wait waits, seconds");
  l->callback([=] {
    *action = Connected(false, [=](Session& s) { return RunLaunch(s, *launch); });
  });

  auto* earnings = apps->add_subcommand("earnings", "My tenant's earnings as a publisher");
  earnings->callback([=] {
    *action = Connected(false, [](Session& s) {
      v1::MarketplaceService::Stub stub(s.channel);
      v1::PublisherEarnings report;
      grpc::Status status =
          stub.GetPublisherEarnings(s.Context().get(), v1::PublisherEarningsRequest(), &report);
      if (!status.ok()) return FailRpc(status, s);
      if (s.format() == Format::kJson) {
        PrintJson(report, std::cout);
        return kExitOk;
      }
      std::vector<std::vector<std::string>> rows = {
          {"APP", "VERSION", "MINUTES", "FEES", "MY 70%"}};
      for (const auto& i : report.images()) {
        rows.push_back({i.name(), i.version(), std::to_string(i.billed_minutes()),
                        Yuan(i.fees_micros()), Yuan(i.publisher_share_micros())});
      }
      rows.push_back({"total", "", "", Yuan(report.fees_micros()),
                      Yuan(report.publisher_share_micros())});
      PrintTable(rows, std::cout);
      std::cout << "paid out: " << Yuan(report.paid_out_micros())
                << "\nowed now: " << Yuan(report.payable_balance_micros()) << "\n";
      return kExitOk;
    });
  });

  auto* payouts = apps->add_subcommand("payouts", "Payouts to my tenant as a publisher");
  payouts->callback([=] {
    *action = Connected(false, [](Session& s) {
      v1::MarketplaceService::Stub stub(s.channel);
      v1::ListPayoutsResponse response;
      grpc::Status status =
          stub.ListPayouts(s.Context().get(), v1::ListPayoutsRequest(), &response);
      if (!status.ok()) return FailRpc(status, s);
      PrintJson(response, std::cout);
      return kExitOk;
    });
  });
}

}  // namespace

void AddAppCommands(CLI::App& app, Action* action) {
  AddLibrary(app, action);
  AddApps(app, action);
  AddAdmin(app, action);
}

}  // namespace sv::cli
