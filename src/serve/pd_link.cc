#include "serve/pd_link.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "base/clock.h"
#include "base/populate.h"
#include "comm/communicator.h"
#include "kv/transfer_frame.h"

namespace tessera::serve {
namespace {

constexpr int64_t kIdlePollUs = 200;            // a link with nothing to do sleeps this long
constexpr int64_t kWatchEveryNs = 200'000'000;  // store checks (generation, incarnation)
// The prefill side tries a generation this long, less than the decode side's
// (kMinDecodeConnectMs at least), so that it is always in time for the newest one.
constexpr int64_t kPrefillConnectMs = 1'000;
constexpr int64_t kMinDecodeConnectMs = 2'000;

using Frame = std::array<uint8_t, kv::kTransferHeaderBytes>;

Result<int64_t> ReadCounter(comm::Store& store, const std::string& key) {
  return store.Add(key, 0);
}

}  // namespace

std::string PdGenerationKey(int prefill, int decode) {
  return "pd/gen/" + std::to_string(prefill) + "/" + std::to_string(decode);
}
std::string PdIncarnationKey(int prefill) { return "pd/incarnation/" + std::to_string(prefill); }
std::string PdLinkCommId(int prefill, int decode, int64_t generation) {
  return "pd-" + std::to_string(prefill) + "-" + std::to_string(decode) + "-" +
         std::to_string(generation);
}
// Each transfer owns a run of tags: its reply, its bursts, one per layer (ids
// wrap after 2^20, far more than are ever in flight on a link; the largest tag
// is below 2^31).
constexpr int kTagsPerTransfer = 2 + static_cast<int>(kv::kMaxTransferLayers);
int PdTransferTag(uint64_t transfer_id) {
  return 2 + kTagsPerTransfer * static_cast<int>(transfer_id % (uint64_t{1} << 20));
}
int PdControlTag(uint64_t transfer_id) { return PdTransferTag(transfer_id) + 1; }
int PdLayerTag(uint64_t transfer_id, int32_t layer) {
  return PdTransferTag(transfer_id) + 2 + layer;
}

// ---------------------------------------------------------------------------
// Staging memory: the wire copies of a transfer's blocks (the prefill side's, and
// the decode side's when the blocks travel converted). Uninitialised, mapped in one
// call when allocated (base/populate.h) rather than page by page in the middle of
// a transfer, and recycled: a released buffer waits in a small pool, so the next
// transfer of a similar size finds its pages mapped.

namespace {

struct Staging {
  std::unique_ptr<uint8_t[]> bytes;
  size_t capacity = 0;
  size_t size = 0;
  uint8_t* data() const { return bytes.get(); }
  bool empty() const { return size == 0; }
};

class StagingPool {
 public:
  static StagingPool& Instance() {
    static StagingPool pool;
    return pool;
  }
  // A buffer of at least `size` bytes: the smallest pooled one that fits, or a new
  // one (its pages mapped now unless !populate: the caller maps them, or lets
  // them fault in).
  Staging Take(size_t size, bool populate = true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].capacity >= size &&
            (best == free_.size() || free_[i].capacity < free_[best].capacity)) {
          best = i;
        }
      }
      if (best < free_.size()) {
        Staging s = std::move(free_[best]);
        free_.erase(free_.begin() + static_cast<ptrdiff_t>(best));
        pooled_bytes_ -= s.capacity;
        s.size = size;
        return s;
      }
    }
    Staging s{std::unique_ptr<uint8_t[]>(new uint8_t[size]), size, size};
    if (populate) PopulateForWrite(s.data(), size);
    return s;
  }
  // Back to the pool, unless it would hold more than kMaxPooledBytes (then the
  // largest buffers go).
  void Give(Staging s) {
    if (s.capacity == 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    pooled_bytes_ += s.capacity;
    free_.push_back(std::move(s));
    while (pooled_bytes_ > kMaxPooledBytes) {
      auto largest = std::max_element(
          free_.begin(), free_.end(),
          [](const Staging& a, const Staging& b) { return a.capacity < b.capacity; });
      pooled_bytes_ -= largest->capacity;
      free_.erase(largest);
    }
  }

 private:
  static constexpr size_t kMaxPooledBytes = size_t{512} << 20;
  std::mutex mu_;
  std::vector<Staging> free_;
  size_t pooled_bytes_ = 0;
};

// Owns a taken buffer until it is given back. Not movable: a transfer holds its
// lease in place (a moved-from Staging would keep its capacity without its bytes).
struct StagingLease {
  Staging buffer;
  StagingLease() = default;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease() { Release(); }
  void Take(size_t size, bool populate = true) {
    Release();
    buffer = StagingPool::Instance().Take(size, populate);
  }
  void Release() {
    if (buffer.capacity > 0) StagingPool::Instance().Give(std::move(buffer));
    buffer = Staging{};
  }
  uint8_t* data() const { return buffer.data(); }
  bool empty() const { return buffer.empty(); }
};

}  // namespace

// ---------------------------------------------------------------------------
// Decode side.

struct ImportTransfer {
  int64_t id = 0;
  std::vector<int32_t> tokens;
  int64_t first_block = 0;
  std::vector<int32_t> blocks;
  int64_t deadline_ns = 0;
  int64_t reply_ns = 0;  // when the prefill instance's reply arrived
  int state = 0;         // Link::State
  Frame reply{};
  comm::Request reply_request;
  std::vector<comm::Request> block_requests;  // [block · layers + layer]
  StagingLease staged;                        // a converted wire dtype: the blocks before decoding
  // Several ranks: the blocks in the cache's dtype, until the scheduler lands them.
  std::unique_ptr<StagingLease> landed;
  Frame control{};  // the next burst's kBurst frame
  comm::Request control_request;
  std::vector<int64_t> received;  // per layer: blocks whose piece has landed
  int64_t streamed = 0;           // pieces landed from bursts sent before the prefill ended
  Status failure;                 // a bad block or a failed prefill: reported after the last burst
  bool abort_sent = false;        // cancelled while streaming: the prefill instance was told
  bool prefill_ended = false;     // a burst flagged kPrefillEnded has arrived
};

// Done transfers of a several-rank instance whose blocks wait to be landed.
struct KvImportLinks::Landed {
  struct Blocks {
    std::vector<int32_t> ids;
    std::unique_ptr<StagingLease> data;
  };
  std::mutex mu;
  std::map<int64_t, Blocks> by_transfer;
};

class KvImportLinks::Link {
 public:
  Link(const PdCache& cache, int prefill, int decode, const PdLinkOptions& options,
       const DoneFn& done, Landed& landed)
      : cache_(cache),
        prefill_(prefill),
        decode_(decode),
        options_(options),
        done_(done),
        landed_(landed) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Link() {
    stopping_.store(true);
    thread_.join();
  }

  void Enqueue(std::unique_ptr<ImportTransfer> t);
  // KvImportLinks::Cancel; false when the transfer is not this link's.
  bool Cancel(int64_t id);
  int64_t pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(queued_.size()) + active_count_;
  }
  bool connected() const { return connected_.load(); }
  PdImportStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  enum class State { kAwaitReply, kReceiving };
  void Loop();
  void Connect();
  Status Begin(ImportTransfer& t);
  // One step of t; true when it finished (reported). An error return breaks the link.
  Result<bool> Progress(ImportTransfer& t);
  Result<bool> ReceiveBursts(ImportTransfer& t);
  bool IsCancelled(int64_t id) const;
  void Report(ImportTransfer& t, Status status);
  void Reset(const Status& why);
  // Where block b of t lands in the cache's dtype: the cache's block (one rank) or
  // the memory it waits in for the scheduler.
  uint8_t* LandingOf(ImportTransfer& t, size_t b) const {
    if (cache_.local != nullptr) return cache_.local->block_data(t.blocks[b]);
    return t.landed->data() + b * static_cast<size_t>(cache_.shape.BytesPerBlock());
  }

  const PdCache cache_;
  const int prefill_, decode_;
  const PdLinkOptions& options_;
  const DoneFn& done_;
  Landed& landed_;
  std::unique_ptr<comm::Communicator> comm_;
  int64_t incarnation_ = -1;
  int64_t next_watch_ns_ = 0;
  std::vector<std::unique_ptr<ImportTransfer>> active_;  // link thread only
  mutable std::mutex mu_;
  std::deque<std::unique_ptr<ImportTransfer>> queued_;
  std::set<int64_t> mine_;       // every transfer enqueued and not yet reported
  std::set<int64_t> cancelled_;  // of those, the ones whose request was cancelled
  int64_t active_count_ = 0;
  PdImportStats stats_;
  std::atomic<bool> connected_{false};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

void KvImportLinks::Link::Enqueue(std::unique_ptr<ImportTransfer> t) {
  std::lock_guard<std::mutex> lock(mu_);
  mine_.insert(t->id);
  queued_.push_back(std::move(t));
}

bool KvImportLinks::Link::Cancel(int64_t id) {
  std::unique_ptr<ImportTransfer> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (mine_.count(id) == 0) return false;
    auto it =
        std::find_if(queued_.begin(), queued_.end(), [&](const auto& t) { return t->id == id; });
    if (it == queued_.end()) {
      cancelled_.insert(id);  // the link thread gives it up
      return true;
    }
    queued = std::move(*it);
    queued_.erase(it);
  }
  Report(*queued, AbortedError("the request was cancelled before its KV transfer began"));
  return true;
}

bool KvImportLinks::Link::IsCancelled(int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_.count(id) > 0;
}

void KvImportLinks::Link::Report(ImportTransfer& t, Status status) {
  const int64_t block_bytes = kv::WireBytesPerBlock(cache_.shape, options_.wire);
  const int64_t bytes = status.ok() ? static_cast<int64_t>(t.blocks.size()) * block_bytes : 0;
  const int64_t streamed =
      status.ok() ? t.streamed * kv::WireBytesPerLayer(cache_.shape, options_.wire) : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine_.erase(t.id);
    cancelled_.erase(t.id);
    ++stats_.transfers;
    if (status.ok()) {
      stats_.bytes += bytes;
    } else {
      ++stats_.failures;
    }
  }
  if (status.ok() && t.landed) {  // before the scheduler can hear of it
    std::lock_guard<std::mutex> lock(landed_.mu);
    landed_.by_transfer[t.id] = {.ids = t.blocks, .data = std::move(t.landed)};
  }
  t.landed.reset();
  done_(t.id, std::move(status), bytes, t.reply_ns, streamed);
}

// Aborts and destroys the communicator (no receive is left posted into the
// cache), then fails every transfer of the link.
void KvImportLinks::Link::Reset(const Status& why) {
  if (comm_) comm_->Abort(why.message());
  std::vector<std::unique_ptr<ImportTransfer>> failed = std::move(active_);
  active_.clear();
  // The transfers' requests refer to the communicator: gone before it is.
  for (auto& t : failed) {
    t->reply_request = {};
    t->control_request = {};
    t->block_requests.clear();
  }
  if (comm_) {
    comm_.reset();
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.link_resets;
  }
  connected_.store(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    active_count_ = 0;
  }
  for (auto& t : failed) {
    Report(*t, UnavailableError("KV transfer link to prefill instance " + std::to_string(prefill_) +
                                " failed: " + why.message()));
  }
}

void KvImportLinks::Link::Connect() {
  comm::Store& store = *options_.store;
  Result<int64_t> generation = store.Add(PdGenerationKey(prefill_, decode_), 1);
  if (!generation.ok()) return;
  comm::CommOptions options = options_.comm;
  options.timeout_ms = std::max(kMinDecodeConnectMs, options_.connect_timeout_ms);
  Result<std::unique_ptr<comm::Communicator>> comm = comm::Communicator::Create(
      options_.store, 1, 2, options, PdLinkCommId(prefill_, decode_, *generation));
  if (!comm.ok()) return;
  Result<int64_t> incarnation = ReadCounter(store, PdIncarnationKey(prefill_));
  if (!incarnation.ok()) return;
  comm_ = std::move(*comm);
  comm_->set_timeout_ms(options_.transfer_timeout_ms);
  incarnation_ = *incarnation;
  connected_.store(true);
  std::fprintf(stderr, "tessera serve: KV transfer link to prefill instance %d up (%s)\n", prefill_,
               comm_->TransportTo(0).c_str());
}

Status KvImportLinks::Link::Begin(ImportTransfer& t) {
  const kv::KvCacheShape& shape = cache_.shape;
  kv::TransferHeader h{
      .type = kv::TransferType::kRequest,
      .transfer_id = static_cast<uint64_t>(t.id),
      .first_block = static_cast<uint32_t>(t.first_block),
      .num_blocks = static_cast<uint32_t>(t.blocks.size()),
      .num_tokens = static_cast<uint32_t>(t.tokens.size()),
      .block_size = static_cast<uint32_t>(shape.block_size),
      .bytes_per_block = static_cast<uint64_t>(kv::WireBytesPerBlock(shape, options_.wire)),
      .kv_type = static_cast<uint32_t>(shape.type),
      .wire_type = static_cast<uint32_t>(options_.wire),
      .num_layers = static_cast<uint32_t>(shape.num_layers)};
  const Frame frame = kv::EncodeTransferHeader(h);
  const int tag = PdTransferTag(h.transfer_id);
  TESSERA_ASSIGN_OR_RETURN(t.reply_request, comm_->Irecv(t.reply.data(), t.reply.size(), 0, tag));
  TESSERA_RETURN_IF_ERROR(comm_->Send(frame.data(), frame.size(), 0, kPdRequestTag));
  TESSERA_RETURN_IF_ERROR(
      comm_->Send(t.tokens.data(), t.tokens.size() * sizeof(int32_t), 0, kPdRequestTag));
  // (The scheduler has had its executor map the blocks' memory, in the
  // background, while the prefill instance computes them: PrepareKvBlocks.)
  if (cache_.local == nullptr) {  // several ranks: the memory they wait in for the scheduler
    t.landed = std::make_unique<StagingLease>();
    t.landed->Take(t.blocks.size() * static_cast<size_t>(shape.BytesPerBlock()));
  }
  if (options_.wire != kv::WireType::kRaw) {  // and the buffer a converted stream lands in
    t.staged.Take(t.blocks.size() * static_cast<size_t>(h.bytes_per_block));
  }
  t.state = static_cast<int>(State::kAwaitReply);
  t.deadline_ns = NowNs() + options_.transfer_timeout_ms * 1'000'000;
  return Status::Ok();
}

Result<bool> KvImportLinks::Link::Progress(ImportTransfer& t) {
  const int tag = PdTransferTag(static_cast<uint64_t>(t.id));
  const int64_t block_bytes = kv::WireBytesPerBlock(cache_.shape, options_.wire);
  const bool raw = options_.wire == kv::WireType::kRaw;
  if (t.state == static_cast<int>(State::kAwaitReply)) {
    TESSERA_ASSIGN_OR_RETURN(const bool arrived, t.reply_request.Test());
    if (!arrived) return false;
    const size_t size = t.reply_request.received_bytes();
    t.reply_request = {};
    t.reply_ns = NowNs();
    Result<kv::TransferHeader> reply = kv::DecodeTransferHeader(std::span(t.reply.data(), size));
    Status bad;
    if (!reply.ok()) {
      bad = reply.status();
    } else if (reply->type != kv::TransferType::kReply ||
               reply->transfer_id != static_cast<uint64_t>(t.id)) {
      bad = InvalidArgumentError("KV transfer: a reply of another type or transfer");
    } else if (reply->status != 0) {
      Report(t, UnavailableError("the prefill instance refused the KV transfer (status " +
                                 std::to_string(reply->status) + ")"));
      return true;  // no blocks follow
    } else if (reply->num_blocks != t.blocks.size() ||
               reply->first_block != static_cast<uint64_t>(t.first_block) ||
               reply->bytes_per_block != static_cast<uint64_t>(block_bytes) ||
               reply->kv_type != static_cast<uint32_t>(cache_.shape.type) ||
               reply->wire_type != static_cast<uint32_t>(options_.wire) ||
               reply->num_layers != static_cast<uint32_t>(cache_.shape.num_layers)) {
      bad = InvalidArgumentError(
          "KV transfer reply announces " + std::to_string(reply->num_blocks) + " blocks of " +
          std::to_string(reply->bytes_per_block) + " bytes (type " +
          std::to_string(reply->kv_type) + "); asked for " + std::to_string(t.blocks.size()) +
          " of " + std::to_string(block_bytes));
    }
    if (bad.ok() && IsCancelled(t.id)) {
      bad = AbortedError("the request was cancelled; its KV transfer was given up");
    }
    if (!bad.ok()) {  // this transfer only (or cancelled): the sender is told to drop it
      kv::TransferHeader abort{.type = kv::TransferType::kAbort,
                               .transfer_id = static_cast<uint64_t>(t.id)};
      const Frame frame = kv::EncodeTransferHeader(abort);
      TESSERA_RETURN_IF_ERROR(comm_->Send(frame.data(), frame.size(), 0, tag));
      Report(t, bad);
      return true;
    }
    // Receives for every piece (block, layer), straight into where it lands (the
    // cache's own dtype) or the staging buffer (a converted one), posted before
    // the sender may send; then the first burst's frame.
    const int32_t layers = cache_.shape.num_layers;
    const size_t piece = static_cast<size_t>(kv::WireBytesPerLayer(cache_.shape, options_.wire));
    t.block_requests.reserve(t.blocks.size() * static_cast<size_t>(layers));
    for (size_t b = 0; b < t.blocks.size(); ++b) {
      uint8_t* block =
          raw ? LandingOf(t, b) : t.staged.data() + b * static_cast<size_t>(block_bytes);
      for (int32_t l = 0; l < layers; ++l) {
        TESSERA_ASSIGN_OR_RETURN(comm::Request r,
                                 comm_->Irecv(block + static_cast<size_t>(l) * piece, piece, 0,
                                              PdLayerTag(static_cast<uint64_t>(t.id), l)));
        t.block_requests.push_back(std::move(r));
      }
    }
    t.received.assign(static_cast<size_t>(layers), 0);
    TESSERA_ASSIGN_OR_RETURN(t.control_request,
                             comm_->Irecv(t.control.data(), t.control.size(), 0,
                                          PdControlTag(static_cast<uint64_t>(t.id))));
    kv::TransferHeader ready{.type = kv::TransferType::kReady,
                             .transfer_id = static_cast<uint64_t>(t.id)};
    const Frame frame = kv::EncodeTransferHeader(ready);
    TESSERA_RETURN_IF_ERROR(comm_->Send(frame.data(), frame.size(), 0, tag));
    t.state = static_cast<int>(State::kReceiving);
  }
  if (!t.abort_sent && IsCancelled(t.id)) {  // the prefill's last burst ends it
    kv::TransferHeader abort{.type = kv::TransferType::kAbort,
                             .transfer_id = static_cast<uint64_t>(t.id)};
    const Frame frame = kv::EncodeTransferHeader(abort);
    TESSERA_RETURN_IF_ERROR(comm_->Send(frame.data(), frame.size(), 0, kPdCancelTag));
    t.abort_sent = true;
  }
  return ReceiveBursts(t);
}

// The bursts that have arrived: each frame, then its pieces. A burst's pieces
// follow its frame at once as one stream from the sender: wait for them with the
// communicator's own wait (spin, then sleep on the transport), bounded by the
// transfer deadline; polling them in turn with the other transfers would cap the
// stream at a ring's worth per idle sleep. Converted pieces are decoded one by
// one as they land, while the rest stream in. A burst out of order (the posted
// receives' framing is then unknown) breaks the link; a bad piece or a failed
// prefill fails this transfer once its last burst is in.
Result<bool> KvImportLinks::Link::ReceiveBursts(ImportTransfer& t) {
  const int64_t block_bytes = kv::WireBytesPerBlock(cache_.shape, options_.wire);
  const int64_t piece = kv::WireBytesPerLayer(cache_.shape, options_.wire);
  const bool raw = options_.wire == kv::WireType::kRaw;
  const int64_t total = static_cast<int64_t>(t.blocks.size());
  const int64_t layers = cache_.shape.num_layers;
  for (;;) {
    TESSERA_ASSIGN_OR_RETURN(const bool arrived, t.control_request.Test());
    if (!arrived) return false;
    const int64_t arrived_ns = NowNs();
    const size_t size = t.control_request.received_bytes();
    t.control_request = {};
    TESSERA_ASSIGN_OR_RETURN(kv::TransferHeader burst,
                             kv::DecodeTransferHeader(std::span(t.control.data(), size)));
    const bool last = (burst.flags & kv::kLastBurst) != 0;
    const int64_t first = burst.first_block, count = burst.num_blocks;
    const int64_t layer_begin = burst.layer_begin, layer_end = layer_begin + burst.num_layers;
    // In order: per layer, the burst's blocks are the next ones; the last burst
    // (no blocks) comes once every piece has.
    bool in_order = burst.type == kv::TransferType::kBurst &&
                    burst.transfer_id == static_cast<uint64_t>(t.id) && layer_end <= layers &&
                    (last || (count > 0 && layer_end > layer_begin && count <= total - first));
    for (int64_t l = last ? 0 : layer_begin; in_order && l < (last ? layers : layer_end); ++l) {
      in_order = t.received[static_cast<size_t>(l)] == (last ? total : first);
    }
    if (!in_order) {
      return InvalidArgumentError(
          "KV transfer " + std::to_string(t.id) + ": a burst out of order (blocks " +
          std::to_string(first) + " + " + std::to_string(count) + " of layers " +
          std::to_string(layer_begin) + " to " + std::to_string(layer_end) + ", " +
          std::to_string(total) + " blocks and " + std::to_string(layers) + " layers in all)");
    }
    if ((burst.flags & kv::kPrefillEnded) != 0 && !t.prefill_ended) {
      t.prefill_ended = true;
      t.reply_ns = arrived_ns;  // the prefill's end, as this side sees it
    }
    const size_t due = burst.status == 0 ? static_cast<size_t>(piece) : 0;
    for (int64_t b = first; !last && b < first + count; ++b) {
      for (int64_t l = layer_begin; l < layer_end; ++l) {
        comm::Request& r = t.block_requests[static_cast<size_t>(b * layers + l)];
        TESSERA_RETURN_IF_ERROR(comm_->Wait(r));
        if (r.received_bytes() != due) {
          if (t.failure.ok()) {
            t.failure = InvalidArgumentError("KV transfer: a piece of " +
                                             std::to_string(r.received_bytes()) + " bytes where " +
                                             std::to_string(due) + " were due");
          }
          continue;
        }
        if (!raw && due > 0 && t.failure.ok()) {
          kv::DecodeLayers(cache_.shape, options_.wire, static_cast<int32_t>(l),
                           static_cast<int32_t>(l + 1),
                           t.staged.data() + static_cast<size_t>(b * block_bytes),
                           LandingOf(t, static_cast<size_t>(b)));
        }
      }
    }
    if (!last) {
      for (int64_t l = layer_begin; l < layer_end; ++l) {
        t.received[static_cast<size_t>(l)] = first + count;
      }
      if (!t.prefill_ended) t.streamed += count * (layer_end - layer_begin);
    }
    if (burst.status != 0 && t.failure.ok()) {
      t.failure = UnavailableError("the prefill instance's prefill failed (status " +
                                   std::to_string(burst.status) + ")");
    }
    if (last) {
      t.block_requests.clear();
      t.staged.Release();
      Report(t, t.failure);
      return true;
    }
    TESSERA_ASSIGN_OR_RETURN(t.control_request,
                             comm_->Irecv(t.control.data(), t.control.size(), 0,
                                          PdControlTag(static_cast<uint64_t>(t.id))));
  }
}

void KvImportLinks::Link::Loop() {
  while (!stopping_.load()) {
    if (!comm_) {
      // (Re)connect; transfers that arrive meanwhile wait for it (at most the
      // connect timeout), and fail — their prompts computed locally — if it fails.
      Connect();
      if (!comm_) {
        std::deque<std::unique_ptr<ImportTransfer>> failed;
        {
          std::lock_guard<std::mutex> lock(mu_);
          std::swap(failed, queued_);
        }
        for (auto& t : failed) {
          Report(*t, UnavailableError("no KV transfer link to prefill instance " +
                                      std::to_string(prefill_)));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    // A restarted prefill instance: the link is stale.
    if (NowNs() >= next_watch_ns_) {
      next_watch_ns_ = NowNs() + kWatchEveryNs;
      Result<int64_t> incarnation = ReadCounter(*options_.store, PdIncarnationKey(prefill_));
      if (incarnation.ok() && *incarnation != incarnation_) {
        Reset(UnavailableError("the prefill instance restarted"));
        continue;
      }
    }
    bool progressed = false;
    Status broken;
    for (;;) {
      std::unique_ptr<ImportTransfer> t;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queued_.empty()) break;
        t = std::move(queued_.front());
        queued_.pop_front();
        ++active_count_;
      }
      active_.push_back(std::move(t));
      progressed = true;
      if (Status begun = Begin(*active_.back()); !begun.ok()) {
        broken = begun;
        break;
      }
    }
    for (size_t i = 0; broken.ok() && i < active_.size();) {
      Result<bool> finished = Progress(*active_[i]);
      if (!finished.ok()) {
        broken = finished.status();
        break;
      }
      if (*finished) {
        active_.erase(active_.begin() + static_cast<ptrdiff_t>(i));
        std::lock_guard<std::mutex> lock(mu_);
        --active_count_;
        progressed = true;
        continue;
      }
      if (NowNs() > active_[i]->deadline_ns) {
        broken = DeadlineExceededError("KV transfer " + std::to_string(active_[i]->id) +
                                       " timed out after " +
                                       std::to_string(options_.transfer_timeout_ms) + " ms");
        break;
      }
      ++i;
    }
    if (!broken.ok()) {
      Reset(broken);
      continue;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(kIdlePollUs));
  }
  Reset(AbortedError("the decode instance is stopping"));
  std::deque<std::unique_ptr<ImportTransfer>> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::swap(left, queued_);
  }
  for (auto& t : left) Report(*t, AbortedError("the decode instance is stopping"));
}

KvImportLinks::KvImportLinks(PdCache cache, int decode_index, int num_prefill,
                             PdLinkOptions options, DoneFn done)
    : options_(std::move(options)), done_(std::move(done)), landed_(std::make_unique<Landed>()) {
  for (int p = 0; p < num_prefill; ++p) {
    links_.push_back(std::make_unique<Link>(cache, p, decode_index, options_, done_, *landed_));
  }
}

Status KvImportLinks::Land(int64_t transfer_id, engine::StepExecutor* executor) {
  Landed::Blocks blocks;
  {
    std::lock_guard<std::mutex> lock(landed_->mu);
    auto it = landed_->by_transfer.find(transfer_id);
    if (it == landed_->by_transfer.end()) return Status::Ok();  // landed in place
    blocks = std::move(it->second);
    landed_->by_transfer.erase(it);
  }
  if (executor == nullptr) return Status::Ok();
  return executor->WriteKvBlocks(blocks.ids, blocks.data->data());
}

KvImportLinks::~KvImportLinks() { links_.clear(); }

void KvImportLinks::Start(int64_t transfer_id, std::vector<int32_t> tokens, int64_t first_block,
                          std::vector<int32_t> blocks) {
  auto t = std::make_unique<ImportTransfer>();
  t->id = transfer_id;
  t->tokens = std::move(tokens);
  t->first_block = first_block;
  t->blocks = std::move(blocks);
  // The connected link with the fewest transfers in flight (any, when none is).
  Link* best = nullptr;
  for (auto& link : links_) {
    if (best == nullptr || (link->connected() && !best->connected()) ||
        (link->connected() == best->connected() && link->pending() < best->pending())) {
      best = link.get();
    }
  }
  best->Enqueue(std::move(t));
}

void KvImportLinks::Cancel(int64_t transfer_id) {
  for (auto& link : links_) {
    if (link->Cancel(transfer_id)) return;
  }
}

PdImportStats KvImportLinks::stats() const {
  PdImportStats total;
  for (const auto& link : links_) {
    const PdImportStats s = link->stats();
    total.transfers += s.transfers;
    total.failures += s.failures;
    total.bytes += s.bytes;
    total.link_resets += s.link_resets;
  }
  return total;
}

int KvImportLinks::connected() const {
  int n = 0;
  for (const auto& link : links_) n += link->connected() ? 1 : 0;
  return n;
}

// ---------------------------------------------------------------------------
// Prefill side.

namespace {

// One accepted transfer. The scheduler thread copies its pieces (block, layer)
// into `staged` as the prefill makes them final — layer by layer within a step on
// a one-rank instance, whole blocks after each step otherwise — and publishes, per
// layer, how many blocks (`ready`), then `finished` (with `status`); the link
// thread streams them in bursts.
struct Export {
  kv::TransferHeader request;
  std::vector<int32_t> tokens;
  StagingLease staged;          // the pieces, copied while the scheduler held the blocks
                                // (taken at Accept, before the prefill is submitted)
  std::vector<int64_t> copied;  // per layer: blocks whose piece is copied (scheduler thread)
  std::unique_ptr<std::atomic<int64_t>[]> ready;  // = copied, for the link thread
  int64_t encoded = 0;                            // blocks copied in every layer
  uint32_t status = 0;                            // a StatusCode when the prefill failed
  // Every block is final and the prefill's steps are over: what is published
  // from now on counts as sent after the prefill's end.
  std::atomic<bool> computed{false};
  std::atomic<bool> finished{false};              // the prefill ended (status is set)
  std::shared_ptr<engine::RequestHandle> handle;  // cancelled when the decode side aborts
  std::vector<int64_t> sent;                      // per layer: blocks sent (link thread)
  int64_t bursts = 0;                             // bursts sent (link thread)
  bool streaming = false;                         // the decode side posted its receives
  Frame answer{};
  comm::Request answer_request;
  int64_t deadline_ns = 0;

  int32_t layers() const { return static_cast<int32_t>(request.num_layers); }
  // The transfer's blocks whose K/V is final once `computed_tokens` are.
  int64_t FinalBlocks(int64_t computed_tokens) const {
    return std::clamp<int64_t>(computed_tokens / request.block_size - request.first_block, 0,
                               request.num_blocks);
  }
  // Where piece (b, l) waits in `staged` (the link thread reads it only once
  // published as ready).
  uint8_t* PieceAt(int64_t b, int32_t l) const {
    const size_t block = static_cast<size_t>(request.bytes_per_block);
    return staged.data() + static_cast<size_t>(b) * block +
           static_cast<size_t>(l) * (block / request.num_layers);
  }
  // Layer `layer` of the transfer's blocks [from, from + pieces.size()) (each
  // that layer's K and V as a whole-model cache lays them out): those not copied
  // yet are encoded into their place, when they continue what is (a gap waits for
  // on_progress), and published.
  void CopyLayer(const kv::KvCacheShape& shape, kv::WireType wire, int32_t layer, int64_t from,
                 std::span<const uint8_t* const> pieces) {
    int64_t& done = copied[static_cast<size_t>(layer)];
    const int64_t end = from + static_cast<int64_t>(pieces.size());
    if (from > done || end <= done) return;
    kv::KvCacheShape one = shape;
    one.num_layers = 1;
    for (int64_t b = done; b < end; ++b) {
      kv::EncodeBlock(one, wire, pieces[static_cast<size_t>(b - from)], PieceAt(b, layer));
    }
    done = end;
    ready[static_cast<size_t>(layer)].store(done, std::memory_order_release);
  }
};

}  // namespace

class KvExportLinks::Link {
 public:
  Link(const PdCache& cache, engine::Scheduler& scheduler, int prefill, int decode,
       const PdLinkOptions& options)
      : cache_(cache),
        scheduler_(scheduler),
        prefill_(prefill),
        decode_(decode),
        options_(options) {
    thread_ = std::thread([this] { Loop(); });
  }
  ~Link() {
    stopping_.store(true);
    thread_.join();
  }
  bool connected() const { return connected_.load(); }

 private:
  void Loop();
  void Watch();
  Status Serve();
  Status Accept(const kv::TransferHeader& h);
  Status Reply(const kv::TransferHeader& request, uint32_t status);
  // A decode side's kAbort on kPdCancelTag: that prefill is cancelled.
  Status TakeCancels();
  // Sends e's next burst when it has one; true when e is done (its last burst went).
  Result<bool> Stream(Export& e);
  Status SendBurst(Export& e, int64_t from, int64_t to, int32_t layer_begin, int32_t layer_end,
                   uint32_t status, uint32_t flags);
  void Reset(const Status& why);

  const PdCache cache_;
  engine::Scheduler& scheduler_;
  const int prefill_, decode_;
  const PdLinkOptions& options_;
  std::unique_ptr<comm::Communicator> comm_;
  int64_t generation_ = 0;  // the link's (or the last one tried)
  int64_t next_watch_ns_ = 0;
  Frame request_frame_{};
  comm::Request request_;  // the posted receive of the next kRequest
  Frame cancel_frame_{};
  comm::Request cancel_;                          // the posted receive of the next cancel
  std::vector<std::shared_ptr<Export>> exports_;  // link thread only
  std::atomic<bool> connected_{false};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

void KvExportLinks::Link::Reset(const Status& why) {
  if (comm_) {
    comm_->Abort(why.message());
    request_ = {};
    cancel_ = {};
    for (auto& e : exports_) {
      e->answer_request = {};
      if (e->handle) e->handle->Cancel();  // its blocks have nowhere to go
    }
    comm_.reset();
  }
  exports_.clear();  // the scheduler's callbacks hold their own references
  connected_.store(false);
}

// Joins a link the decode side opened (a generation newer than the last tried),
// or drops the link when the decode side opened a newer one (it restarted or
// reset).
void KvExportLinks::Link::Watch() {
  if (NowNs() < next_watch_ns_) return;
  next_watch_ns_ = NowNs() + kWatchEveryNs;
  Result<int64_t> generation = ReadCounter(*options_.store, PdGenerationKey(prefill_, decode_));
  if (!generation.ok() || *generation <= generation_) return;
  Reset(UnavailableError("the decode instance opened a new link"));
  generation_ = *generation;
  comm::CommOptions options = options_.comm;
  options.timeout_ms = kPrefillConnectMs;
  Result<std::unique_ptr<comm::Communicator>> comm = comm::Communicator::Create(
      options_.store, 0, 2, options, PdLinkCommId(prefill_, decode_, generation_));
  if (!comm.ok()) return;  // waits for the next generation
  comm_ = std::move(*comm);
  comm_->set_timeout_ms(options_.transfer_timeout_ms);
  connected_.store(true);
}

Status KvExportLinks::Link::Reply(const kv::TransferHeader& request, uint32_t status) {
  kv::TransferHeader reply = request;
  reply.type = kv::TransferType::kReply;
  reply.status = status;
  const Frame frame = kv::EncodeTransferHeader(reply);
  return comm_->Send(frame.data(), frame.size(), 1, PdTransferTag(reply.transfer_id));
}

// A request from the decode side: refused at once when it does not fit this
// instance or the scheduler; else a prefill-only request on the scheduler, whose
// blocks stream to the decode side as its steps make them final.
Status KvExportLinks::Link::Accept(const kv::TransferHeader& h) {
  auto e = std::make_shared<Export>();
  e->request = h;
  e->tokens.resize(h.num_tokens);
  size_t got = 0;
  TESSERA_RETURN_IF_ERROR(
      comm_->Recv(e->tokens.data(), e->tokens.size() * sizeof(int32_t), 1, kPdRequestTag, &got));
  const kv::KvCacheShape& shape = cache_.shape;
  const auto wire = static_cast<kv::WireType>(h.wire_type);  // in range: the decoder checked
  if (got != e->tokens.size() * sizeof(int32_t) || h.block_size != uint32_t(shape.block_size) ||
      h.bytes_per_block != static_cast<uint64_t>(kv::WireBytesPerBlock(shape, wire)) ||
      h.kv_type != static_cast<uint32_t>(shape.type) ||
      h.num_layers != static_cast<uint32_t>(shape.num_layers)) {
    return Reply(h, static_cast<uint32_t>(StatusCode::kInvalidArgument));
  }
  // A prompt this instance cannot hold (the scheduler would refuse it) is refused
  // before any memory is sized from the request.
  if (int64_t{h.num_tokens} + 1 > scheduler_.max_model_len()) {
    return Reply(h, static_cast<uint32_t>(StatusCode::kInvalidArgument));
  }
  // The staging memory, its pages mapped below while the prefill computes: on a
  // VM a fresh page's first touch costs ~12 µs, tens of ms for a long prompt's
  // blocks, which would land on the prefill's own thread.
  const size_t staged_bytes = static_cast<size_t>(h.num_blocks) * h.bytes_per_block;
  e->staged.Take(staged_bytes, /*populate=*/false);
  engine::RequestParams params;
  params.prompt = e->tokens;
  params.max_tokens = 1;
  const int32_t layers = shape.num_layers;
  e->copied.assign(static_cast<size_t>(layers), 0);
  e->ready = std::make_unique<std::atomic<int64_t>[]>(static_cast<size_t>(layers));
  e->sent.assign(static_cast<size_t>(layers), 0);
  engine::RequestCallbacks callbacks;
  // Each layer's pieces of the blocks the running step completes, copied as soon
  // as the layer's attention has written them (every rank's heads placed by the
  // executor).
  callbacks.on_layer_kv = [e, cache = cache_, wire](int64_t first_block, int32_t layer,
                                                    std::span<const uint8_t* const> pieces) {
    if (layer < 0 || layer >= e->layers()) return;
    // Table blocks → the transfer's (which start after the decode side's prefix).
    const int64_t skip = std::max<int64_t>(0, e->request.first_block - first_block);
    if (skip >= static_cast<int64_t>(pieces.size())) return;
    const int64_t from = first_block + skip - e->request.first_block;
    const int64_t count = std::min<int64_t>(static_cast<int64_t>(pieces.size()) - skip,
                                            int64_t{e->request.num_blocks} - from);
    if (count <= 0) return;
    e->CopyLayer(cache.shape, wire, layer, from,
                 pieces.subspan(static_cast<size_t>(skip), static_cast<size_t>(count)));
  };
  // After each step: what is final now and not copied yet (what the layer
  // callbacks did not take: all of it where the executor reports no layers) — in
  // place from a one-rank cache, else whole blocks gathered from every rank by the
  // executor (a failed read leaves them uncopied, which fails the transfer at the
  // end).
  callbacks.on_progress = [e, cache = cache_, wire](std::span<const int32_t> blocks,
                                                    int64_t computed_tokens,
                                                    engine::StepExecutor& executor) {
    const int64_t first = e->request.first_block;
    const int64_t final = e->FinalBlocks(computed_tokens);
    if (final <= e->encoded || static_cast<int64_t>(blocks.size()) < first + final) return;
    if (final == e->request.num_blocks) e->computed.store(true, std::memory_order_release);
    const int64_t from = *std::min_element(e->copied.begin(), e->copied.end());
    const size_t whole_bytes = static_cast<size_t>(cache.shape.BytesPerBlock());
    const size_t layer_bytes = whole_bytes / static_cast<size_t>(e->layers());
    StagingLease gathered;
    if (cache.local == nullptr && from < final) {
      gathered.Take(static_cast<size_t>(final - from) * whole_bytes);
      const std::span<const int32_t> todo =
          blocks.subspan(static_cast<size_t>(first + from), static_cast<size_t>(final - from));
      if (!executor.ReadKvBlocks(todo, gathered.data()).ok()) return;
    }
    std::vector<const uint8_t*> pieces;
    for (int32_t l = 0; l < e->layers(); ++l) {
      const int64_t done = e->copied[static_cast<size_t>(l)];
      pieces.clear();
      for (int64_t b = done; b < final; ++b) {
        const uint8_t* block = cache.local != nullptr
                                   ? cache.local->block_data(blocks[static_cast<size_t>(first + b)])
                                   : gathered.data() + static_cast<size_t>(b - from) * whole_bytes;
        pieces.push_back(block + static_cast<size_t>(l) * layer_bytes);
      }
      e->CopyLayer(cache.shape, wire, l, done, pieces);
    }
    e->encoded = final;
  };
  callbacks.on_prefilled = [](std::span<const int32_t>) {};  // on_progress copied them all
  callbacks.on_done = [e](const engine::RequestResult& result) {
    if (result.reason != engine::FinishReason::kStop || e->encoded != e->request.num_blocks) {
      e->status =
          static_cast<uint32_t>(result.error.ok() ? StatusCode::kUnavailable : result.error.code());
    }
    e->finished.store(true, std::memory_order_release);
  };
  Result<std::shared_ptr<engine::RequestHandle>> submitted =
      scheduler_.Submit(std::move(params), std::move(callbacks));
  if (!submitted.ok()) return Reply(h, static_cast<uint32_t>(submitted.status().code()));
  e->handle = *submitted;
  TESSERA_RETURN_IF_ERROR(Reply(h, 0));
  // Mapping leaves pages the prefill has written meanwhile as they are.
  PopulateForWrite(e->staged.data(), staged_bytes);
  const int tag = PdTransferTag(h.transfer_id);
  TESSERA_ASSIGN_OR_RETURN(e->answer_request,
                           comm_->Irecv(e->answer.data(), e->answer.size(), 1, tag));
  e->deadline_ns = NowNs() + options_.transfer_timeout_ms * 1'000'000;
  exports_.push_back(std::move(e));
  return Status::Ok();
}

// Sends what is ready and not sent: a burst for each run of layers that have
// the same blocks to go, then, once the prefill has ended (everything left goes,
// empty if it failed), the last burst.
Result<bool> KvExportLinks::Link::Stream(Export& e) {
  const bool finished = e.finished.load(std::memory_order_acquire);
  const int64_t total = e.request.num_blocks;
  const bool ok = finished && e.status == 0 && e.encoded == total;
  const uint32_t status =
      finished && !ok ? (e.status != 0 ? e.status : static_cast<uint32_t>(StatusCode::kUnavailable))
                      : 0;
  std::vector<int64_t> target(e.sent.size());
  for (size_t l = 0; l < target.size(); ++l) {
    target[l] = finished ? total : e.ready[l].load(std::memory_order_acquire);
  }
  // Read after the targets: pieces published once the steps were over are seen
  // with it set (a piece a layer callback published just before may be counted
  // as after the end too: the count errs on the late side).
  const uint32_t flags =
      finished || e.computed.load(std::memory_order_acquire) ? kv::kPrefillEnded : 0;
  for (int32_t l = 0; l < e.layers();) {
    const int64_t from = e.sent[static_cast<size_t>(l)], to = target[static_cast<size_t>(l)];
    int32_t end = l + 1;
    if (to > from) {
      while (end < e.layers() && e.sent[static_cast<size_t>(end)] == from &&
             target[static_cast<size_t>(end)] == to) {
        ++end;
      }
      TESSERA_RETURN_IF_ERROR(SendBurst(e, from, to, l, end, status, flags));
      std::fill(e.sent.begin() + l, e.sent.begin() + end, to);
    }
    l = end;
  }
  if (!finished) return false;
  TESSERA_RETURN_IF_ERROR(SendBurst(e, total, total, 0, 0, status, flags | kv::kLastBurst));
  return true;
}

// One burst: its frame, then the pieces of blocks [from, to) in layers
// [layer_begin, layer_end), each on its layer's tag (an empty message for each
// when `status` says the prefill failed).
Status KvExportLinks::Link::SendBurst(Export& e, int64_t from, int64_t to, int32_t layer_begin,
                                      int32_t layer_end, uint32_t status, uint32_t flags) {
  kv::TransferHeader burst = e.request;
  burst.type = kv::TransferType::kBurst;
  burst.first_block = static_cast<uint32_t>(from);
  burst.num_blocks = static_cast<uint32_t>(to - from);
  burst.layer_begin = static_cast<uint32_t>(layer_begin);
  burst.num_layers = static_cast<uint32_t>(layer_end - layer_begin);
  burst.status = status;
  burst.flags = flags;
  const Frame frame = kv::EncodeTransferHeader(burst);
  TESSERA_RETURN_IF_ERROR(
      comm_->Send(frame.data(), frame.size(), 1, PdControlTag(e.request.transfer_id)));
  ++e.bursts;
  const size_t piece = static_cast<size_t>(e.request.bytes_per_block / e.request.num_layers);
  std::vector<comm::Request> sends;
  sends.reserve(static_cast<size_t>((to - from) * (layer_end - layer_begin)));
  for (int64_t b = from; b < to; ++b) {
    for (int32_t l = layer_begin; l < layer_end; ++l) {
      const uint8_t* data = status == 0 ? e.PieceAt(b, l) : nullptr;
      TESSERA_ASSIGN_OR_RETURN(comm::Request r, comm_->Isend(data, status == 0 ? piece : 0, 1,
                                                             PdLayerTag(e.request.transfer_id, l)));
      sends.push_back(std::move(r));
    }
  }
  return comm_->WaitAll(sends);
}

Status KvExportLinks::Link::TakeCancels() {
  for (;;) {
    if (!cancel_.valid()) {
      TESSERA_ASSIGN_OR_RETURN(
          cancel_, comm_->Irecv(cancel_frame_.data(), cancel_frame_.size(), 1, kPdCancelTag));
    }
    TESSERA_ASSIGN_OR_RETURN(const bool arrived, cancel_.Test());
    if (!arrived) return Status::Ok();
    const size_t size = cancel_.received_bytes();
    cancel_ = {};
    TESSERA_ASSIGN_OR_RETURN(kv::TransferHeader h,
                             kv::DecodeTransferHeader(std::span(cancel_frame_.data(), size)));
    if (h.type != kv::TransferType::kAbort) {
      return InvalidArgumentError("KV transfer: expected an abort frame on the cancel tag");
    }
    for (auto& e : exports_) {  // one that ended meanwhile is not here: nothing to do
      if (e->request.transfer_id == h.transfer_id && e->handle) e->handle->Cancel();
    }
  }
}

Status KvExportLinks::Link::Serve() {
  bool progressed = false;
  TESSERA_RETURN_IF_ERROR(TakeCancels());
  if (!request_.valid()) {
    TESSERA_ASSIGN_OR_RETURN(
        request_, comm_->Irecv(request_frame_.data(), request_frame_.size(), 1, kPdRequestTag));
  }
  TESSERA_ASSIGN_OR_RETURN(const bool arrived, request_.Test());
  if (arrived) {
    const size_t size = request_.received_bytes();
    request_ = {};
    // A malformed request leaves the stream's framing unknown: the link is reset.
    TESSERA_ASSIGN_OR_RETURN(kv::TransferHeader h,
                             kv::DecodeTransferHeader(std::span(request_frame_.data(), size)));
    if (h.type != kv::TransferType::kRequest) {
      return InvalidArgumentError("KV transfer: expected a request frame");
    }
    TESSERA_RETURN_IF_ERROR(Accept(h));
    progressed = true;
  }
  for (size_t i = 0; i < exports_.size();) {
    Export& e = *exports_[i];
    if (!e.streaming) {  // the decode side's kReady (or kAbort) to the accepting reply
      TESSERA_ASSIGN_OR_RETURN(const bool answered, e.answer_request.Test());
      if (!answered) {
        if (NowNs() > e.deadline_ns) {
          return DeadlineExceededError("the decode instance never took KV transfer " +
                                       std::to_string(e.request.transfer_id));
        }
        ++i;
        continue;
      }
      const size_t size = e.answer_request.received_bytes();
      e.answer_request = {};
      TESSERA_ASSIGN_OR_RETURN(kv::TransferHeader answer,
                               kv::DecodeTransferHeader(std::span(e.answer.data(), size)));
      if (answer.type == kv::TransferType::kAbort) {
        e.handle->Cancel();  // nobody waits for these blocks any more
        exports_.erase(exports_.begin() + static_cast<ptrdiff_t>(i));
        progressed = true;
        continue;
      }
      if (answer.type != kv::TransferType::kReady) {
        return InvalidArgumentError("KV transfer: expected ready or abort");
      }
      e.streaming = true;
      progressed = true;
    }
    const int64_t bursts_before = e.bursts;
    TESSERA_ASSIGN_OR_RETURN(const bool done, Stream(e));
    progressed = progressed || e.bursts != bursts_before;
    if (done) {
      exports_.erase(exports_.begin() + static_cast<ptrdiff_t>(i));
      progressed = true;
      continue;
    }
    ++i;
  }
  if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(kIdlePollUs));
  return Status::Ok();
}

void KvExportLinks::Link::Loop() {
  while (!stopping_.load()) {
    Watch();
    if (!comm_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (Status served = Serve(); !served.ok()) {
      std::fprintf(stderr, "tessera serve: KV transfer link to decode instance %d reset: %s\n",
                   decode_, served.ToString().c_str());
      Reset(served);
    }
  }
  Reset(AbortedError("the prefill instance is stopping"));
}

KvExportLinks::KvExportLinks(PdCache cache, engine::Scheduler& scheduler, int prefill_index,
                             int num_decode, PdLinkOptions options)
    : options_(std::move(options)) {
  // A new incarnation: decode instances drop links to a previous process.
  Result<int64_t> incarnation = options_.store->Add(PdIncarnationKey(prefill_index), 1);
  (void)incarnation;
  for (int d = 0; d < num_decode; ++d) {
    links_.push_back(std::make_unique<Link>(cache, scheduler, prefill_index, d, options_));
  }
}

KvExportLinks::~KvExportLinks() { links_.clear(); }

int KvExportLinks::connected() const {
  int n = 0;
  for (const auto& link : links_) n += link->connected() ? 1 : 0;
  return n;
}

}  // namespace tessera::serve
