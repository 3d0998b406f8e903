#ifndef SV_SERVER_WEB_ASSETS_H_
#define SV_SERVER_WEB_ASSETS_H_

#include <cstddef>
#include <vector>

namespace httplib {
class Server;
}

namespace sv::server {

// A file of the web console (web/), embedded at build time.
struct WebAsset {
  const char* path;  // "/app.js"
  const unsigned char* data;
  size_t size;
};

const std::vector<WebAsset>& EmbeddedWebAssets();

// The media type svd sends for a path, by its extension.
const char* WebContentType(const char* path);

// Serves the console at / (index.html), the admin dashboard at /admin
// (admin.html) and every other file at its own path.
void MountWebConsole(httplib::Server& server);

}  // namespace sv::server

#endif  // SV_SERVER_WEB_ASSETS_H_
