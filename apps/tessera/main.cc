// `tessera`: one binary, many subcommands (generate, serve, bench, plan, launch,
// inspect, synth, …). Parses the command line and dispatches; every subcommand
// lives in its own file and turns errors into an exit code and a message.
#include <cstdio>
#include <exception>

#include "apps/tessera/commands.h"
#include "comm/transport/mpi_channel.h"

int main(int argc, char** argv) {
  CLI::App app{
      "tessera: distributed LLM inference (tensor, pipeline, expert parallel) over "
      "shared memory and TCP"};
  app.require_subcommand(1);
  int exit_code = 0;
  tessera::cli::AddVersionCommand(app, &exit_code);
  tessera::cli::AddGenerateCommand(app, &exit_code);
  tessera::cli::AddServeCommand(app, &exit_code);
  tessera::cli::AddLaunchCommand(app, &exit_code);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks: comm (collectives), model (pp/tg)");
  bench->require_subcommand(1);
  tessera::cli::AddBenchCommCommand(*bench, &exit_code);
  tessera::cli::AddBenchModelCommand(*bench, &exit_code);
  tessera::cli::AddBenchServeCommand(*bench, &exit_code);
  tessera::cli::AddInspectCommand(app, &exit_code);
  tessera::cli::AddSynthCommand(app, &exit_code);
  tessera::cli::AddPlanCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera: error: %s\n", e.what());
    exit_code = 1;
  }
  // Under MPI: finalise, or end the whole MPI job when this rank failed.
  tessera::comm::ShutdownMpi(exit_code);
  return exit_code;
}
