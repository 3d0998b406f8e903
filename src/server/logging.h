#ifndef SV_SERVER_LOGGING_H_
#define SV_SERVER_LOGGING_H_

#include <string>

namespace sv::server {

// Sets spdlog's level and format for svd. "text": the readable default;
// "json": one JSON object per line (time in UTC, level, logger, thread,
// msg, and method/tenant/request_id from logging::CurrentContext() when
// set), for log shippers.
void ConfigureLogging(const std::string& format, const std::string& level);

}  // namespace sv::server

#endif  // SV_SERVER_LOGGING_H_
