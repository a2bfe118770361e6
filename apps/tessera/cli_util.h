// Small helpers the CLI's subcommands share. Layer: apps.
#pragma once

#include <string>
#include <vector>

namespace tessera::cli {

// This process's own command line with argv[0] = /proc/self/exe, for commands
// that launch their ranks as copies of themselves.
std::vector<std::string> OwnCommandLine();

}  // namespace tessera::cli
