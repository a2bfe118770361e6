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
#include <utility>
#include <vector>

#include "base/status.h"
#include "model/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/dp_front.h"

namespace tessera::cli {

// Set in a local replica's environment: the file it writes its port to (the
// front reads it). A replica ignores --dp/--replica, binds 127.0.0.1 on any port.
inline constexpr char kReplicaPortFileEnv[] = "TESSERA_SERVE_REPLICA_PORT_FILE";

// Prefill/decode disaggregation (--pd P:D, docs/pd.md): set in each local
// instance's environment — its role ("prefill:I:P:D" or "decode:I:P:D"), the
// front's store (HOST:PORT, cluster-token authenticated) and the links' job id.
inline constexpr char kPdRoleEnv[] = "TESSERA_PD_ROLE";
inline constexpr char kPdStoreEnv[] = "TESSERA_PD_STORE";
inline constexpr char kPdJobEnv[] = "TESSERA_PD_JOB";

// "P:D" with P, D >= 1.
Result<std::pair<int, int>> ParsePdCounts(const std::string& text);

struct FrontArgs {
  int dp = 0;                         // local replicas
  std::vector<std::string> replicas;  // remote ones: http://HOST:PORT
  // --pd: the first pd_prefill local replicas are prefill instances, the next
  // pd_decode decode instances (dp = their sum; the front routes to the latter).
  int pd_prefill = 0;
  int pd_decode = 0;
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
