#include <cstdio>

#include "apps/tessera/commands.h"
#include "comm/transport/mpi_channel.h"

namespace tessera::cli {

void AddVersionCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("version", "Print the version and exit");
  cmd->callback([exit_code] {
    std::printf("tessera %s\n", TESSERA_VERSION);
    std::printf("transports: shm tcp%s\n", comm::MpiBuilt() ? " mpi" : "");
    *exit_code = 0;
  });
}

}  // namespace tessera::cli
