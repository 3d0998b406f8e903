// LibraryService, LibraryAdminService, MarketplaceService and
// MarketplaceAdminService (docs/marketplace.md), and the ports, mounts and
// app of instances in the API.
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "api/internal/instance_extras.h"
#include "api/internal/service_util.h"
#include "api/validation.h"
#include "billing/billing.h"
#include "common/ids.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"
#include "spdlog/spdlog.h"
#include "store/marketplace_store.h"
#include "sv/v1/marketplace.grpc.pb.h"

namespace sv::api::internal {
namespace {

constexpr int kMarketPageDefault = 100;
constexpr size_t kTextLengthMax = 1000;
constexpr size_t kImageRefLengthMax = 255;

absl::Status Invalid(absl::string_view reason, absl::string_view message) {
  return Error(absl::StatusCode::kInvalidArgument, reason, message);
}

// Library item and app names: [a-z0-9][a-z0-9._-]{0,62}.
bool IsCatalogName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  auto ok = [](char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           (!first && (c == '.' || c == '_' || c == '-'));
  };
  for (size_t i = 0; i < name.size(); ++i) {
    if (!ok(name[i], i == 0)) return false;
  }
  return true;
}

absl::Status CheckPorts(const std::vector<int>& ports) {
  if (static_cast<int>(ports.size()) > store::kInstancePortsMax) {
    return Invalid("TOO_MANY_PORTS", absl::StrCat("at most ", store::kInstancePortsMax, " ports"));
  }
  std::set<int> seen;
  for (int p : ports) {
    if (p < 1 || p > 65535) return Invalid("INVALID_PORT", "ports must be 1 to 65535");
    if (!seen.insert(p).second) {
      return Invalid("DUPLICATE_PORT", absl::StrCat("port ", p, " is listed twice"));
    }
  }
  return absl::OkStatus();
}

void ToProto(const store::LibraryItemRecord& r, v1::LibraryItem* out) {
  out->set_name(r.name);
  out->set_kind(r.kind == "model" ? v1::MODEL : v1::DATASET);
  out->set_size_bytes(r.size_bytes);
  out->set_source(r.source);
  out->set_description(r.description);
  *out->mutable_create_time() = internal::ToProto(r.created_at);
}

void ToProto(const store::ImageRecord& r, v1::MarketplaceImage* out) {
  out->set_id(r.id);
  out->set_publisher_tenant_id(r.publisher_tenant_id);
  out->set_name(r.name);
  out->set_version(r.version);
  out->set_image(r.image);
  out->set_description(r.description);
  for (int p : r.ports) out->add_ports(p);
  out->set_gpu_count(r.gpu_count);
  out->set_price_per_hour_micros(r.price_per_hour_micros);
  out->set_listed(r.listed);
  *out->mutable_create_time() = internal::ToProto(r.created_at);
}

// ---- Library ----------------------------------------------------------------

class LibraryServiceImpl final : public v1::LibraryService::Service {
 public:
  LibraryServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : auth_(auth), market_(deps.store->database()) {}

  grpc::Status ListLibraryItems(grpc::ServerContext* context,
                                const v1::ListLibraryItemsRequest* request,
                                v1::ListLibraryItemsResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListLibraryItems", nullptr, "", who.status());
    auto run = [&]() -> absl::Status {
      SV_ASSIGN_OR_RETURN(int page,
                          NormalizePageSize(request->page_size(), kMarketPageDefault));
      SV_ASSIGN_OR_RETURN(auto items, market_.ListLibraryItems(request->page_token(), page + 1));
      const bool more = static_cast<int>(items.size()) > page;
      if (more) items.resize(page);
      for (const auto& i : items) ToProto(i, response->add_items());
      if (more) response->set_next_page_token(items.back().name);
      return absl::OkStatus();
    };
    return Finish("ListLibraryItems", &*who, "", run());
  }

  grpc::Status GetLibraryItem(grpc::ServerContext* context,
                              const v1::GetLibraryItemRequest* request,
                              v1::LibraryItem* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetLibraryItem", nullptr, "", who.status());
    auto item = market_.GetLibraryItem(request->name());
    if (item.ok()) ToProto(*item, response);
    return Finish("GetLibraryItem", &*who, "", item.status());
  }

 private:
  const Authenticator& auth_;
  store::MarketplaceStore market_;
};

class LibraryAdminServiceImpl final : public v1::LibraryAdminService::Service {
 public:
  LibraryAdminServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), market_(deps.store->database()) {}

  grpc::Status CreateLibraryItem(grpc::ServerContext* context,
                                 const v1::CreateLibraryItemRequest* request,
                                 v1::LibraryItem* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("CreateLibraryItem", nullptr, "", who.status());
    auto run = [&]() -> absl::Status {
      const v1::LibraryItem& in = request->item();
      if (!IsCatalogName(in.name())) {
        return Invalid("INVALID_NAME",
                       "name must be 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a "
                       "letter or digit");
      }
      if (in.kind() != v1::MODEL && in.kind() != v1::DATASET) {
        return Invalid("INVALID_KIND", "kind must be MODEL or DATASET");
      }
      if (in.size_bytes() < 0) return Invalid("INVALID_SIZE", "size_bytes must not be negative");
      if (in.source().empty() || in.source().size() > kTextLengthMax ||
          in.description().size() > kTextLengthMax) {
        return Invalid("INVALID_SOURCE",
                       "source is required; source and description hold at most 1000 characters");
      }
      SV_RETURN_IF_ERROR(CheckFreeText("source", in.source(), "INVALID_SOURCE", false));
      SV_RETURN_IF_ERROR(
          CheckFreeText("description", in.description(), "INVALID_DESCRIPTION", true));
      store::LibraryItemRecord item{in.name(), in.kind() == v1::MODEL ? "model" : "dataset",
                                    in.size_bytes(), in.source(), in.description(), {}};
      SV_ASSIGN_OR_RETURN(auto created, market_.CreateLibraryItem(item, deps_.clock->Now()));
      ToProto(created, response);
      spdlog::info("api: operator {} published library item {}", who->user_email, in.name());
      return absl::OkStatus();
    };
    return Finish("CreateLibraryItem", &*who, "", run());
  }

  grpc::Status DeleteLibraryItem(grpc::ServerContext* context,
                                 const v1::DeleteLibraryItemRequest* request,
                                 v1::DeleteLibraryItemResponse*) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("DeleteLibraryItem", nullptr, "", who.status());
    return Finish("DeleteLibraryItem", &*who, "",
                  market_.DeleteLibraryItem(request->name(), deps_.clock->Now()));
  }

 private:
  ApiDependencies deps_;
  const Authenticator& auth_;
  store::MarketplaceStore market_;
};

// ---- Marketplace ------------------------------------------------------------

class MarketplaceServiceImpl final : public v1::MarketplaceService::Service {
 public:
  MarketplaceServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), market_(deps.store->database()) {}

  grpc::Status RegisterImage(grpc::ServerContext* context,
                             const v1::RegisterImageRequest* request,
                             v1::MarketplaceImage* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("RegisterImage", nullptr, request->request_id(), who.status());
    return Finish("RegisterImage", &*who, request->request_id(),
                  Register(*who, *request, response));
  }

  grpc::Status ListImages(grpc::ServerContext* context, const v1::ListImagesRequest* request,
                          v1::ListImagesResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListImages", nullptr, "", who.status());
    auto run = [&]() -> absl::Status {
      SV_ASSIGN_OR_RETURN(int page,
                          NormalizePageSize(request->page_size(), kMarketPageDefault));
      SV_ASSIGN_OR_RETURN(auto images,
                          market_.ListImages(request->mine() ? who->tenant_id : "",
                                             request->page_token(), page + 1));
      const bool more = static_cast<int>(images.size()) > page;
      if (more) images.resize(page);
      for (const auto& i : images) ToProto(i, response->add_images());
      if (more) response->set_next_page_token(images.back().id);
      return absl::OkStatus();
    };
    return Finish("ListImages", &*who, "", run());
  }

  grpc::Status GetImage(grpc::ServerContext* context, const v1::GetImageRequest* request,
                        v1::MarketplaceImage* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetImage", nullptr, "", who.status());
    absl::Status status = CheckRef(request->id());
    if (status.ok()) {
      auto image = market_.ResolveImage(request->id());
      // Another publisher's delisted image is as good as gone.
      if (image.ok() && !image->listed && image->publisher_tenant_id != who->tenant_id) {
        image = Error(absl::StatusCode::kNotFound, "IMAGE_NOT_FOUND",
                      absl::StrCat("no marketplace image '", request->id(), "'"));
      }
      status = image.status();
      if (image.ok()) ToProto(*image, response);
    }
    return Finish("GetImage", &*who, "", status);
  }

  grpc::Status DelistImage(grpc::ServerContext* context, const v1::DelistImageRequest* request,
                           v1::MarketplaceImage* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("DelistImage", nullptr, "", who.status());
    auto image = market_.DelistImage(who->tenant_id, request->id());
    if (image.ok()) ToProto(*image, response);
    return Finish("DelistImage", &*who, "", image.status());
  }

  grpc::Status LaunchApp(grpc::ServerContext* context, const v1::LaunchAppRequest* request,
                         v1::Instance* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("LaunchApp", nullptr, request->request_id(), who.status());
    return Finish("LaunchApp", &*who, request->request_id(), Launch(*who, *request, response));
  }

  grpc::Status GetPublisherEarnings(grpc::ServerContext* context,
                                    const v1::PublisherEarningsRequest* request,
                                    v1::PublisherEarnings* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("GetPublisherEarnings", nullptr, "", who.status());
    auto run = [&]() -> absl::Status {
      // Checked as every other service checks a time: unchecked, a time
      // PostgreSQL cannot take was INTERNAL (REST refused it, gRPC did not).
      absl::Time from = absl::UnixEpoch();
      absl::Time to = deps_.clock->Now() + absl::Hours(1);
      if (request->has_start_time()) {
        SV_ASSIGN_OR_RETURN(from, TimeField("start_time", request->start_time()));
      }
      if (request->has_end_time()) {
        SV_ASSIGN_OR_RETURN(to, TimeField("end_time", request->end_time()));
      }
      if (to < from) return Invalid("INVALID_TIME_RANGE", "end_time is before start_time");
      SV_ASSIGN_OR_RETURN(auto report, market_.Earnings(who->tenant_id, from, to));
      response->set_publisher_tenant_id(report.publisher_tenant_id);
      response->set_fees_micros(report.fees_micros);
      response->set_publisher_share_micros(report.publisher_share_micros);
      response->set_platform_share_micros(report.fees_micros - report.publisher_share_micros);
      response->set_paid_out_micros(report.paid_out_micros);
      response->set_payable_balance_micros(report.payable_balance_micros);
      for (const auto& row : report.images) {
        auto* out = response->add_images();
        out->set_image_id(row.image_id);
        out->set_name(row.name);
        out->set_version(row.version);
        out->set_billed_minutes(row.billed_minutes);
        out->set_fees_micros(row.fees_micros);
        out->set_publisher_share_micros(row.publisher_share_micros);
      }
      return absl::OkStatus();
    };
    return Finish("GetPublisherEarnings", &*who, "", run());
  }

  grpc::Status ListPayouts(grpc::ServerContext* context, const v1::ListPayoutsRequest* request,
                           v1::ListPayoutsResponse* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("ListPayouts", nullptr, "", who.status());
    auto run = [&]() -> absl::Status {
      SV_ASSIGN_OR_RETURN(int page,
                          NormalizePageSize(request->page_size(), kMarketPageDefault));
      SV_ASSIGN_OR_RETURN(auto payouts,
                          market_.ListPayouts(who->tenant_id, request->page_token(), page + 1));
      const bool more = static_cast<int>(payouts.size()) > page;
      if (more) payouts.resize(page);
      for (const auto& p : payouts) {
        auto* out = response->add_payouts();
        out->set_reference(p.reference);
        out->set_publisher_tenant_id(p.publisher_tenant_id);
        out->set_amount_micros(p.amount_micros);
        out->set_note(p.note);
        *out->mutable_create_time() = internal::ToProto(p.at);
      }
      if (more) response->set_next_page_token(payouts.back().reference);
      return absl::OkStatus();
    };
    return Finish("ListPayouts", &*who, "", run());
  }

 private:
  static absl::Status CheckRef(const std::string& ref) {
    if (ref.empty() || ref.size() > kImageRefLengthMax) {
      return Invalid("INVALID_APP", "name an app: an image id, name or name:version");
    }
    return absl::OkStatus();
  }

  absl::Status Register(const store::Principal& who, const v1::RegisterImageRequest& request,
                        v1::MarketplaceImage* response) {
    const v1::MarketplaceImage& in = request.image();
    if (!IsCatalogName(in.name())) {
      return Invalid("INVALID_NAME",
                     "name must be 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a "
                     "letter or digit");
    }
    bool version_ok = !in.version().empty() && in.version().size() <= 32 &&
                      std::isalnum(static_cast<unsigned char>(in.version()[0]));
    for (char c : in.version()) {
      version_ok = version_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' ||
                                  c == '_' || c == '-');
    }
    if (!version_ok) {
      return Invalid("INVALID_VERSION", "version must be 1 to 32 of A-Z, a-z, 0-9, '.', '_', '-'");
    }
    SV_RETURN_IF_ERROR(ValidateImageRef(in.image()));
    SV_RETURN_IF_ERROR(CheckImageIsUsable(in.image(), deps_.app_registry, who.tenant_id));
    // A priced app's image must be one only the marketplace can hand out:
    // else a buyer creates an instance of it directly and pays no fee, and
    // a publisher could price a public image (pytorch/pytorch) everyone runs.
    if (in.price_per_hour_micros() > 0 &&
        ImageNamespaceTenant(in.image(), deps_.app_registry) != who.tenant_id) {
      return Invalid("IMAGE_NOT_IN_NAMESPACE",
                     absl::StrCat("a priced app's image must be in your namespace of the app "
                                  "registry: push it to ", deps_.app_registry, "/",
                                  who.tenant_id, "/ and publish that reference"));
    }
    if (in.description().size() > kTextLengthMax) {
      return Invalid("INVALID_DESCRIPTION", "description holds at most 1000 characters");
    }
    SV_RETURN_IF_ERROR(
        CheckFreeText("description", in.description(), "INVALID_DESCRIPTION", true));
    std::vector<int> ports(in.ports().begin(), in.ports().end());
    SV_RETURN_IF_ERROR(CheckPorts(ports));
    SV_RETURN_IF_ERROR(ValidateGpuCount(in.gpu_count()));
    if (in.price_per_hour_micros() < 0 || in.price_per_hour_micros() > 1'000'000'000) {
      return Invalid("INVALID_PRICE", "price_per_hour_micros must be 0 to 1000000000 (1000 CNY)");
    }
    std::string request_id = request.request_id();
    if (request_id.empty()) {
      request_id = NewUuid();
    } else {
      SV_RETURN_IF_ERROR(ValidateRequestId(request_id));
    }
    store::ImageRecord image;
    image.name = in.name();
    image.version = in.version();
    image.image = in.image();
    image.description = in.description();
    image.ports = ports;
    image.gpu_count = in.gpu_count();
    image.price_per_hour_micros = in.price_per_hour_micros();
    SV_ASSIGN_OR_RETURN(auto created, market_.RegisterImage(who.tenant_id, image, request_id,
                                                            deps_.clock->Now()));
    spdlog::info("api: image {} {}:{} published by tenant={} at {} micro-yuan/h", created.id,
                 created.name, created.version, who.tenant_id, created.price_per_hour_micros);
    ToProto(created, response);
    return absl::OkStatus();
  }

  absl::Status Launch(const store::Principal& who, const v1::LaunchAppRequest& request,
                      v1::Instance* response) {
    SV_RETURN_IF_ERROR(CheckRef(request.app()));
    // A retry of a launch that was made names the image it launched, even
    // if a newer version is listed or this one was delisted since; it is
    // answered with that launch (the create's idempotency lookup), not
    // held to today's catalog or wallet. Any other use of a request_id
    // already taken is refused first, whatever the catalog or the wallet
    // would have said.
    std::optional<store::MarketplaceStore::EarlierCreate> earlier;
    if (!request.request_id().empty()) {
      SV_ASSIGN_OR_RETURN(earlier, market_.EarlierCreateOf(who.tenant_id, request.request_id()));
    }
    if (earlier.has_value()) {
      const std::optional<store::ImageRecord>& launched = earlier->image;
      const bool same_app =
          launched.has_value() &&
          (request.app() == launched->id || request.app() == launched->name ||
           request.app() == absl::StrCat(launched->name, ":", launched->version));
      if (!same_app) {
        return Error(absl::StatusCode::kAlreadyExists, "REQUEST_ID_REUSED",
                     absl::StrCat("request_id '", request.request_id(),
                                  "' was already used for instance ", earlier->instance_id,
                                  launched.has_value()
                                      ? absl::StrCat(", a launch of ", launched->name, ":",
                                                     launched->version)
                                      : std::string(", which is not an app launch")));
      }
    }
    const bool retry = earlier.has_value();
    store::ImageRecord image;
    if (retry) {
      image = *std::move(earlier->image);
    } else {
      SV_ASSIGN_OR_RETURN(image, market_.ResolveImage(request.app()));
    }
    if (!retry && !image.listed) {
      return Error(absl::StatusCode::kFailedPrecondition, "IMAGE_DELISTED",
                   absl::StrCat(image.name, ":", image.version, " is no longer offered"));
    }
    if (!retry && image.publisher_suspended) {
      return Error(absl::StatusCode::kFailedPrecondition, "PUBLISHER_SUSPENDED",
                   absl::StrCat(image.name, ":", image.version,
                                " is not offered while its publisher is suspended"));
    }
    const int gpus = request.gpu_count() == 0 ? image.gpu_count : request.gpu_count();
    if (gpus < image.gpu_count) {
      return Invalid("TOO_FEW_GPUS", absl::StrCat(image.name, " needs at least ",
                                                  image.gpu_count, " GPUs"));
    }
    v1::Instance in;
    in.set_name(request.name().empty() ? image.name : request.name());
    // App names may hold '.' and '_', instance names may not.
    std::string name = in.name();
    for (char& c : name) {
      if (c == '.' || c == '_') c = '-';
    }
    if (!name.empty() && !(name[0] >= 'a' && name[0] <= 'z')) name = "app-" + name;
    in.set_name(name);
    in.set_gpu_count(gpus);
    in.set_image(image.image);
    for (int p : image.ports) in.add_ports()->set_container_port(p);
    for (const auto& m : request.library_mounts()) in.add_library_mounts(m);
    store::InstanceSpec spec{in.name(), in.gpu_count(), "", in.image(), 0};
    SV_RETURN_IF_ERROR(ReadInstanceExtras(in, spec));
    spec.extras.app_image_id = image.id;
    if (!retry && image.price_per_hour_micros > 0 && deps_.billing != nullptr) {
      // The create's own gate checks the rent only. Without this a buyer
      // with trial credit alone got an instance that ran one minute and
      // stopped for its unpaid fee.
      SV_ASSIGN_OR_RETURN(store::InstanceSpec normal, NormalizeInstanceSpec(spec));
      SV_RETURN_IF_ERROR(deps_.billing->CheckCreditForCreate(
          who.tenant_id, normal.gpu_count, normal.gpu_model, deps_.clock->Now(),
          image.price_per_hour_micros));
    }
    return CreateInstanceFor(deps_, who, std::move(spec), request.request_id(), response);
  }

  ApiDependencies deps_;
  const Authenticator& auth_;
  store::MarketplaceStore market_;
};

class MarketplaceAdminServiceImpl final : public v1::MarketplaceAdminService::Service {
 public:
  MarketplaceAdminServiceImpl(const ApiDependencies& deps, const Authenticator& auth)
      : deps_(deps), auth_(auth), market_(deps.store->database()) {}

  grpc::Status RecordPayout(grpc::ServerContext* context, const v1::RecordPayoutRequest* request,
                            v1::Payout* response) override {
    auto who = auth_.Authenticate(*context);
    if (!who.ok()) return Finish("RecordPayout", nullptr, request->reference(), who.status());
    auto run = [&]() -> absl::Status {
      if (request->amount_micros() <= 0) {
        return Invalid("INVALID_AMOUNT", "amount_micros must be positive");
      }
      SV_RETURN_IF_ERROR(ValidateRequestId(request->reference()));
      if (request->note().size() > kTextLengthMax) {
        return Invalid("INVALID_NOTE", "note holds at most 1000 characters");
      }
      SV_RETURN_IF_ERROR(CheckFreeText("note", request->note(), "INVALID_NOTE", true));
      SV_ASSIGN_OR_RETURN(auto payout,
                          market_.RecordPayout(request->publisher_tenant_id(),
                                               request->amount_micros(), request->reference(),
                                               request->note(), deps_.clock->Now()));
      response->set_reference(payout.reference);
      response->set_publisher_tenant_id(payout.publisher_tenant_id);
      response->set_amount_micros(payout.amount_micros);
      response->set_note(payout.note);
      *response->mutable_create_time() = internal::ToProto(payout.at);
      spdlog::info("api: operator {} paid out {} micro-yuan to publisher {} ({})",
                   who->user_email, payout.amount_micros, payout.publisher_tenant_id,
                   payout.reference);
      return absl::OkStatus();
    };
    return Finish("RecordPayout", &*who, request->reference(), run());
  }

 private:
  ApiDependencies deps_;
  const Authenticator& auth_;
  store::MarketplaceStore market_;
};

}  // namespace

// ---- Instances: ports, mounts, app ------------------------------------------

absl::Status ReadInstanceExtras(const v1::Instance& in, store::InstanceSpec& spec) {
  std::vector<int> tcp;
  std::set<std::pair<int, std::string>> seen;
  if (in.ports_size() > store::kInstancePortsMax) {
    return Invalid("TOO_MANY_PORTS", absl::StrCat("at most ", store::kInstancePortsMax, " ports"));
  }
  for (const auto& p : in.ports()) {
    const std::string protocol = p.protocol().empty() ? "tcp" : p.protocol();
    if (protocol != "tcp" && protocol != "udp") {
      return Invalid("INVALID_PORT", "a port's protocol must be tcp or udp");
    }
    if (p.container_port() < 1 || p.container_port() > 65535) {
      return Invalid("INVALID_PORT", "ports must be 1 to 65535");
    }
    if (!seen.insert({p.container_port(), protocol}).second) {
      return Invalid("DUPLICATE_PORT",
                     absl::StrCat("port ", p.container_port(), "/", protocol, " is listed twice"));
    }
    spec.extras.ports.push_back({p.container_port(), protocol});
  }
  if (in.library_mounts_size() > store::kInstanceLibraryMountsMax) {
    return Invalid("TOO_MANY_MOUNTS",
                   absl::StrCat("at most ", store::kInstanceLibraryMountsMax, " library mounts"));
  }
  std::set<std::string> names;
  for (const auto& name : in.library_mounts()) {
    if (!IsCatalogName(name)) {
      return Invalid("UNKNOWN_LIBRARY_ITEM",
                     absl::StrCat("'", name, "' is not a library item name"));
    }
    if (names.insert(name).second) spec.extras.library_mounts.push_back(name);
  }
  return absl::OkStatus();
}

std::string ExtrasFingerprint(const store::InstanceExtras& extras) {
  if (extras.ports.empty() && extras.library_mounts.empty() && extras.app_image_id.empty()) {
    return "";
  }
  std::string text = "extras";
  for (const auto& p : extras.ports) absl::StrAppend(&text, "\nport ", p.container_port, p.protocol);
  for (const auto& m : extras.library_mounts) absl::StrAppend(&text, "\nmount ", m);
  absl::StrAppend(&text, "\napp ", extras.app_image_id);
  return ":" + Sha256Hex(text);
}

absl::Status AddInstanceExtras(store::Store& store, const std::string& tenant_id,
                               const std::vector<v1::Instance*>& instances) {
  std::vector<std::string> ids;
  for (const v1::Instance* i : instances) ids.push_back(i->id());
  SV_ASSIGN_OR_RETURN(auto extras,
                      store::MarketplaceStore(store.database()).ExtrasOf(tenant_id, ids));
  for (v1::Instance* i : instances) {
    auto it = extras.find(i->id());
    if (it == extras.end()) continue;
    i->clear_ports();
    for (const auto& p : it->second.ports) {
      auto* out = i->add_ports();
      out->set_container_port(p.container_port);
      out->set_protocol(p.protocol);
      out->set_node_port(p.node_port);
      out->set_url(p.url);
    }
    i->clear_library_mounts();
    for (const auto& m : it->second.library_mounts) i->add_library_mounts(m);
    i->set_app_image_id(it->second.app_image_id);
    i->clear_volume_ids();
    for (const auto& v : it->second.volume_ids) i->add_volume_ids(v);
  }
  return absl::OkStatus();
}

std::unique_ptr<grpc::Service> NewLibraryService(const ApiDependencies& deps,
                                                 const Authenticator& auth) {
  return std::make_unique<LibraryServiceImpl>(deps, auth);
}
std::unique_ptr<grpc::Service> NewLibraryAdminService(const ApiDependencies& deps,
                                                      const Authenticator& auth) {
  return std::make_unique<LibraryAdminServiceImpl>(deps, auth);
}
std::unique_ptr<grpc::Service> NewMarketplaceService(const ApiDependencies& deps,
                                                     const Authenticator& auth) {
  return std::make_unique<MarketplaceServiceImpl>(deps, auth);
}
std::unique_ptr<grpc::Service> NewMarketplaceAdminService(const ApiDependencies& deps,
                                                          const Authenticator& auth) {
  return std::make_unique<MarketplaceAdminServiceImpl>(deps, auth);
}

}  // namespace sv::api::internal
