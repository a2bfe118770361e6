// Communicator::Connect (communicator.h): joins the group through the store. Each
// pair of ranks is wired by shared memory when they share a host (segments created,
// mapped and unlinked; the single-copy probe) or by authenticated TCP connections
// otherwise, and the messenger is built over the resulting channels.
#include <sched.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/log.h"
#include "comm/communicator.h"
#include "comm/exposure.h"
#include "comm/net_util.h"
#include "comm/rendezvous/auth.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/transport/authenticated_channel.h"
#include "comm/transport/host_identity.h"
#include "comm/transport/mpi_channel.h"
#include "comm/transport/shm_channel.h"
#include "comm/transport/tcp_channel.h"
#include "comm/transport/tls_channel.h"

namespace tessera::comm {
namespace {

constexpr uint32_t kHelloMagic = 0x4c4c4548;  // "HELL"

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint32_t connection;
  uint32_t flags;  // kHelloTls
  uint64_t comm_hash;
};
constexpr uint32_t kHelloTls = 1;  // the connecting rank speaks TLS after the hello

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

// Where a rank's MPI streams are: its world rank and size and the first of its
// receive tags, one per sending rank (world_size 0: the rank has no MPI).
struct MpiAddress {
  int world_rank = 0;
  int world_size = 0;
  int tag = 0;
};

std::string FormatMpiAddress(const MpiAddress& a) {
  if (a.world_size == 0) return "-";
  return std::to_string(a.world_rank) + ":" + std::to_string(a.world_size) + ":" +
         std::to_string(a.tag);
}

MpiAddress ParseMpiAddress(const std::string& text) {
  MpiAddress a;
  if (std::sscanf(text.c_str(), "%d:%d:%d", &a.world_rank, &a.world_size, &a.tag) != 3 ||
      a.world_rank < 0 || a.world_size <= a.world_rank || a.tag <= 0) {
    return MpiAddress{};
  }
  return a;
}

// The CPUs this process may run on, as hex nibbles from CPU 0 up ("f" = 0–3).
std::string CpuMaskText() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "-";
  std::string text;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu += 4) {
    int nibble = 0;
    for (int b = 0; b < 4; ++b) nibble |= CPU_ISSET(cpu + b, &set) ? 1 << b : 0;
    text += "0123456789abcdef"[nibble];
  }
  while (text.size() > 1 && text.back() == '0') text.pop_back();
  return text;
}

// Adds the CPUs of a CpuMaskText to `set`; false when the text is not one.
bool AddCpuMask(const std::string& text, cpu_set_t* set) {
  if (text == "-" || text.size() * 4 > CPU_SETSIZE) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const int nibble = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (nibble < 0) return false;
    for (int b = 0; b < 4; ++b) {
      if (nibble & (1 << b)) CPU_SET(static_cast<int>(i) * 4 + b, set);
    }
  }
  return true;
}

int CpusAvailable() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return std::max<int>(static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN)), 1);
}

}  // namespace

Result<Communicator::SingleCopyProbe> Communicator::ProbeSingleCopy(
    Store& store, const std::vector<bool>& use_shm, const std::vector<int>& pids,
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
  SingleCopyProbe probe;
  probe.reads_us.assign(static_cast<size_t>(n), false);
  probe.we_read.assign(static_cast<size_t>(n), false);
  for (int p = 0; p < n; ++p) {
    if (!use_shm[p]) continue;
    TESSERA_ASSIGN_OR_RETURN(std::string theirs,
                             store.GetString("copy_reads/" + std::to_string(p), deadline));
    probe.reads_us[p] = theirs.size() == static_cast<size_t>(n) && theirs[r] == '1';
    probe.we_read[p] = can_read[static_cast<size_t>(p)] == '1';
  }
  return probe;
}

Status Communicator::Connect(Store& store) {
  const int n = size_;
  const int r = rank_;
  const Deadline deadline =
      options_.timeout_ms <= 0 ? Deadline::Never() : Deadline::AfterMs(options_.timeout_ms);
  const std::string host_id = LocalHostIdentity();
  // The MPI streams into this rank (transport/mpi_channel.h): our MPI world rank
  // and size and the first of our receive tags (rank p sends with first + p); "-"
  // without MPI.
  if (options_.transport == TransportKind::kMpi) TESSERA_RETURN_IF_ERROR(InitMpi());
  const bool mpi = MpiActive();
  const MpiAddress own_mpi =
      mpi ? MpiAddress{MpiWorldRank(), MpiWorldSize(), AllocateMpiTags(n)} : MpiAddress{};
  TESSERA_RETURN_IF_ERROR(store.SetString(
      "host/" + std::to_string(r), std::to_string(::getpid()) + " " + FormatMpiAddress(own_mpi) +
                                       " " + CpuMaskText() + " " + host_id));
  std::vector<int> pids(n, -1);
  std::vector<MpiAddress> mpi_addresses(n);
  std::vector<bool> use_shm(n, false), use_tcp(n, false), use_mpi(n, false);
  int local_ranks = 0;
  // The CPUs the ranks on this host may use, all together (each rank's own may be
  // one core, under mpirun's binding).
  cpu_set_t local_cpus;
  CPU_ZERO(&local_cpus);
  bool local_cpus_known = true;
  for (int p = 0; p < n; ++p) {
    TESSERA_ASSIGN_OR_RETURN(std::string value,
                             store.GetString("host/" + std::to_string(p), deadline));
    // "<pid> <mpi address> <cpu mask> <host identity>"
    size_t space = value.find(' ');
    size_t space2 = space == std::string::npos ? space : value.find(' ', space + 1);
    size_t space3 = space2 == std::string::npos ? space2 : value.find(' ', space2 + 1);
    if (space3 == std::string::npos) return InvalidArgumentError("malformed host record");
    std::from_chars(value.data(), value.data() + space, pids[p]);
    mpi_addresses[p] = ParseMpiAddress(value.substr(space + 1, space2 - space - 1));
    bool same_host = value.substr(space3 + 1) == host_id;
    if (same_host) {
      ++local_ranks;
      local_cpus_known &= AddCpuMask(value.substr(space2 + 1, space3 - space2 - 1), &local_cpus);
    }
    if (p == r) continue;
    if (options_.transport == TransportKind::kShm && !same_host) {
      return InvalidArgumentError("transport shm was forced but rank " + std::to_string(p) +
                                  " runs on another host");
    }
    const bool both_mpi = mpi && mpi_addresses[p].world_size == own_mpi.world_size;
    if (options_.transport == TransportKind::kMpi && !both_mpi) {
      return InvalidArgumentError("transport mpi was forced but rank " + std::to_string(p) +
                                  (mpi_addresses[p].world_size == 0
                                       ? " has no MPI"
                                       : " belongs to another MPI job (world of " +
                                             std::to_string(mpi_addresses[p].world_size) + ")"));
    }
    use_mpi[p] = options_.transport == TransportKind::kMpi ||
                 (options_.transport == TransportKind::kAuto && !same_host && both_mpi);
    use_shm[p] = same_host && !use_mpi[p] && options_.transport != TransportKind::kTcp;
    use_tcp[p] = !use_shm[p] && !use_mpi[p];
  }
  const bool any_shm = std::count(use_shm.begin(), use_shm.end(), true) > 0;
  const bool any_tcp = std::count(use_tcp.begin(), use_tcp.end(), true) > 0;

  // TCP: listen and publish our address.
  UniqueFd listener;
  if (any_tcp && !options_.tcp_frame_auth && !options_.tcp_tls) {
    TLOG_WARN("comm",
              "INSECURE: rank %d's TCP frames are not authenticated (TESSERA_TCP_FRAME_AUTH=0): "
              "after the handshake anyone on the path can inject or alter traffic. For "
              "measurements only; every rank must set the same value",
              r);
  }
  if (any_tcp) {
    std::string advertised = options_.listen_host;
    if (advertised.empty()) {
      auto* tcp_store = dynamic_cast<TcpStore*>(store_.get());
      advertised = tcp_store != nullptr ? tcp_store->local_host() : "127.0.0.1";
    }
    // Listen where the peers are told to connect, nowhere else.
    TESSERA_RETURN_IF_ERROR(
        CheckListeningNeedsToken("rank " + std::to_string(r) + "'s TCP transport", advertised,
                                 options_.cluster_token, options_.insecure_no_token));
    int port = 0;
    TESSERA_ASSIGN_OR_RETURN(listener, ListenTcp(advertised, 0, &port));
    TESSERA_RETURN_IF_ERROR(
        store.SetString("addr/" + std::to_string(r), HostPort{advertised, port}.ToString()));
  }

  // Shared memory: create ours, map the peers', unlink ours once all mapped it.
  segments_.resize(n);
  SingleCopyProbe probe{std::vector<bool>(n, false), std::vector<bool>(n, false)};
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
    // Always (a few store keys): whether single copy is used is decided after the
    // messenger is up (ResolveCopyMode), and every rank must take part in the probe.
    TESSERA_ASSIGN_OR_RETURN(probe, ProbeSingleCopy(store, use_shm, pids, deadline));
  }

  // TCP: connect to lower ranks, accept higher ones.
  const int conns = options_.tcp_connections;
  const uint64_t comm_hash = HashId(options_.job_id + "/" + id_);
  std::vector<std::vector<UniqueFd>> fds(n);
  std::vector<std::string> addresses(n);
  // Per peer: the session keys of its connection 0, which authenticate every frame
  // of the (striped) stream.
  std::vector<SessionKeys> keys(n);
  const uint32_t hello_flags = options_.tcp_tls ? kHelloTls : 0;
  for (int p = 0; p < r; ++p) {
    if (!use_tcp[p]) continue;
    TESSERA_ASSIGN_OR_RETURN(addresses[p], store.GetString("addr/" + std::to_string(p), deadline));
    TESSERA_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(addresses[p]));
    for (int k = 0; k < conns; ++k) {
      TESSERA_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTcp(hp, deadline));
      SessionKeys connection_keys;
      Status auth =
          AuthenticateAsClient(fd.get(), options_.cluster_token, deadline, &connection_keys);
      if (!auth.ok()) return auth.WithContext("connecting to rank " + std::to_string(p));
      Hello hello{kHelloMagic, static_cast<uint32_t>(r), static_cast<uint32_t>(k), hello_flags,
                  comm_hash};
      TESSERA_RETURN_IF_ERROR(WriteFull(fd.get(), &hello, sizeof(hello), deadline));
      if (k == 0) keys[p] = connection_keys;
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
    SessionKeys connection_keys;
    Status auth =
        AuthenticateAsServer(fd.get(), options_.cluster_token, handshake, &connection_keys);
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
    if (hello.flags != hello_flags) {
      const auto tls = [](uint32_t flags) { return (flags & kHelloTls) != 0 ? "on" : "off"; };
      return InvalidArgumentError("rank " + std::to_string(p) + " has TLS " + tls(hello.flags) +
                                  " and rank " + std::to_string(r) + " has it " + tls(hello_flags) +
                                  " (TESSERA_TCP_TLS / --tls must be the same on every rank)");
    }
    if (addresses[p].empty()) addresses[p] = SocketPeerAddress(fd.get());
    if (hello.connection == 0) keys[p] = connection_keys;
    fds[p][hello.connection] = std::move(fd);
    ++accepted;
  }

  // Channels and the messenger.
  std::vector<std::unique_ptr<Channel>> channels(n);
  std::vector<PeerInfo> peers(n);
  transport_names_.assign(n, "self");
  std::vector<TlsChannel*> tls_handshakes;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    if (use_mpi[p]) {
#ifdef TESSERA_HAVE_MPI
      channels[p] = std::make_unique<MpiChannel>(mpi_addresses[p].world_rank,
                                                 mpi_addresses[p].tag + r, own_mpi.tag + p);
#endif
      peers[p].address = "mpi rank " + std::to_string(mpi_addresses[p].world_rank);
    } else if (use_shm[p]) {
      channels[p] =
          std::make_unique<ShmChannel>(segments_[r], r, segments_[p], p, options_.shm_chunk_bytes);
      peers[p].address = "shm";
      peers[p].pid = pids[p];
      peers[p].shm_control = segments_[p].control();
      peers[p].mailbox[0] = segments_[p].slot(0);
      peers[p].mailbox[1] = segments_[p].slot(1);
      peers[p].reads_us = probe.reads_us[p];
      peers[p].copy_acks_from = segments_[r].copy_ack(p);
      peers[p].copy_acks_to = segments_[p].copy_ack(r);
    } else {
      channels[p] =
          std::make_unique<TcpChannel>(std::move(fds[p]), options_.tcp_stripe_bytes, addresses[p]);
      if (options_.tcp_emulated_delay_us > 0) {
        channels[p] = std::make_unique<DelayedChannel>(std::move(channels[p]),
                                                       options_.tcp_emulated_delay_us * 1000);
      }
      if (options_.tcp_tls) {
        TESSERA_ASSIGN_OR_RETURN(auto tls, TlsChannel::Create(std::move(channels[p]), keys[p],
                                                              p < r ? TlsChannel::Role::kClient
                                                                    : TlsChannel::Role::kServer));
        tls_handshakes.push_back(tls.get());
        channels[p] = std::move(tls);
      } else if (options_.tcp_frame_auth) {
        channels[p] = std::make_unique<AuthenticatedChannel>(std::move(channels[p]), keys[p]);
      }
      peers[p].address = addresses[p];
    }
    transport_names_[p] = channels[p]->Describe();
  }
  TESSERA_RETURN_IF_ERROR(CompleteTlsHandshakes(tls_handshakes, deadline));
  if (!tls_handshakes.empty()) {
    TLOG_INFO("comm", "rank %d: TLS 1.3 on %zu TCP link(s) (%s)", r, tls_handshakes.size(),
              tls_handshakes[0]->Negotiated().c_str());
  }
  WaitOptions wait;
  wait.timeout_ms = options_.timeout_ms;
  wait.frozen_peer_ms = options_.frozen_peer_ms;
  wait.unexpected_limit_bytes = options_.unexpected_limit_bytes;
  wait.single_copy_bytes = options_.shm_single_copy_bytes;
  wait.single_copy_max_bytes = options_.shm_single_copy_max_bytes;
  wait.single_copy_allreduce_max_bytes = options_.shm_single_copy_allreduce_max_bytes;
  wait.bypass_cache_bytes = options_.copy_bypass_cache_bytes;
  wait.window_copy_bytes = options_.shm_shared_buffer_bytes;
  const int local = options_.local_ranks_hint > 0 ? options_.local_ranks_hint : local_ranks;
  const int local_cpu_count =
      local_cpus_known ? std::max(CPU_COUNT(&local_cpus), 1) : CpusAvailable();
  const bool oversubscribed = local > local_cpu_count;
  wait.yield_while_spinning = oversubscribed;
  if (options_.spin_us >= 0) {
    wait.spin_ns = options_.spin_us * 1000;
  } else {
    wait.spin_ns = oversubscribed ? 20'000 : 100'000;
  }
  // The mailbox (one-shot all-reduce) when every rank shares this host.
  const bool any_mpi = std::count(use_mpi.begin(), use_mpi.end(), true) > 0;
  const bool all_shm = any_shm && !any_tcp && !any_mpi;
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
  TESSERA_RETURN_IF_ERROR(ResolveCopyMode(store, use_shm, probe, pids, deadline));
  // MPI's own collectives: every pair on MPI and each rank its own MPI process
  // (ranks as threads of one process share a world rank: tessera's algorithms then).
  std::vector<int> world_ranks;
  for (int p = 0; p < n; ++p) {
    if (p == r || use_mpi[p])
      world_ranks.push_back(p == r ? own_mpi.world_rank : mpi_addresses[p].world_rank);
  }
  std::vector<int> distinct = world_ranks;
  std::sort(distinct.begin(), distinct.end());
  if (options_.mpi_collectives != 0 && n > 1 && static_cast<int>(world_ranks.size()) == n &&
      std::adjacent_find(distinct.begin(), distinct.end()) == distinct.end()) {
    TESSERA_ASSIGN_OR_RETURN(mpi_group_, MpiGroup::Create(world_ranks));
  }
  TLOG_INFO("comm", "communicator '%s' rank %d/%d ready (%d local ranks, %s)", id_.c_str(), r, n,
            local, oversubscribed ? "oversubscribed: yielding spin" : "spinning");
  return Status::Ok();
}

}  // namespace tessera::comm
