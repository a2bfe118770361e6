// The data-parallel side of `tessera serve`: with --dp N (and/or --replica URL)
// this process is the front (serve::DpFront) and starts N local replicas — copies
// of its own command line, each an ordinary `tessera serve` group on a loopback
// port — supervises them (a replica that exits is marked down and started again
// in the background) and stops them with itself. A replica knows it is one by
// kReplicaPortFileEnv, where it writes its bound port. Layer: apps.
#pragma once

#ifdef TESSERA_HAVE_SERVE
#include <signal.h>

#include <string>
#include <vector>

#include "base/status.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/dp_front.h"

namespace tessera::cli {

// Set in a local replica's environment: the file it writes its port to (the
// front reads it). A replica ignores --dp/--replica, binds 127.0.0.1 on any port.
inline constexpr char kReplicaPortFileEnv[] = "TESSERA_SERVE_REPLICA_PORT_FILE";

struct FrontArgs {
  int dp = 0;                         // local replicas
  std::vector<std::string> replicas;  // remote ones: http://HOST:PORT
  serve::FrontOptions options;
};

// Runs the front until SIGINT/SIGTERM (in `stop_signals`, blocked by the
// caller). `tokenizer` and `chat` (may be null) hash prompts for prefix-affinity.
Status RunServeFront(const FrontArgs& args, const model::Tokenizer& tokenizer,
                     const serve::ChatTemplate* chat, const sigset_t& stop_signals);

// Writes `port` to the file named by kReplicaPortFileEnv, if set (atomically:
// the front never reads half a number).
Status WriteReplicaPortFile(int port);

}  // namespace tessera::cli
#endif  // TESSERA_HAVE_SERVE
