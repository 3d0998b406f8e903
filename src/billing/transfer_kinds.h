#ifndef SV_BILLING_TRANSFER_KINDS_H_
#define SV_BILLING_TRANSFER_KINDS_H_

// Header only, with no dependencies, so that svctl can name the kinds
// without linking the billing library.

namespace sv::billing {

// Every kind a ledger transfer may have: the CHECK on ledger_transfers.kind
// (migration 0109). A filter naming another kind is refused, not answered
// with an empty page that looks like "no such transfers".
inline constexpr const char* kTransferKinds[] = {
    "charge", "trial_grant", "trial_expiry", "topup",   "sla_refund",
    "adjustment", "app_fee", "storage",     "payout", "balance_move",
    "credit",     "topup_refund"};

}  // namespace sv::billing

#endif  // SV_BILLING_TRANSFER_KINDS_H_
