#ifndef SV_STORE_VOLUME_STORE_H_
#define SV_STORE_VOLUME_STORE_H_

// Cloud disks (volumes): create, list, delete, attach, detach and move,
// scoped by tenant (another tenant's volume or instance is NOT_FOUND). Each
// method is one transaction; the volume row is locked first, so attaches
// of one volume serialize and a second writer is refused, not raced. See
// docs/storage.md.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "store/database.h"
#include "store/store.h"

namespace sv::store {

enum class VolumeKind { kNodeLocal, kNetwork };
enum class AttachmentState { kAttaching, kAttached, kDetaching };

struct VolumeSpec {
  std::string name;
  int size_gib = 0;
  VolumeKind kind = VolumeKind::kNetwork;
  bool read_many = false;
  std::string node_id;  // Node-local only; may be empty.
};

struct AttachmentRecord {
  std::string instance_id;
  bool read_only = false;
  std::string mount_path;
  AttachmentState state = AttachmentState::kAttaching;
  std::string reason;
  absl::Time requested_at;
  std::optional<absl::Time> confirmed_at;
};

struct VolumeRecord {
  std::string id;
  std::string tenant_id;
  VolumeSpec spec;
  std::string request_id;
  absl::Time created_at;
  std::optional<absl::Time> deleted_at;
  std::string move_to_instance_id;
  std::vector<AttachmentRecord> attachments;
  // The first minute of its current run of unpaid storage (migration 0102).
  std::optional<absl::Time> unpaid_since;
};

struct VolumeListCursor {
  int64_t created_at_micros = 0;
  std::string id;
};

// Limits (docs/storage.md).
inline constexpr int kVolumeSizeGibMax = 65536;
inline constexpr int kTenantVolumesMax = 1000;
inline constexpr int kInstanceAttachmentsMax = 16;

struct VolumeCreateOutcome {
  VolumeRecord record;  // Unset when refused.
  std::optional<CreateRefusal> refusal;
};

class VolumeStore {
 public:
  explicit VolumeStore(Database& db) : db_(db) {}

  // The create gate, under the tenant's row lock after the request_id
  // lookup, as for instances (store::CreateGate; its trial fields are not
  // used): `credit_minutes` >= 0 refuses INSUFFICIENT_CREDIT unless the
  // tenant's credit (trial, plus the paid wallet or the receivable and its
  // limit) covers that many minutes of the volume's storage (needed,
  // available); `spend_cap_since_minute` >= 0 refuses SPEND_CAP_REACHED once
  // the month's spending reaches the tenant's cap (spent, cap). A refusal
  // writes nothing; the caller words it.
  absl::StatusOr<VolumeCreateOutcome> Create(const std::string& tenant_id,
                                             const VolumeSpec& spec,
                                             const std::string& request_id,
                                             const std::string& fingerprint, absl::Time now,
                                             const CreateGate& gate = {});
  absl::StatusOr<VolumeRecord> Get(const std::string& tenant_id, const std::string& id);
  absl::StatusOr<std::vector<VolumeRecord>> List(const std::string& tenant_id,
                                                 const std::optional<VolumeListCursor>& after,
                                                 int limit, bool show_deleted);
  // FAILED_PRECONDITION / VOLUME_ATTACHED while attached or moving.
  absl::StatusOr<VolumeRecord> Delete(const std::string& tenant_id, const std::string& id,
                                      absl::Time now);
  absl::StatusOr<VolumeRecord> Attach(const std::string& tenant_id, const std::string& volume_id,
                                      const std::string& instance_id, bool read_only,
                                      const std::string& mount_path, absl::Time now);
  absl::StatusOr<VolumeRecord> Detach(const std::string& tenant_id, const std::string& volume_id,
                                      const std::string& instance_id, absl::Time now);
  absl::StatusOr<VolumeRecord> Move(const std::string& tenant_id, const std::string& volume_id,
                                    const std::string& to_instance_id,
                                    const std::string& mount_path, absl::Time now);
  // Volume ids attached to each of the given instances of the tenant.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> AttachedTo(
      const std::string& tenant_id, const std::vector<std::string>& instance_ids);

 private:
  Database& db_;
};

}  // namespace sv::store

#endif  // SV_STORE_VOLUME_STORE_H_
