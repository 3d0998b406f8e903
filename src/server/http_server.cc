#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "metrics/metrics.h"
#include "server/rest_gateway.h"
#include "spdlog/spdlog.h"

namespace sv::server {
namespace {
// REST bodies (rest_gateway.h); larger ones get 413.
constexpr size_t kRequestBodyBytesMax = kRestBodyBytesMax;
constexpr int kListenBacklog = 1024;
}  // namespace

HttpServer::HttpServer(std::string listen_address, std::function<absl::Status()> ready,
                       const std::string& tls_cert_file, const std::string& tls_key_file)
    : listen_address_(std::move(listen_address)), ready_(std::move(ready)) {
  if (!tls_cert_file.empty() || !tls_key_file.empty()) {
    auto tls = std::make_unique<httplib::SSLServer>(tls_cert_file.c_str(), tls_key_file.c_str());
    // cpp-httplib's floor is TLS 1.1; whether 1.0 and 1.1 were refused was
    // up to the system's OpenSSL policy. TLS 1.2 is the floor here, as on
    // the gRPC port.
    if (tls->is_valid()) SSL_CTX_set_min_proto_version(tls->ssl_context(), TLS1_2_VERSION);
    server_ = std::move(tls);
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start() {
  const size_t colon = listen_address_.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen_address_.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-listen must be host:port, got '", listen_address_, "'"));
  }
  const std::string host = listen_address_.substr(0, colon);
  if (!server_->is_valid()) {
    return absl::InvalidArgumentError("cannot load the TLS certificate or key for HTTP");
  }
  server_->set_payload_max_length(kRequestBodyBytesMax);
  // cpp-httplib's default pool is 8 threads (on a small machine), and a
  // connection holds its thread while it waits up to 5 s for its next
  // request: two browsers' keep-alive connections held every thread, so the
  // API, /healthz and /readyz waited seconds for any other client. Idle
  // connections are also let go sooner.
  const int threads = threads_;
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_keep_alive_timeout(2);
  // cpp-httplib 0.11 holds the payload limit to bodies sent with a
  // Content-Length only: a chunked body was read whole, however long,
  // before any handler or key check ran (a few endless ones took svd's
  // memory). Bodies must state their length; this runs before any is read.
  server_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("Transfer-Encoding")) return httplib::Server::HandlerResponse::Unhandled;
    RestResponse error = RestError(411, "INVALID_ARGUMENT", "LENGTH_REQUIRED",
                                   "send the body with a Content-Length; chunked (or otherwise "
                                   "transfer-encoded) request bodies are not accepted");
    res.status = error.status;
    // The connection is not closed at once: a client still sending its
    // body would be reset before it read this answer. What follows is read
    // as the next request, which is not one, so httplib answers 400 and
    // closes; the body is never held.
    res.set_content(error.body, "application/json");
    return httplib::Server::HandlerResponse::Handled;
  });
  // An exception out of a handler is a bug: log it here, and answer with the
  // REST error model and nothing of the exception (cpp-httplib's default
  // would put its text in an EXCEPTION_WHAT header).
  server_->set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr thrown) {
        std::string what = "unknown exception";
        try {
          if (thrown) std::rethrow_exception(thrown);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("http: {} {}: handler threw: {}", req.method, req.path, what);
        RestResponse error = RestError(500, "INTERNAL", "INTERNAL", "internal error");
        res.status = error.status;
        res.set_content(error.body, "application/json");
      });
  server_->Get("/metrics", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics::Registry::Default().Render(), "text/plain; version=0.0.4");
  });
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    absl::Status status = ready_();
    res.status = status.ok() ? 200 : 503;
    if (status.ok()) {
      res.set_content("ready\n", "text/plain");
      return;
    }
    // Unauthenticated: the cause goes to the log, not to whoever asks (a
    // database error names its host and port).
    spdlog::warn("http: /readyz: not ready: {}", std::string(status.message()));
    res.set_content(absl::IsUnavailable(status) && status.message() == "shutting down"
                        ? "shutting down\n"
                        : "not ready: the database does not answer\n",
                    "text/plain");
  });
  server_->Get("/statusz", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(status_ ? status_() : std::string("{}"), "application/json");
  });
  // The listening socket is the last one httplib set options on (it tries
  // each address until one binds).
  int listen_fd = -1;
  server_->set_socket_options([&listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_fd = sock;
  });
  port_ = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen_address_));
  }
  // cpp-httplib 0.11 listens with a backlog of 5: a burst of connections
  // (a browser opens six at once) overflowed it, and each dropped one waited
  // a second or more for its SYN to be sent again. listen() again sets it.
  if (listen_fd >= 0 && ::listen(listen_fd, kListenBacklog) != 0) {
    spdlog::warn("http: cannot raise the listen backlog to {}", kListenBacklog);
  }
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  spdlog::info("svd: serving HTTP (REST, console, /metrics, /healthz, /readyz) on {}:{}", host, port_);
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (thread_.joinable()) {
    server_->stop();
    thread_.join();
  }
}

}  // namespace sv::server
