#ifndef SV_SERVER_HTTP_SERVER_H_
#define SV_SERVER_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace httplib {
class Server;
}

namespace sv::server {

// svd's HTTP side: /metrics (Prometheus text), /healthz (the process is
// alive) and /readyz (it can serve: the database answers and svd is not
// shutting down). svd also mounts the REST API and the web console on it.
class HttpServer {
 public:
  static constexpr int kThreadsDefault = 64;

  // With `tls_cert_file` and `tls_key_file` (PEM) it serves HTTPS only.
  HttpServer(std::string listen_address, std::function<absl::Status()> ready,
             const std::string& tls_cert_file = "", const std::string& tls_key_file = "");
  ~HttpServer();

  // Binds (port 0 picks one) and serves on a thread of its own. Fails when
  // the TLS certificate or key could not be loaded.
  absl::Status Start();
  // /statusz answers this JSON (leadership and shutdown; docs/reliability.md).
  // Set before Start().
  void SetStatus(std::function<std::string()> status) { status_ = std::move(status); }
  // Worker threads. cpp-httplib gives each connection a thread for as long
  // as it is open, idle keep-alive time included; set before Start().
  void SetThreads(int threads) { threads_ = threads; }
  void Stop();
  // For mounting more routes (REST, the web console) before Start().
  httplib::Server& raw() { return *server_; }
  int port() const { return port_; }

 private:
  std::string listen_address_;
  std::function<absl::Status()> ready_;
  std::function<std::string()> status_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  int threads_ = kThreadsDefault;
};

}  // namespace sv::server

#endif  // SV_SERVER_HTTP_SERVER_H_
