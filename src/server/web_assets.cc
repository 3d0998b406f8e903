#include "server/web_assets.h"

#include <httplib.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace sv::server {
namespace {

// The pages load only their own scripts and styles and talk only to svd.
constexpr char kContentSecurityPolicy[] =
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

// FNV-1a of the content, as a strong ETag; the assets only change with svd.
std::string ETagOf(const WebAsset& asset) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t i = 0; i < asset.size; ++i) {
    hash = (hash ^ asset.data[i]) * 1099511628211ull;
  }
  return absl::StrCat("\"", absl::Hex(hash, absl::kZeroPad16), "\"");
}

void Serve(const WebAsset& asset, const std::string& etag, const httplib::Request& req,
           httplib::Response& res) {
  res.set_header("Content-Security-Policy", kContentSecurityPolicy);
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Cache-Control", "no-cache");
  res.set_header("ETag", etag);
  if (req.get_header_value("If-None-Match") == etag) {
    res.status = 304;
    return;
  }
  res.set_content(reinterpret_cast<const char*>(asset.data), asset.size,
                  WebContentType(asset.path));
}

}  // namespace

const char* WebContentType(const char* path) {
  const absl::string_view p(path);
  if (absl::EndsWith(p, ".html")) return "text/html; charset=utf-8";
  if (absl::EndsWith(p, ".js")) return "text/javascript; charset=utf-8";
  if (absl::EndsWith(p, ".css")) return "text/css; charset=utf-8";
  if (absl::EndsWith(p, ".svg")) return "image/svg+xml";
  if (absl::EndsWith(p, ".json")) return "application/json";
  if (absl::EndsWith(p, ".png")) return "image/png";
  if (absl::EndsWith(p, ".ico")) return "image/x-icon";
  return "application/octet-stream";
}

void MountWebConsole(httplib::Server& server) {
  for (const WebAsset& asset : EmbeddedWebAssets()) {
    const std::string etag = ETagOf(asset);
    auto handler = [&asset, etag](const httplib::Request& req, httplib::Response& res) {
      Serve(asset, etag, req, res);
    };
    // Patterns are regular expressions; these paths are matched literally.
    const std::string pattern = absl::StrReplaceAll(asset.path, {{".", "\\."}});
    server.Get(pattern, handler);
    if (std::string(asset.path) == "/index.html") server.Get("/", handler);
    if (std::string(asset.path) == "/admin.html") {
      server.Get("/admin", handler);
      server.Get("/admin/", handler);
    }
  }
}

}  // namespace sv::server
