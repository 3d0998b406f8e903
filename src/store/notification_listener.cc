#include "store/notification_listener.h"

#include <algorithm>
#include <memory>

#include <pqxx/pqxx>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sv::store {
namespace {

class Receiver final : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection& connection, const std::string& channel,
           const std::vector<NotificationSink*>& sinks)
      : pqxx::notification_receiver(connection, channel), sinks_(sinks) {}
  void operator()(const std::string& payload, int /*backend_pid*/) override {
    for (NotificationSink* sink : sinks_) sink->OnNotification(payload);
  }

 private:
  const std::vector<NotificationSink*>& sinks_;
};

}  // namespace

std::string WithTcpTimeouts(const std::string& url, absl::Duration timeout) {
  const int64_t ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout));
  const int64_t seconds = std::max<int64_t>(1, ms / 1000);
  if (absl::StartsWith(url, "postgres://") || absl::StartsWith(url, "postgresql://")) {
    return absl::StrCat(url, absl::StrContains(url, "?") ? "&" : "?",
                        "keepalives=1&keepalives_idle=", seconds,
                        "&keepalives_interval=1&keepalives_count=3&tcp_user_timeout=", ms,
                        "&connect_timeout=", std::max<int64_t>(2, seconds));
  }
  return absl::StrCat(url, " keepalives=1 keepalives_idle=", seconds,
                      " keepalives_interval=1 keepalives_count=3 tcp_user_timeout=", ms,
                      " connect_timeout=", std::max<int64_t>(2, seconds));
}

NotificationListener::NotificationListener(NotificationListenerOptions options,
                                           const Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

NotificationListener::~NotificationListener() { Stop(); }

void NotificationListener::AddSink(NotificationSink* sink) { sinks_.push_back(sink); }

void NotificationListener::Start() {
  thread_ = std::thread([this] { Run(); });
}

void NotificationListener::RequestStop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
}

void NotificationListener::Stop() {
  RequestStop();
  if (thread_.joinable()) thread_.join();
}

bool NotificationListener::Sleep(absl::Duration d) {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_for(lock, absl::ToChronoNanoseconds(d), [this] { return stopping_; });
  return !stopping_;
}

void NotificationListener::Lost() {
  const bool was = listening_.exchange(false);
  backend_pid_ = 0;
  for (NotificationSink* sink : sinks_) sink->OnLost();
  if (!was) return;
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping = stopping_;
  }
  if (stopping) {
    spdlog::info("store: stopped listening on {}", options_.channel);
  } else {
    spdlog::warn("store: lost the LISTEN connection on {}", options_.channel);
  }
}

void NotificationListener::Run() {
  absl::Duration backoff = absl::Milliseconds(50);
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) break;
    }
    const int64_t opened = connections_opened_.load();
    ListenOnce();
    // A connection that got as far as listening resets the backoff.
    backoff = connections_opened_.load() != opened
                  ? absl::Milliseconds(50)
                  : std::min(backoff * 2, options_.reconnect_backoff_max);
    if (!Sleep(backoff)) break;
  }
}

void NotificationListener::ListenOnce() {
  std::unique_ptr<pqxx::connection> connection;
  std::unique_ptr<Receiver> receiver;
  try {
    connection = std::make_unique<pqxx::connection>(
        WithTcpTimeouts(options_.url, options_.round_trip_timeout));
    {
      pqxx::nontransaction setup(*connection);
      setup.exec(absl::StrCat("SET statement_timeout = ",
                              absl::ToInt64Milliseconds(options_.round_trip_timeout)));
    }
    receiver = std::make_unique<Receiver>(*connection, options_.channel, sinks_);  // LISTEN.
    const int pid = connection->backendpid();
    backend_pid_ = pid;
    listening_ = true;
    connections_opened_.fetch_add(1);
    // LISTEN is in force: anything committed from now on reaches us, and
    // whatever was committed before must be forgotten.
    for (NotificationSink* sink : sinks_) sink->OnListening();
    spdlog::info("store: listening on {} (backend {})", options_.channel, pid);
    while (true) {
      // A round trip proves the connection alive; the server sends every
      // notification committed before it started ahead of its answer.
      // libpqxx may silently reconnect a broken connection (and LISTEN
      // again), losing what was sent meanwhile: a new backend counts as a
      // lost connection.
      const absl::Time started = clock_.Now();
      {
        pqxx::nontransaction ping(*connection);
        if (ping.exec("SELECT pg_backend_pid()")[0][0].as<int>() != pid) {
          throw pqxx::broken_connection("the LISTEN connection was replaced");
        }
      }
      connection->get_notifs();
      if (connection->backendpid() != pid) {
        throw pqxx::broken_connection("the LISTEN connection was replaced");
      }
      for (NotificationSink* sink : sinks_) sink->OnConfirmed(started);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) break;
      }
      connection->await_notification(
          0, std::max<int64_t>(1, absl::ToInt64Microseconds(options_.ping_interval)));
    }
  } catch (const std::exception& e) {
    spdlog::warn("store: LISTEN {}: {}", options_.channel, e.what());
  }
  // Close before the receiver goes, so its UNLISTEN cannot reconnect.
  if (connection != nullptr) connection->disconnect();
  receiver.reset();
  Lost();
}

}  // namespace sv::store
