#include "cli/client.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "api/errors.h"
#include "nlohmann/json.hpp"

namespace sv::cli {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::string DefaultConfigPath() {
  std::string xdg = Env("XDG_CONFIG_HOME");
  if (!xdg.empty()) return xdg + "/svctl/config.json";
  std::string home = Env("HOME");
  return (home.empty() ? std::string(".") : home) + "/.config/svctl/config.json";
}

// The whole of a small PEM file; false (with `error`) if unreadable or empty.
bool ReadPem(const std::string& path, const char* what, std::string* out, std::string* error) {
  std::ifstream in(path);
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) pem.clear();
  if (pem.empty()) {
    if (error != nullptr) *error = absl::StrCat("cannot read ", what, " ", path);
    return false;
  }
  *out = std::move(pem);
  return true;
}

}  // namespace

bool ResolveConnection(const ConnectionFlags& flags, Connection* out, std::string* error) {
  nlohmann::json config = nlohmann::json::object();
  const std::string path = flags.config_path.empty() ? DefaultConfigPath() : flags.config_path;
  std::ifstream in(path);
  if (in) {
    config = nlohmann::json::parse(in, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      *error = absl::StrCat("config file ", path, " is not a JSON object");
      return false;
    }
  }
  auto pick = [&](const std::string& flag, const char* env, const char* key) {
    if (!flag.empty()) return flag;
    std::string from_env = Env(env);
    if (!from_env.empty()) return from_env;
    auto it = config.find(key);
    return it != config.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  out->endpoint = pick(flags.endpoint, "SVCTL_ENDPOINT", "endpoint");
  out->ca_file = pick(flags.ca_file, "SVCTL_CA_FILE", "ca_file");
  out->client_cert_file = pick(flags.client_cert_file, "SVCTL_CLIENT_CERT", "client_cert");
  out->client_key_file = pick(flags.client_key_file, "SVCTL_CLIENT_KEY", "client_key");
  out->token = flags.admin ? pick(flags.token, "SVCTL_ADMIN_TOKEN", "admin_token")
                           : pick(flags.token, "SVCTL_TOKEN", "token");
  out->timeout = absl::Seconds(flags.timeout_s);
  if (out->endpoint.empty()) {
    *error = absl::StrCat("no endpoint: pass --endpoint, set SVCTL_ENDPOINT, or write ", path,
                          " (svd --dev writes it)");
    return false;
  }
  if (out->token.empty()) {
    *error = absl::StrCat("no API key: pass --token, set ",
                          flags.admin ? "SVCTL_ADMIN_TOKEN" : "SVCTL_TOKEN", ", or write ",
                          path);
    return false;
  }
  if (out->client_cert_file.empty() != out->client_key_file.empty()) {
    *error = "--client-cert and --client-key go together";
    return false;
  }
  if (!out->client_cert_file.empty() && out->ca_file.empty()) {
    *error = "a client certificate needs TLS: pass --ca-file too";
    return false;
  }
  return true;
}

std::shared_ptr<grpc::Channel> Dial(const Connection& connection, std::string* error) {
  if (connection.ca_file.empty()) {
    return grpc::CreateChannel(connection.endpoint, grpc::InsecureChannelCredentials());
  }
  grpc::SslCredentialsOptions options;
  if (!ReadPem(connection.ca_file, "CA file", &options.pem_root_certs, error)) return nullptr;
  if (connection.client_cert_file.empty() != connection.client_key_file.empty()) {
    if (error != nullptr) *error = "--client-cert and --client-key go together";
    return nullptr;
  }
  if (!connection.client_cert_file.empty() &&
      (!ReadPem(connection.client_cert_file, "client certificate", &options.pem_cert_chain,
                error) ||
       !ReadPem(connection.client_key_file, "client key", &options.pem_private_key, error))) {
    return nullptr;
  }
  return grpc::CreateChannel(connection.endpoint, grpc::SslCredentials(options));
}

void Prepare(const Connection& connection, grpc::ClientContext* context) {
  context->AddMetadata("authorization", "Bearer " + connection.token);
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoNanoseconds(connection.timeout));
}

std::string DescribeError(const grpc::Status& status, const std::string& endpoint) {
  std::string reason = api::ReasonOf(status);
  std::string message = status.error_message();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && reason.empty()) {
    message = absl::StrCat("cannot reach svd at ", endpoint, " (is it running?): ", message);
  }
  return absl::StrCat(api::GrpcCodeName(status.error_code()),
                      reason.empty() ? "" : absl::StrCat(" (", reason, ")"), ": ", message);
}

}  // namespace sv::cli
