#include "comm/communicator.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <functional>
#include <limits>

#include "base/log.h"
#include "comm/algorithms/algorithms.h"
#include "comm/net_util.h"
#include "comm/reduce.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/transport/host_identity.h"
#include "comm/transport/shm_channel.h"
#include "comm/transport/tcp_channel.h"

namespace tessera::comm {
namespace {

constexpr uint32_t kHelloMagic = 0x4c4c4548;  // "HELL"

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint32_t connection;
  uint32_t reserved;
  uint64_t comm_hash;
};

std::string Sanitize(const std::string& text, size_t max_len) {
  std::string out;
  for (char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') out += c;
    if (out.size() >= max_len) break;
  }
  return out.empty() ? "job" : out;
}

uint64_t HashId(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

int CpusAvailable() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return std::max<int>(static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)), 1);
}

bool CountOk(size_t count, DataType dtype, size_t multiplier) {
  size_t limit =
      std::numeric_limits<size_t>::max() / DataTypeSize(dtype) / std::max<size_t>(multiplier, 1);
  return count <= limit;
}

// A rank's one block of `bytes` against the `num_blocks` blocks it gathers into or
// scatters from: either apart, or exactly block `index` of them (the in-place form,
// when `index` >= 0). Any other overlap would have the rank overwrite bytes it
// still sends, or send bytes it is receiving into.
Status CheckBlockOverlap(const char* op, const void* block, const void* blocks, size_t bytes,
                         int num_blocks, int index) {
  const auto b = reinterpret_cast<uintptr_t>(block);
  const auto all = reinterpret_cast<uintptr_t>(blocks);
  const size_t all_bytes = bytes * static_cast<size_t>(num_blocks);
  if (bytes == 0 || block == nullptr || blocks == nullptr) return Status::Ok();
  if (index >= 0 && b == all + bytes * static_cast<size_t>(index)) return Status::Ok();
  if (b + bytes <= all || all + all_bytes <= b) return Status::Ok();
  std::string message = std::string(op) + ": the send and receive buffers overlap";
  if (index >= 0) {
    message += " but not in the in-place form (the single block == the " +
               std::to_string(num_blocks) + "-block buffer + " + std::to_string(index) + " blocks)";
  } else {
    message += "; use separate buffers";
  }
  return InvalidArgumentError(message);
}

}  // namespace

void Request::ForgetSelfReceive() {
  if (comm_ != nullptr && recv_ && !recv_->done && recv_->peer == comm_->rank_) {
    std::erase(comm_->self_recvs_, recv_.get());
  }
}

Status Request::Wait() {
  if (comm_ == nullptr) return InvalidArgumentError("Wait on an empty request");
  return comm_->Wait(*this);
}

Result<bool> Request::Test() {
  if (comm_ == nullptr) return InvalidArgumentError("Test on an empty request");
  Op* op = send_ ? static_cast<Op*>(send_.get()) : static_cast<Op*>(recv_.get());
  Op* ops[] = {op};
  return comm_->messenger_->Test(ops);
}

Result<std::unique_ptr<Communicator>> Communicator::Create(std::shared_ptr<Store> store, int rank,
                                                           int size, CommOptions options,
                                                           std::string comm_id) {
  if (size < 1 || rank < 0 || rank >= size) {
    return InvalidArgumentError("bad rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  if (store == nullptr) return InvalidArgumentError("Communicator::Create needs a store");
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->store_ = std::move(store);
  comm->rank_ = rank;
  comm->size_ = size;
  comm->id_ = std::move(comm_id);
  comm->options_ = std::move(options);
  comm->prefix_store_ = std::make_unique<PrefixStore>(
      *comm->store_, "comm/" + comm->options_.job_id + "/" + comm->id_);
  Status connected = comm->Connect(*comm->prefix_store_);
  if (!connected.ok()) {
    return connected.WithContext("rank " + std::to_string(rank) + " joining communicator '" +
                                 comm->id_ + "' of " + std::to_string(size));
  }
  return comm;
}

Communicator::~Communicator() = default;

Result<std::vector<bool>> Communicator::ProbeSingleCopy(Store& store,
                                                        const std::vector<bool>& use_shm,
                                                        const std::vector<int>& pids,
                                                        const Deadline& deadline) {
  // Each rank publishes where its segment's salt lives in its own address space;
  // a peer that reads the same value there with process_vm_readv may single-copy
  // from us. Then each says whom it can read, so senders know.
  const int n = size_;
  const int r = rank_;
  char addr[32];
  std::snprintf(addr, sizeof(addr), "%llx",
                static_cast<unsigned long long>(
                    reinterpret_cast<uintptr_t>(&segments_[r].control()->ring_salt)));
  TESSERA_RETURN_IF_ERROR(store.SetString("copy_addr/" + std::to_string(r), addr));
  std::string can_read(static_cast<size_t>(n), '0');
  for (int p = 0; p < n; ++p) {
    if (!use_shm[p]) continue;
    TESSERA_ASSIGN_OR_RETURN(std::string text,
                             store.GetString("copy_addr/" + std::to_string(p), deadline));
    const uint64_t remote = std::strtoull(text.c_str(), nullptr, 16);
    uint64_t value = 0;
    iovec local{&value, sizeof(value)};
    iovec from{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), sizeof(value)};
    const bool ok = ::process_vm_readv(pids[p], &local, 1, &from, 1, 0) ==
                        static_cast<ssize_t>(sizeof(value)) &&
                    value == segments_[p].control()->ring_salt;
    if (ok) can_read[static_cast<size_t>(p)] = '1';
  }
  TESSERA_RETURN_IF_ERROR(store.SetString("copy_reads/" + std::to_string(r), can_read));
  std::vector<bool> reads_us(static_cast<size_t>(n), false);
  for (int p = 0; p < n; ++p) {
    if (!use_shm[p]) continue;
    TESSERA_ASSIGN_OR_RETURN(std::string theirs,
                             store.GetString("copy_reads/" + std::to_string(p), deadline));
    reads_us[p] = theirs.size() == static_cast<size_t>(n) && theirs[r] == '1';
  }
  return reads_us;
}

Status Communicator::Connect(Store& store) {
  const int n = size_;
  const int r = rank_;
  const Deadline deadline =
      options_.timeout_ms <= 0 ? Deadline::Never() : Deadline::AfterMs(options_.timeout_ms);
  const std::string host_id = LocalHostIdentity();
  TESSERA_RETURN_IF_ERROR(
      store.SetString("host/" + std::to_string(r), std::to_string(::getpid()) + " " + host_id));
  std::vector<int> pids(n, -1);
  std::vector<bool> use_shm(n, false), use_tcp(n, false);
  int local_ranks = 0;
  for (int p = 0; p < n; ++p) {
    TESSERA_ASSIGN_OR_RETURN(std::string value,
                             store.GetString("host/" + std::to_string(p), deadline));
    size_t space = value.find(' ');
    if (space == std::string::npos) return InvalidArgumentError("malformed host record");
    std::from_chars(value.data(), value.data() + space, pids[p]);
    bool same_host = value.substr(space + 1) == host_id;
    if (same_host) ++local_ranks;
    if (p == r) continue;
    if (options_.transport == TransportKind::kShm && !same_host) {
      return InvalidArgumentError("transport shm was forced but rank " + std::to_string(p) +
                                  " runs on another host");
    }
    use_shm[p] = same_host && options_.transport != TransportKind::kTcp;
    use_tcp[p] = !use_shm[p];
  }
  const bool any_shm = std::count(use_shm.begin(), use_shm.end(), true) > 0;
  const bool any_tcp = std::count(use_tcp.begin(), use_tcp.end(), true) > 0;

  // TCP: listen and publish our address.
  UniqueFd listener;
  if (any_tcp) {
    std::string advertised = options_.listen_host;
    if (advertised.empty()) {
      auto* tcp_store = dynamic_cast<TcpStore*>(store_.get());
      advertised = tcp_store != nullptr ? tcp_store->local_host() : "127.0.0.1";
    }
    int port = 0;
    TESSERA_ASSIGN_OR_RETURN(
        listener, ListenTcp(options_.listen_host.empty() ? "0.0.0.0" : advertised, 0, &port));
    TESSERA_RETURN_IF_ERROR(
        store.SetString("addr/" + std::to_string(r), HostPort{advertised, port}.ToString()));
  }

  // Shared memory: create ours, map the peers', unlink ours once all mapped it.
  segments_.resize(n);
  std::vector<bool> peer_reads_us(n, false);
  if (any_shm) {
    shm_prefix_ = "/tessera-" + Sanitize(options_.job_id, 40) + "-" + [&] {
      char b[20];
      std::snprintf(b, sizeof(b), "%012llx",
                    static_cast<unsigned long long>(HashId(id_) & 0xffffffffffffull));
      return std::string(b);
    }();
    std::string name = shm_prefix_ + "-r" + std::to_string(r);
    TESSERA_ASSIGN_OR_RETURN(segments_[r], ShmSegment::Create(name, n, options_.shm_ring_bytes,
                                                              options_.allreduce_oneshot_bytes));
    TESSERA_RETURN_IF_ERROR(store.SetString("shm/" + std::to_string(r), name));
    for (int p = 0; p < n; ++p) {
      if (!use_shm[p]) continue;
      TESSERA_ASSIGN_OR_RETURN(std::string peer_name,
                               store.GetString("shm/" + std::to_string(p), deadline));
      TESSERA_ASSIGN_OR_RETURN(segments_[p], ShmSegment::Open(peer_name, n, options_.shm_ring_bytes,
                                                              options_.allreduce_oneshot_bytes));
    }
    TESSERA_RETURN_IF_ERROR(store.SetString("shm_mapped/" + std::to_string(r), "1"));
    for (int p = 0; p < n; ++p) {
      if (!use_shm[p]) continue;
      TESSERA_RETURN_IF_ERROR(
          store.GetString("shm_mapped/" + std::to_string(p), deadline).status());
    }
    segments_[r].Unlink();
    if (options_.shm_single_copy_bytes > 0) {
      TESSERA_ASSIGN_OR_RETURN(peer_reads_us, ProbeSingleCopy(store, use_shm, pids, deadline));
    }
  }

  // TCP: connect to lower ranks, accept higher ones.
  const int conns = options_.tcp_connections;
  const uint64_t comm_hash = HashId(options_.job_id + "/" + id_);
  std::vector<std::vector<UniqueFd>> fds(n);
  std::vector<std::string> addresses(n);
  for (int p = 0; p < r; ++p) {
    if (!use_tcp[p]) continue;
    TESSERA_ASSIGN_OR_RETURN(addresses[p], store.GetString("addr/" + std::to_string(p), deadline));
    TESSERA_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(addresses[p]));
    for (int k = 0; k < conns; ++k) {
      TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(hp, deadline));
      Status auth = AuthenticateAsClient(fd.get(), options_.cluster_token, deadline);
      if (!auth.ok()) return auth.WithContext("connecting to rank " + std::to_string(p));
      Hello hello{kHelloMagic, static_cast<uint32_t>(r), static_cast<uint32_t>(k), 0, comm_hash};
      TESSERA_RETURN_IF_ERROR(WriteFull(fd.get(), &hello, sizeof(hello), deadline));
      fds[p].push_back(std::move(fd));
    }
  }
  int expected = 0;
  for (int p = r + 1; p < n; ++p) expected += use_tcp[p] ? conns : 0;
  for (int p = r + 1; p < n; ++p) {
    if (use_tcp[p]) fds[p].resize(conns);
  }
  int accepted = 0;
  while (accepted < expected) {
    TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, AcceptTcp(listener.get(), deadline));
    Deadline handshake = Deadline::AfterMs(std::min<int64_t>(10'000, options_.timeout_ms));
    Status auth = AuthenticateAsServer(fd.get(), options_.cluster_token, handshake);
    if (!auth.ok()) {
      TLOG_WARN("comm", "rank %d refused a transport connection: %s", r, auth.ToString().c_str());
      continue;
    }
    Hello hello{};
    if (!ReadFull(fd.get(), &hello, sizeof(hello), handshake).ok()) continue;
    int p = static_cast<int>(hello.rank);
    if (hello.magic != kHelloMagic || hello.comm_hash != comm_hash || p <= r || p >= n ||
        !use_tcp[p] || hello.connection >= static_cast<uint32_t>(conns) ||
        fds[p][hello.connection].valid()) {
      TLOG_WARN("comm", "rank %d dropped a transport connection with a bad hello", r);
      continue;
    }
    if (addresses[p].empty()) addresses[p] = SocketPeerAddress(fd.get());
    fds[p][hello.connection] = std::move(fd);
    ++accepted;
  }

  // Channels and the messenger.
  std::vector<std::unique_ptr<Channel>> channels(n);
  std::vector<PeerInfo> peers(n);
  transport_names_.assign(n, "self");
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    if (use_shm[p]) {
      channels[p] =
          std::make_unique<ShmChannel>(segments_[r], r, segments_[p], p, options_.shm_chunk_bytes);
      peers[p].address = "shm";
      peers[p].pid = pids[p];
      peers[p].shm_control = segments_[p].control();
      peers[p].mailbox[0] = segments_[p].slot(0);
      peers[p].mailbox[1] = segments_[p].slot(1);
      peers[p].reads_us = peer_reads_us[p];
      peers[p].copy_acks_from = segments_[r].copy_ack(p);
      peers[p].copy_acks_to = segments_[p].copy_ack(r);
    } else {
      channels[p] =
          std::make_unique<TcpChannel>(std::move(fds[p]), options_.tcp_stripe_bytes, addresses[p]);
      if (options_.tcp_emulated_delay_us > 0) {
        channels[p] = std::make_unique<DelayedChannel>(std::move(channels[p]),
                                                       options_.tcp_emulated_delay_us * 1000);
      }
      peers[p].address = addresses[p];
    }
    transport_names_[p] = channels[p]->Describe();
  }
  WaitOptions wait;
  wait.timeout_ms = options_.timeout_ms;
  wait.unexpected_limit_bytes = options_.unexpected_limit_bytes;
  wait.single_copy_bytes = options_.shm_single_copy_bytes;
  wait.single_copy_max_bytes = options_.shm_single_copy_max_bytes;
  wait.single_copy_allreduce_max_bytes = options_.shm_single_copy_allreduce_max_bytes;
  wait.bypass_cache_bytes = options_.copy_bypass_cache_bytes;
  wait.window_copy_bytes = options_.shm_shared_buffer_bytes;
  const int local = options_.local_ranks_hint > 0 ? options_.local_ranks_hint : local_ranks;
  const bool oversubscribed = local > CpusAvailable();
  wait.yield_while_spinning = oversubscribed;
  if (options_.spin_us >= 0) {
    wait.spin_ns = options_.spin_us * 1000;
  } else {
    wait.spin_ns = oversubscribed ? 20'000 : 100'000;
  }
  // The mailbox (one-shot all-reduce) when every rank shares this host.
  const bool all_shm = any_shm && !any_tcp;
  if (all_shm) {
    peers[r].mailbox[0] = segments_[r].slot(0);
    peers[r].mailbox[1] = segments_[r].slot(1);
  }
  messenger_ = std::make_unique<Messenger>(r, n, std::move(channels), std::move(peers),
                                           any_shm ? segments_[r].control() : nullptr, wait,
                                           prefix_store_.get());
  if (all_shm && options_.allreduce_oneshot_bytes > 0) {
    messenger_->EnableMailbox(options_.allreduce_oneshot_bytes);
  }
  TLOG_INFO("comm", "communicator '%s' rank %d/%d ready (%d local ranks, %s)", id_.c_str(), r, n,
            local, oversubscribed ? "oversubscribed: yielding spin" : "spinning");
  return Status::Ok();
}

void Communicator::set_timeout_ms(int64_t timeout_ms) {
  options_.timeout_ms = timeout_ms;
  messenger_->set_timeout_ms(timeout_ms);
}

std::string Communicator::TransportTo(int peer) const {
  if (peer < 0 || peer >= size_) return "?";
  return transport_names_[peer];
}

int32_t Communicator::NextTag() {
  return -1 - static_cast<int32_t>(collective_seq_++ & 0x3fffffff);
}

Status Communicator::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_) {
    return InvalidArgumentError(std::string(what) + ": rank " + std::to_string(peer) +
                                " is outside a communicator of " + std::to_string(size_));
  }
  return Status::Ok();
}

Result<std::unique_ptr<Communicator>> Communicator::Split(int color, int key) {
  const uint32_t seq = split_seq_++;
  const Deadline deadline =
      options_.timeout_ms <= 0 ? Deadline::Never() : Deadline::AfterMs(options_.timeout_ms);
  const std::string base = "split/" + std::to_string(seq) + "/";
  TESSERA_RETURN_IF_ERROR(prefix_store_->SetString(
      base + std::to_string(rank_), std::to_string(color) + " " + std::to_string(key)));
  struct Member {
    int key;
    int rank;
  };
  std::vector<Member> members;
  for (int p = 0; p < size_; ++p) {
    TESSERA_ASSIGN_OR_RETURN(std::string value,
                             prefix_store_->GetString(base + std::to_string(p), deadline));
    int c = 0, k = 0;
    if (std::sscanf(value.c_str(), "%d %d", &c, &k) != 2) {
      return InvalidArgumentError("malformed split record from rank " + std::to_string(p));
    }
    if (c == color && color >= 0) members.push_back(Member{k, p});
  }
  if (color < 0) return std::unique_ptr<Communicator>();
  std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].rank == rank_) new_rank = static_cast<int>(i);
  }
  std::string child = id_ + ".s" + std::to_string(seq) + "c" + std::to_string(color);
  return Create(store_, new_rank, static_cast<int>(members.size()), options_, child);
}

// ---------------------------------------------------------------- point to point

Result<Request> Communicator::Isend(const void* data, size_t bytes, int peer, int tag) {
  TESSERA_RETURN_IF_ERROR(CheckPeer(peer, "send"));
  if (tag < 0) return InvalidArgumentError("send: tags must be >= 0");
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kSend));
  Request request;
  request.comm_ = this;
  request.send_ = std::make_unique<SendOp>(peer, tag, data, bytes);
  if (peer == rank_) {
    TESSERA_RETURN_IF_ERROR(SendToSelf(request.send_.get()));
    return request;
  }
  messenger_->PostSend(request.send_.get());
  return request;
}

Result<Request> Communicator::Irecv(void* data, size_t bytes, int peer, int tag) {
  TESSERA_RETURN_IF_ERROR(CheckPeer(peer, "recv"));
  if (tag < 0) return InvalidArgumentError("recv: tags must be >= 0");
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kRecv));
  Request request;
  request.comm_ = this;
  request.recv_ = std::make_unique<RecvOp>(peer, tag, data, bytes);
  if (peer == rank_) {
    TESSERA_RETURN_IF_ERROR(ReceiveFromSelf(request.recv_.get()));
    return request;
  }
  messenger_->PostRecv(request.recv_.get());
  return request;
}

Status Communicator::SendToSelf(SendOp* op) {
  op->primitive = Primitive::kSend;
  op->done = true;
  mutable_ledger().mutable_entry(Primitive::kSend).bytes_sent += op->bytes;
  for (auto it = self_recvs_.begin(); it != self_recvs_.end(); ++it) {
    RecvOp* recv = *it;
    if (recv->tag != op->tag) continue;
    self_recvs_.erase(it);
    if (op->bytes > recv->capacity) {
      return Fail(InvalidArgumentError("recv from itself: a " + std::to_string(op->bytes) +
                                       "-byte message for a " + std::to_string(recv->capacity) +
                                       "-byte receive (tag " + std::to_string(op->tag) + ")"));
    }
    if (op->bytes > 0) std::memcpy(recv->data, op->data, op->bytes);
    recv->received = op->bytes;
    recv->done = true;
    mutable_ledger().mutable_entry(Primitive::kRecv).bytes_received += op->bytes;
    return Status::Ok();
  }
  const uint8_t* bytes = static_cast<const uint8_t*>(op->data);
  self_messages_.push_back({op->tag, std::vector<uint8_t>(bytes, bytes + op->bytes)});
  return Status::Ok();
}

Status Communicator::ReceiveFromSelf(RecvOp* op) {
  op->primitive = Primitive::kRecv;
  for (auto it = self_messages_.begin(); it != self_messages_.end(); ++it) {
    if (it->tag != op->tag) continue;
    if (it->bytes.size() > op->capacity) {
      return Fail(InvalidArgumentError("recv from itself: a " + std::to_string(it->bytes.size()) +
                                       "-byte message for a " + std::to_string(op->capacity) +
                                       "-byte receive (tag " + std::to_string(op->tag) + ")"));
    }
    if (!it->bytes.empty()) std::memcpy(op->data, it->bytes.data(), it->bytes.size());
    op->received = it->bytes.size();
    op->done = true;
    mutable_ledger().mutable_entry(Primitive::kRecv).bytes_received += op->received;
    self_messages_.erase(it);
    return Status::Ok();
  }
  self_recvs_.push_back(op);
  return Status::Ok();
}

Status Communicator::Wait(Request& request) {
  if (request.comm_ != this) return InvalidArgumentError("request of another communicator");
  Op* op =
      request.send_ ? static_cast<Op*>(request.send_.get()) : static_cast<Op*>(request.recv_.get());
  if (op->done) return Status::Ok();
  if (request.recv_ && request.recv_->peer == rank_) {
    std::erase(self_recvs_, request.recv_.get());
    return InvalidArgumentError("recv from itself (tag " + std::to_string(request.recv_->tag) +
                                "): no send to itself matches it, so it would wait forever");
  }
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(op->primitive, /*count_call=*/false));
  return messenger_->WaitAll({op});
}

Status Communicator::WaitAll(std::span<Request> requests) {
  std::vector<Op*> ops;
  for (Request& request : requests) {
    if (request.comm_ != this) return InvalidArgumentError("request of another communicator");
    if (request.recv_ && request.recv_->peer == rank_ && !request.recv_->done) {
      return Wait(request);  // an unmatched receive from itself: the error above
    }
    ops.push_back(request.send_ ? static_cast<Op*>(request.send_.get())
                                : static_cast<Op*>(request.recv_.get()));
  }
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kRecv, /*count_call=*/false));
  return messenger_->WaitAll(ops);
}

Status Communicator::Send(const void* data, size_t bytes, int peer, int tag) {
  TESSERA_ASSIGN_OR_RETURN(Request request, Isend(data, bytes, peer, tag));
  return Wait(request);
}

Status Communicator::Recv(void* data, size_t bytes, int peer, int tag, size_t* received_bytes) {
  TESSERA_ASSIGN_OR_RETURN(Request request, Irecv(data, bytes, peer, tag));
  TESSERA_RETURN_IF_ERROR(Wait(request));
  if (received_bytes != nullptr) *received_bytes = request.received_bytes();
  return Status::Ok();
}

// ---------------------------------------------------------------- collectives

AllReduceAlgo Communicator::ChooseAllReduce(size_t bytes, AllReduceAlgo requested) const {
  if (requested == AllReduceAlgo::kAuto) requested = options_.allreduce_algo;
  const bool one_shot = OneShotFits(bytes);
  if (requested == AllReduceAlgo::kOneShot && !one_shot) requested = AllReduceAlgo::kAuto;
  if (requested != AllReduceAlgo::kAuto) return requested;
  if (one_shot) return AllReduceAlgo::kOneShot;
  return bytes <= options_.allreduce_small_bytes ? AllReduceAlgo::kRecursiveDoubling
                                                 : AllReduceAlgo::kRing;
}

AllGatherAlgo Communicator::ChooseAllGather(size_t bytes_per_rank, AllGatherAlgo requested) const {
  if (requested == AllGatherAlgo::kAuto) requested = options_.allgather_algo;
  if (requested != AllGatherAlgo::kAuto) return requested;
  return bytes_per_rank <= options_.allgather_small_bytes && size_ > 2 ? AllGatherAlgo::kBruck
                                                                       : AllGatherAlgo::kRing;
}

BroadcastAlgo Communicator::ChooseBroadcast(size_t bytes, BroadcastAlgo requested) const {
  if (requested == BroadcastAlgo::kAuto) requested = options_.broadcast_algo;
  if (requested != BroadcastAlgo::kAuto) return requested;
  return bytes <= options_.broadcast_small_bytes || size_ <= 2 ? BroadcastAlgo::kBinomialTree
                                                               : BroadcastAlgo::kPipelinedChain;
}

bool Communicator::OneShotFits(size_t bytes) const {
  return messenger_->mailbox_bytes() > 0 && bytes <= messenger_->mailbox_bytes();
}

bool Communicator::DeterministicUsesRecursiveDoubling(size_t bytes, DataType dtype) const {
  const bool power_of_two = (size_ & (size_ - 1)) == 0;
  const bool half = dtype == DataType::kF16 || dtype == DataType::kBf16;
  return power_of_two && !half && bytes <= options_.allreduce_small_bytes;
}

Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType dtype,
                               ReduceOp op, AllReduceAlgo algo) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllReduce));
  if (!CountOk(count, dtype, 1)) return InvalidArgumentError("all_reduce: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  if (size_ == 1 || count == 0) {
    if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  switch (ChooseAllReduce(bytes, algo)) {
    case AllReduceAlgo::kRecursiveDoubling:
      return algorithms::AllReduceRecursiveDoubling(ctx, send, recv, count, dtype, op);
    case AllReduceAlgo::kOneShot:
      return algorithms::AllReduceOneShot(ctx, send, recv, count, dtype, op);
    case AllReduceAlgo::kDeterministic:
      if (OneShotFits(bytes)) {  // the same tree on every rank
        return algorithms::AllReduceOneShot(ctx, send, recv, count, dtype, op);
      }
      // Recursive doubling pairs ranks r, r^1 first, then r, r^2, … and combines
      // op(lower, upper): for a power-of-two group that is exactly the canonical
      // tree, in one exchange per level instead of two-shot's two rounds. Only
      // for native types (f16/bf16 round at every level there, once in the tree).
      if (DeterministicUsesRecursiveDoubling(bytes, dtype)) {
        return algorithms::AllReduceRecursiveDoubling(ctx, send, recv, count, dtype, op);
      }
      return algorithms::AllReduceDeterministic(ctx, send, recv, count, dtype, op);
    case AllReduceAlgo::kRing:
    case AllReduceAlgo::kAuto:
      break;
  }
  return algorithms::AllReduceRing(ctx, send, recv, count, dtype, op);
}

Status Communicator::Broadcast(void* buffer, size_t count, DataType dtype, int root,
                               BroadcastAlgo algo) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kBroadcast));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "broadcast root"));
  if (!CountOk(count, dtype, 1)) return InvalidArgumentError("broadcast: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  if (size_ == 1) return Status::Ok();
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  if (ChooseBroadcast(bytes, algo) == BroadcastAlgo::kPipelinedChain) {
    return algorithms::BroadcastPipelinedChain(ctx, buffer, bytes, root,
                                               options_.broadcast_chunk_bytes);
  }
  return algorithms::BroadcastBinomialTree(ctx, buffer, bytes, root);
}

Status Communicator::Reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                            int root) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kReduce));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "reduce root"));
  if (!CountOk(count, dtype, 1)) return InvalidArgumentError("reduce: count too large");
  if (rank_ == root && recv == nullptr && count > 0) {
    return InvalidArgumentError("reduce: the root needs a receive buffer");
  }
  if (size_ == 1) {
    if (send != recv && count > 0) std::memmove(recv, send, count * DataTypeSize(dtype));
    return Status::Ok();
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::ReduceBinomialTree(ctx, send, recv, count, dtype, op, root);
}

Status Communicator::Gather(const void* send, void* recv, size_t count, DataType dtype, int root) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kGather));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "gather root"));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("gather: count too large");
  if (rank_ == root) {
    TESSERA_RETURN_IF_ERROR(
        CheckBlockOverlap("gather", send, recv, count * DataTypeSize(dtype), size_, root));
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::GatherDirect(ctx, send, recv, count * DataTypeSize(dtype), root);
}

Status Communicator::Scatter(const void* send, void* recv, size_t count, DataType dtype, int root) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kScatter));
  TESSERA_RETURN_IF_ERROR(CheckPeer(root, "scatter root"));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("scatter: count too large");
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::ScatterDirect(ctx, send, recv, count * DataTypeSize(dtype), root);
}

Status Communicator::AllGather(const void* send, void* recv, size_t count, DataType dtype,
                               AllGatherAlgo algo) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllGather));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("all_gather: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  TESSERA_RETURN_IF_ERROR(CheckBlockOverlap("all_gather", send, recv, bytes, size_, rank_));
  if (size_ == 1) {
    if (send != recv && bytes > 0) std::memmove(recv, send, bytes);
    return Status::Ok();
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  if (ChooseAllGather(bytes, algo) == AllGatherAlgo::kBruck) {
    return algorithms::AllGatherBruck(ctx, send, recv, bytes);
  }
  return algorithms::AllGatherRing(ctx, send, recv, bytes);
}

Status Communicator::ReduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                   ReduceOp op) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kReduceScatter));
  if (!CountOk(count, dtype, size_)) {
    return InvalidArgumentError("reduce_scatter: count too large");
  }
  TESSERA_RETURN_IF_ERROR(
      CheckBlockOverlap("reduce_scatter", recv, send, count * DataTypeSize(dtype), size_, rank_));
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::ReduceScatterRing(ctx, send, recv, count, dtype, op);
}

Status Communicator::AllToAll(const void* send, void* recv, size_t count, DataType dtype) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllToAll));
  if (!CountOk(count, dtype, size_)) return InvalidArgumentError("all_to_all: count too large");
  const size_t bytes = count * DataTypeSize(dtype);
  if (size_ > 1) {  // in place is not supported
    TESSERA_RETURN_IF_ERROR(CheckBlockOverlap("all_to_all", send, recv, bytes * size_, 1, -1));
  }
  std::vector<size_t> sizes(size_, bytes), offsets(size_);
  for (int p = 0; p < size_; ++p) offsets[p] = static_cast<size_t>(p) * bytes;
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::AllToAllvPairwise(ctx, send, sizes, offsets, recv, sizes, offsets);
}

Status Communicator::AllToAllv(const void* send, std::span<const size_t> send_counts,
                               std::span<const size_t> send_displs, void* recv,
                               std::span<const size_t> recv_counts,
                               std::span<const size_t> recv_displs, DataType dtype) {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kAllToAllv));
  const size_t n = static_cast<size_t>(size_);
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
      recv_displs.size() != n) {
    return InvalidArgumentError("all_to_allv: counts and displacements need one entry per rank");
  }
  if (send_counts[rank_] != recv_counts[rank_]) {
    return InvalidArgumentError("all_to_allv: send_counts[rank] != recv_counts[rank]");
  }
  const size_t esize = DataTypeSize(dtype);
  std::vector<size_t> sb(n), so(n), rb(n), ro(n);
  for (size_t p = 0; p < n; ++p) {
    for (size_t v : {send_counts[p], send_displs[p], recv_counts[p], recv_displs[p]}) {
      if (!CountOk(v, dtype, 2)) return InvalidArgumentError("all_to_allv: count too large");
    }
    sb[p] = send_counts[p] * esize;
    so[p] = send_displs[p] * esize;
    rb[p] = recv_counts[p] * esize;
    ro[p] = recv_displs[p] * esize;
  }
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  return algorithms::AllToAllvPairwise(ctx, send, sb, so, recv, rb, ro);
}

Result<SharedBuffer> Communicator::AllocateShared(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const uint64_t id = ++shared_buffers_;
  SharedBuffer buffer;
  buffer.size_ = bytes;
  buffer.id_ = id;
  std::vector<int> peers;
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && segments_.size() > static_cast<size_t>(p) && segments_[p].control()) {
      peers.push_back(p);
    }
  }
  if (size_ == 1) {  // nothing to share, nothing to agree on
    TESSERA_ASSIGN_OR_RETURN(buffer.region_, MappedRegion::Anonymous(mapped));
    return buffer;
  }
  // Every rank creates its part (plain memory when no peer shares its host: it still
  // takes part in the agreement below, which every rank must run), then says whether
  // it could and how large it is.
  const bool shared = !peers.empty();
  auto name_of = [&](int rank) {
    return shm_prefix_ + "-r" + std::to_string(rank) + "-w" + std::to_string(id);
  };
  auto mine =
      shared ? MappedRegion::CreateShared(name_of(rank_), mapped) : MappedRegion::Anonymous(mapped);
  // The name goes when this returns, whichever way: by then every peer has mapped
  // the object (the all-reduce below), or the allocation failed everywhere.
  struct Unlink {
    std::string name;
    ~Unlink() {
      if (!name.empty()) ::shm_unlink(name.c_str());
    }
  } unlink{shared ? name_of(rank_) : std::string()};
  std::vector<int64_t> sizes(static_cast<size_t>(size_));
  const int64_t announced = mine.ok() ? static_cast<int64_t>(mapped) : -1;
  TESSERA_RETURN_IF_ERROR(AllGather(&announced, sizes.data(), 1, DataType::kI64));
  auto fail = [&](const std::string& what) {
    return Status(mine.ok() ? StatusCode::kUnavailable : mine.status().code(),
                  "allocating shared buffer " + std::to_string(id) + " of " +
                      std::to_string(bytes) + " bytes: " + what);
  };
  std::string failed;
  for (int p = 0; p < size_; ++p) {
    if (sizes[p] < 0) failed += (failed.empty() ? "rank " : ", rank ") + std::to_string(p);
  }
  if (!mine.ok()) return fail(mine.status().message());
  if (!failed.empty()) return fail(failed + " could not create its part");
  // Map every same-host peer's, then agree that all did before the names go.
  std::vector<MappedRegion> theirs;
  Status mapping = Status::Ok();
  for (int p : peers) {
    auto region = MappedRegion::OpenShared(name_of(p), static_cast<size_t>(sizes[p]));
    if (!region.ok()) {
      mapping = region.status().WithContext("rank " + std::to_string(p) + "'s part");
      break;
    }
    theirs.push_back(std::move(*region));
  }
  const int32_t ok = mapping.ok() ? 1 : 0;
  int32_t all_ok = 0;
  TESSERA_RETURN_IF_ERROR(AllReduce(&ok, &all_ok, 1, DataType::kI32, ReduceOp::kMin));
  if (!mapping.ok()) return fail(mapping.message());
  if (all_ok == 0) return fail("a peer could not map this rank's or another's part");
  for (size_t i = 0; i < peers.size(); ++i) {
    messenger_->AddPeerWindow(peers[i], id, theirs[i].data(), theirs[i].bytes());
    peer_windows_.push_back(std::move(theirs[i]));
  }
  buffer.region_ = std::move(*mine);
  if (shared) {
    buffer.shared_ = true;
    buffer.table_ = messenger_->windows();
    messenger_->windows()->Add(id, buffer.data(), mapped);
  }
  return buffer;
}

Status Communicator::Barrier() {
  TESSERA_RETURN_IF_ERROR(messenger_->Begin(Primitive::kBarrier));
  if (size_ == 1) return Status::Ok();
  algorithms::Context ctx{*messenger_, rank_, size_, NextTag(), &scratch_};
  if (messenger_->mailbox_bytes() > 0) return algorithms::BarrierMailbox(ctx);
  return algorithms::BarrierDissemination(ctx);
}

void Communicator::Abort(const std::string& reason) { messenger_->Abort(reason); }

}  // namespace tessera::comm
