#ifndef SV_STORE_MARKETPLACE_STORE_H_
#define SV_STORE_MARKETPLACE_STORE_H_

// The public library, the app marketplace (images, launches, publisher
// earnings and payouts) and the ports and mounts an instance declares. See
// docs/marketplace.md.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <pqxx/pqxx>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"

namespace sv::store {

struct LibraryItemRecord {
  std::string name;
  std::string kind;  // "model" or "dataset"
  int64_t size_bytes = 0;
  std::string source;
  std::string description;
  absl::Time created_at;
};

struct ImageRecord {
  std::string id;
  std::string publisher_tenant_id;
  std::string name;
  std::string version;
  std::string image;
  std::string description;
  std::vector<int> ports;
  int gpu_count = 1;
  int64_t price_per_hour_micros = 0;
  bool listed = true;
  absl::Time created_at;
  // The publisher is suspended: the image is left out of the catalog and
  // cannot be launched (its running instances go on).
  bool publisher_suspended = false;
};

struct PortDecl {
  int container_port = 0;
  std::string protocol = "tcp";
};

// What an instance asks for besides GPUs, written in its create transaction.
struct InstanceExtras {
  std::vector<PortDecl> ports;
  std::vector<std::string> library_mounts;
  std::string app_image_id;  // Empty: no app.
};

struct InstancePortView {
  int container_port = 0;
  std::string protocol;
  int node_port = 0;  // 0 until placed.
  std::string url;
};

struct InstanceExtrasView {
  std::vector<InstancePortView> ports;
  std::vector<std::string> library_mounts;
  std::string app_image_id;
  std::vector<std::string> volume_ids;
};

struct ImageEarningsRow {
  std::string image_id;
  std::string name;
  std::string version;
  int64_t billed_minutes = 0;
  int64_t fees_micros = 0;
  int64_t publisher_share_micros = 0;
};

struct EarningsReport {
  std::string publisher_tenant_id;
  int64_t fees_micros = 0;
  int64_t publisher_share_micros = 0;
  int64_t paid_out_micros = 0;
  int64_t payable_balance_micros = 0;
  std::vector<ImageEarningsRow> images;
};

struct PayoutRecord {
  std::string reference;
  std::string publisher_tenant_id;
  int64_t amount_micros = 0;
  std::string note;
  absl::Time at;
};

inline constexpr int kInstancePortsMax = 16;
// The smallest node port range an agent may register: one instance per GPU
// of an 8-GPU node, each with the most ports an instance may declare.
inline constexpr int kNodePortsMin = 8 * kInstancePortsMax;
inline constexpr int kInstanceLibraryMountsMax = 16;

// Writes the extras of a new instance; INVALID_ARGUMENT / UNKNOWN_LIBRARY_ITEM
// for a name not in the library. Called inside Store::CreateInstance.
absl::Status InsertInstanceExtras(pqxx::work& txn, const std::string& instance_id,
                                  const InstanceExtras& extras);

class MarketplaceStore {
 public:
  explicit MarketplaceStore(Database& db) : db_(db) {}

  // Library.
  absl::StatusOr<LibraryItemRecord> CreateLibraryItem(const LibraryItemRecord& item,
                                                      absl::Time now);
  absl::Status DeleteLibraryItem(const std::string& name, absl::Time now);
  absl::StatusOr<std::vector<LibraryItemRecord>> ListLibraryItems(const std::string& after_name,
                                                                  int limit);
  absl::StatusOr<LibraryItemRecord> GetLibraryItem(const std::string& name);

  // Images.
  absl::StatusOr<ImageRecord> RegisterImage(const std::string& publisher_tenant_id,
                                            const ImageRecord& image,
                                            const std::string& request_id, absl::Time now);
  // `ref`: an image id, "name" (newest listed version) or "name:version".
  absl::StatusOr<ImageRecord> ResolveImage(const std::string& ref);
  // The tenant's earlier create with `request_id`, if one was made, and
  // the image it launched (none for a plain create): a retry of a launch
  // gets that launch's answer, whatever the catalog lists or the wallet
  // holds now, and any other reuse of the request_id is refused before
  // them.
  struct EarlierCreate {
    std::string instance_id;
    std::optional<ImageRecord> image;
  };
  absl::StatusOr<std::optional<EarlierCreate>> EarlierCreateOf(const std::string& tenant_id,
                                                               const std::string& request_id);
  absl::StatusOr<std::vector<ImageRecord>> ListImages(const std::string& publisher_tenant_id,
                                                      const std::string& after_id, int limit);
  absl::StatusOr<ImageRecord> DelistImage(const std::string& publisher_tenant_id,
                                          const std::string& id);

  // Publishers.
  absl::StatusOr<EarningsReport> Earnings(const std::string& publisher_tenant_id,
                                          absl::Time from, absl::Time to);
  absl::StatusOr<PayoutRecord> RecordPayout(const std::string& publisher_tenant_id,
                                            int64_t amount_micros, const std::string& reference,
                                            const std::string& note, absl::Time now);
  absl::StatusOr<std::vector<PayoutRecord>> ListPayouts(const std::string& publisher_tenant_id,
                                                        const std::string& after_reference,
                                                        int limit);

  // Ports (with URLs), library mounts, app and volumes of instances.
  absl::StatusOr<std::map<std::string, InstanceExtrasView>> ExtrasOf(
      const std::string& tenant_id, const std::vector<std::string>& instance_ids);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_MARKETPLACE_STORE_H_
