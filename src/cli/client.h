#ifndef SV_CLI_CLIENT_H_
#define SV_CLI_CLIENT_H_

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"

namespace sv::cli {

// Where svctl connects and with which key, after flags, then the
// environment (SVCTL_ENDPOINT, SVCTL_TOKEN), then the config file.
struct Connection {
  std::string endpoint;
  std::string token;
  absl::Duration timeout = absl::Seconds(30);
  // PEM CA bundle: connect with TLS, trusting it. Empty: plaintext.
  std::string ca_file;
  // PEM client certificate and key for mutual TLS (svd --tls-client-ca);
  // both or neither, and only with ca_file.
  std::string client_cert_file;
  std::string client_key_file;
};

struct ConnectionFlags {
  std::string endpoint;
  std::string token;
  std::string config_path;  // Empty: $XDG_CONFIG_HOME or ~/.config/svctl/config.json.
  std::string ca_file;      // --ca-file, else SVCTL_CA_FILE, else the config's ca_file.
  std::string client_cert_file;  // --client-cert, SVCTL_CLIENT_CERT, config client_cert.
  std::string client_key_file;   // --client-key, SVCTL_CLIENT_KEY, config client_key.
  bool admin = false;       // Use the config's admin_token (or SVCTL_ADMIN_TOKEN).
  int timeout_s = 30;
};

// Fails with a one-line message when no endpoint or token can be found.
bool ResolveConnection(const ConnectionFlags& flags, Connection* out, std::string* error);

// nullptr (with `error`) when the CA file or a client certificate or key
// cannot be read, or when only one of the certificate and key is given.
std::shared_ptr<grpc::Channel> Dial(const Connection& connection, std::string* error = nullptr);

// Sets the bearer token and the deadline on a fresh context.
void Prepare(const Connection& connection, grpc::ClientContext* context);

// "INVALID_ARGUMENT (INVALID_GPU_COUNT): gpu_count ..." for one line on stderr.
std::string DescribeError(const grpc::Status& status, const std::string& endpoint);

}  // namespace sv::cli

#endif  // SV_CLI_CLIENT_H_
