#ifndef SV_STORE_NOTIFICATION_LISTENER_H_
#define SV_STORE_NOTIFICATION_LISTENER_H_

// A dedicated PostgreSQL connection that LISTENs on one channel and hands
// each notification to its sinks, for caches that must learn of changes
// committed by any replica (docs/security.md, "Cached authentication").
//
// What a sink may rely on:
// - OnListening(): a new connection LISTENs; notifications sent while there
//   was none are lost, so a cache must drop everything it holds.
// - OnLost(): the connection broke (or was replaced under us); until the
//   next OnListening and OnConfirmed nothing may be trusted.
// - OnConfirmed(t): every notification committed before `t` (a time taken
//   before a round trip on the listening connection) has been delivered to
//   OnNotification. A cache is fresh as of the latest such `t`.

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "common/clock.h"

namespace sv::store {

class NotificationSink {
 public:
  virtual ~NotificationSink() = default;
  virtual void OnListening() {}
  virtual void OnLost() {}
  virtual void OnNotification(const std::string& payload) = 0;
  virtual void OnConfirmed(absl::Time /*round_trip_started*/) {}
};

struct NotificationListenerOptions {
  std::string url;      // libpq connection string or URI (as DatabaseOptions).
  std::string channel;  // A plain identifier.
  // How often the connection is proven alive by a round trip (and so how
  // often OnConfirmed moves on).
  absl::Duration ping_interval = absl::Milliseconds(200);
  absl::Duration reconnect_backoff_max = absl::Seconds(1);
  // Sent to the server as statement_timeout, and to the kernel as
  // tcp_user_timeout, so a dead network ends a round trip.
  absl::Duration round_trip_timeout = absl::Seconds(2);
};

class NotificationListener {
 public:
  // `clock` stamps OnConfirmed; use a real clock.
  NotificationListener(NotificationListenerOptions options, const Clock& clock);
  ~NotificationListener();  // Stops.
  NotificationListener(const NotificationListener&) = delete;
  NotificationListener& operator=(const NotificationListener&) = delete;

  // Sinks are added before Start and must outlive the listener's Stop.
  void AddSink(NotificationSink* sink);
  void Start();
  // Asks the listener to stop and returns at once; it closes its
  // connection within one ping_interval. Stop waits for that.
  void RequestStop();
  void Stop();

  bool listening() const { return listening_.load(); }
  // The PostgreSQL backend that listens now, or 0 (tests terminate it).
  int backend_pid() const { return backend_pid_.load(); }
  int64_t connections_opened() const { return connections_opened_.load(); }

 private:
  void Run();
  // One connection's life: returns when it broke or Stop was called.
  void ListenOnce();
  bool Sleep(absl::Duration d);
  void Lost();

  NotificationListenerOptions options_;
  const Clock& clock_;
  std::vector<NotificationSink*> sinks_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<bool> listening_{false};
  std::atomic<int> backend_pid_{0};
  std::atomic<int64_t> connections_opened_{0};
};

// `url` with TCP keepalives and tcp_user_timeout added, in its own syntax
// (key=value string or postgres:// URI).
std::string WithTcpTimeouts(const std::string& url, absl::Duration timeout);

}  // namespace sv::store

#endif  // SV_STORE_NOTIFICATION_LISTENER_H_
