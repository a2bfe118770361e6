// The `tessera` CLI's subcommands. Each Add*Command registers a CLI11 subcommand
// on `app` and sets its callback; the callback stores its exit code in
// `*exit_code`. Layer: apps (thin mains over the libraries).
#pragma once

#include <CLI/CLI.hpp>

namespace tessera::cli {

void AddVersionCommand(CLI::App& app, int* exit_code);
void AddGenerateCommand(CLI::App& app, int* exit_code);
// `bench` is the "bench" subcommand group that main() creates.
void AddBenchModelCommand(CLI::App& bench, int* exit_code);
void AddLaunchCommand(CLI::App& app, int* exit_code);
void AddBenchCommCommand(CLI::App& bench, int* exit_code);
void AddBenchServeCommand(CLI::App& bench, int* exit_code);
void AddInspectCommand(CLI::App& app, int* exit_code);
void AddSynthCommand(CLI::App& app, int* exit_code);
void AddPlanCommand(CLI::App& app, int* exit_code);
void AddServeCommand(CLI::App& app, int* exit_code);

}  // namespace tessera::cli
