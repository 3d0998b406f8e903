#ifndef SV_COMMON_LOG_CONTEXT_H_
#define SV_COMMON_LOG_CONTEXT_H_

// What a log line is about: the request being served on this thread. The
// API layer fills it (the gRPC interceptor sets the method and request_id,
// authentication sets the tenant), and the JSON log format
// (--log-format json) adds it to every line the thread writes.

#include <string>

namespace sv::logging {

struct Context {
  std::string method;
  std::string tenant;
  std::string request_id;
};

inline thread_local Context t_context;

inline Context& CurrentContext() { return t_context; }

inline void SetTenant(const std::string& tenant) { t_context.tenant = tenant; }

// Sets the context for a scope and restores the previous one after it.
class ScopedContext {
 public:
  explicit ScopedContext(Context context) : previous_(std::move(t_context)) {
    t_context = std::move(context);
  }
  ~ScopedContext() { t_context = std::move(previous_); }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  Context previous_;
};

}  // namespace sv::logging

#endif  // SV_COMMON_LOG_CONTEXT_H_
