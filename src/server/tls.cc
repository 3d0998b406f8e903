#include "server/tls.h"

#include <grpcpp/security/server_credentials.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace sv::server {

absl::StatusOr<std::string> ReadPemFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!in || buffer.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read PEM file ", path));
  }
  return buffer.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) {
    if (!files.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  auto cert = ReadPemFile(files.cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadPemFile(files.key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_key_cert_pairs.push_back({*key, *cert});
  if (!files.client_ca_file.empty()) {
    auto ca = ReadPemFile(files.client_ca_file);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    options.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

}  // namespace sv::server
