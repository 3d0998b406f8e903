#ifndef SV_SERVER_TLS_H_
#define SV_SERVER_TLS_H_

// gRPC server credentials from PEM files (docs/security.md): plaintext when
// neither a certificate nor a key is given, TLS with both, and mutual TLS
// when a client CA bundle is given too.

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace sv::server {

struct TlsFiles {
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// INVALID_ARGUMENT for half a pair, a CA without a pair, or an unreadable
// or empty file.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsFiles& files);

// The whole content of a small file; INVALID_ARGUMENT if unreadable or empty.
absl::StatusOr<std::string> ReadPemFile(const std::string& path);

}  // namespace sv::server

#endif  // SV_SERVER_TLS_H_
