#include "apps/tessera/cli_util.h"

#include <fstream>
#include <iterator>

namespace tessera::cli {

std::vector<std::string> OwnCommandLine() {
  std::ifstream file("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = all.find('\0', pos);
    if (end == std::string::npos) end = all.size();
    args.push_back(all.substr(pos, end - pos));
    pos = end + 1;
  }
  if (!args.empty()) args[0] = "/proc/self/exe";
  return args;
}

}  // namespace tessera::cli
