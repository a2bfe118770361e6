// Prefill/decode disaggregation's KV transfer (docs/pd.md): the links between
// prefill instances and decode instances, each a two-rank tessera::comm
// Communicator (shared memory on one host, TCP across hosts, cluster-token
// authenticated like every tessera connection), rendezvoused through a store the
// front hosts. A decode instance's KvImportLinks is its scheduler's
// engine::KvImporter: for an admitted request it asks a prefill instance (the one
// with the fewest transfers in flight) to compute the prompt's full blocks and
// receives them straight into the blocks its scheduler allocated; a prefill
// instance's KvExportLinks answers those requests with prefill-only requests on
// its own scheduler (chunked prefill at full batch, its own prefix cache) and
// sends the blocks in the cache's own dtype, so the decode continues exactly as
// a colocated run would (bit-identical). Frames: kv/transfer_frame.h.
//
// Failure: every transfer has a deadline; a transfer that fails (a refused or
// malformed reply, a truncated block, a timeout, a dead peer) is reported failed
// to the scheduler, which then computes that prompt itself — nothing accepted is
// lost. A failure that leaves receives posted into the cache (timeout, a broken
// or misbehaving link) resets the link first: its communicator is aborted and
// destroyed, so nothing writes into blocks once they are released, and every
// transfer on it fails; the link is then re-established (generation counter in
// the store; a restarted prefill instance is noticed by its incarnation key).
//
// Layer: serve. Thread-safety: Start (KvImporter) from the scheduler thread;
// everything else from the owner's thread; each link runs its own thread, the
// only one to touch its communicator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "comm/options.h"
#include "comm/rendezvous/store.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "kv/transfer_codec.h"

namespace tessera::serve {

// The blocks a link reads and fills, as a cache holding the whole model lays
// them out (`shape`: every layer and KV head, the cache's dtype) — what travels,
// so that instances of different layouts (--prefill-tp, --decode-tp) exchange
// blocks. In a one-rank instance (`local`: its cache, of that shape) they are
// read and filled in place; in an instance of several ranks, through its executor
// on the scheduler thread (engine::StepExecutor::ReadKvBlocks, WriteKvBlocks),
// which gathers every rank's share.
struct PdCache {
  kv::KvCacheShape shape;
  kv::KvCache* local = nullptr;
};

struct PdLinkOptions {
  std::shared_ptr<comm::Store> store;  // shared by every instance (the front's TCP store)
  comm::CommOptions comm;              // job_id names the links; cluster_token authenticates
  int64_t transfer_timeout_ms = 30'000;
  int64_t connect_timeout_ms = 10'000;  // the decode side's; the prefill side waits less
  // What the blocks travel in (decode side: it asks for it; --kv-transfer-dtype).
  kv::WireType wire = kv::WireType::kRaw;
};

// Store keys and communicator ids of link (prefill instance p, decode instance d).
std::string PdGenerationKey(int prefill, int decode);
std::string PdIncarnationKey(int prefill);
std::string PdLinkCommId(int prefill, int decode, int64_t generation);
// Tags: kRequest frames and their tokens on kPdRequestTag; the reply and the
// answer of transfer i on PdTransferTag(i); its kBurst frames on PdControlTag(i);
// the pieces of its layer l on PdLayerTag(i, l) (one tag a layer, so that each
// layer's pieces, in block order, meet receives posted in advance whatever order
// the layers go in).
inline constexpr int kPdRequestTag = 1;
// A decode side giving up a transfer whose request was cancelled while its blocks
// stream: a kAbort frame naming it, on kPdCancelTag (the prefill instance cancels
// the prefill; its last burst then carries the failure).
inline constexpr int kPdCancelTag = 0;
int PdTransferTag(uint64_t transfer_id);
int PdControlTag(uint64_t transfer_id);
int PdLayerTag(uint64_t transfer_id, int32_t layer);

struct PdImportStats {
  int64_t transfers = 0, failures = 0, bytes = 0, link_resets = 0;
};

// The decode side: one link to each of num_prefill prefill instances.
class KvImportLinks final : public engine::KvImporter {
 public:
  // prefilled_ns: NowNs() when the prefill instance's reply (its prefill done) arrived.
  // streamed_bytes: of `bytes`, those that arrived before the prefill's last burst.
  using DoneFn = std::function<void(int64_t transfer_id, Status status, int64_t bytes,
                                    int64_t prefilled_ns, int64_t streamed_bytes)>;
  // `cache` (its local cache must outlive this) receives the blocks; `done` reports
  // each transfer (engine::Scheduler::ImportDone).
  KvImportLinks(PdCache cache, int decode_index, int num_prefill, PdLinkOptions options,
                DoneFn done);
  ~KvImportLinks() override;  // stops the links; transfers in flight are reported failed

  void Start(int64_t transfer_id, std::vector<int32_t> tokens, int64_t first_block,
             std::vector<int32_t> blocks) override;
  // Several ranks: a done transfer's blocks wait in memory until the scheduler
  // lands them through its executor.
  Status Land(int64_t transfer_id, engine::StepExecutor* executor) override;
  // Queued: reported aborted at once. Awaiting the prefill instance's reply: it is
  // answered kAbort. Streaming: the prefill instance is told (kPdCancelTag) and the
  // transfer ends with its last burst.
  void Cancel(int64_t transfer_id) override;
  PdImportStats stats() const;
  // Links connected now.
  int connected() const;

 private:
  class Link;
  struct Landed;
  PdLinkOptions options_;
  DoneFn done_;
  std::unique_ptr<Landed> landed_;
  std::vector<std::unique_ptr<Link>> links_;
};

// The prefill side: answers every decode instance's transfer requests.
class KvExportLinks {
 public:
  // `cache` is the one `scheduler`'s executor computes into (both must outlive this).
  KvExportLinks(PdCache cache, engine::Scheduler& scheduler, int prefill_index, int num_decode,
                PdLinkOptions options);
  ~KvExportLinks();
  int connected() const;

 private:
  class Link;
  PdLinkOptions options_;
  std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace tessera::serve
