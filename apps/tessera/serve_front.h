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

// The store key under which a --pd front publishes "P:D:JOB" (its instances'
// counts and the links' job id) for instances started elsewhere (--pd-join).
inline constexpr char kPdLayoutKey[] = "pd/layout";

// "P:D" with P, D >= 0 (local instances; remote ones may make up the rest).
Result<std::pair<int, int>> ParsePdCounts(const std::string& text);

struct FrontArgs {
  int dp = 0;                         // local replicas (not under --pd)
  std::vector<std::string> replicas;  // remote ones: http://HOST:PORT
  // --pd: pd_prefill local prefill and pd_decode local decode instances, and the
  // remote ones (`tessera serve --pd-join` elsewhere: http://HOST:PORT). Replica
  // order: prefill instances (local, then remote), then decode instances (local,
  // then remote); the front routes to the decode ones.
  int pd_prefill = 0;
  int pd_decode = 0;
  std::vector<std::string> pd_prefill_urls, pd_decode_urls;
  // Where the links' rendezvous store listens (HOST:PORT; "" = 127.0.0.1, any
  // port). Remote instances need an address they can reach.
  std::string pd_store;
  serve::FrontOptions options;

  bool pd() const {
    return pd_prefill + pd_decode > 0 || !pd_prefill_urls.empty() || !pd_decode_urls.empty();
  }
  int num_prefill() const { return pd_prefill + static_cast<int>(pd_prefill_urls.size()); }
  int num_decode() const { return pd_decode + static_cast<int>(pd_decode_urls.size()); }
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
