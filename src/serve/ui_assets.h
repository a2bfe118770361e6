// The live view's static files (src/serve/ui/: the page, its script and style),
// embedded in the binary: CMake writes them into a generated source at configure
// time (src/serve/CMakeLists.txt), so there is no build step beyond CMake and
// nothing is fetched at run time. Layer: serve; OpenAiServer serves them.
#pragma once

#include <span>
#include <string_view>

namespace tessera::serve {

struct UiAsset {
  std::string_view path;          // the URL path: "/", "/ui/app.js", …
  std::string_view content_type;  // "text/html; charset=utf-8", …
  std::string_view body;
};

std::span<const UiAsset> UiAssets();

}  // namespace tessera::serve
