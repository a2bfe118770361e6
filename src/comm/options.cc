#include "comm/options.h"

#include "base/env.h"

namespace tessera::comm {

std::string_view TransportKindName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kAuto:
      return "auto";
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kMpi:
      return "mpi";
  }
  return "?";
}

std::optional<TransportKind> ParseTransportKind(std::string_view name) {
  if (name == "auto") return TransportKind::kAuto;
  if (name == "shm") return TransportKind::kShm;
  if (name == "tcp") return TransportKind::kTcp;
  if (name == "mpi") return TransportKind::kMpi;
  return std::nullopt;
}

std::string_view AllReduceAlgoName(AllReduceAlgo algo) {
  switch (algo) {
    case AllReduceAlgo::kAuto:
      return "auto";
    case AllReduceAlgo::kRing:
      return "ring";
    case AllReduceAlgo::kRecursiveDoubling:
      return "rd";
    case AllReduceAlgo::kOneShot:
      return "oneshot";
    case AllReduceAlgo::kDeterministic:
      return "deterministic";
  }
  return "?";
}

std::optional<AllReduceAlgo> ParseAllReduceAlgo(std::string_view name) {
  if (name == "auto") return AllReduceAlgo::kAuto;
  if (name == "ring") return AllReduceAlgo::kRing;
  if (name == "rd" || name == "recursive_doubling") return AllReduceAlgo::kRecursiveDoubling;
  if (name == "oneshot" || name == "one_shot") return AllReduceAlgo::kOneShot;
  if (name == "deterministic" || name == "det" || name == "two_shot") {
    return AllReduceAlgo::kDeterministic;
  }
  return std::nullopt;
}

std::string_view AllGatherAlgoName(AllGatherAlgo algo) {
  switch (algo) {
    case AllGatherAlgo::kAuto:
      return "auto";
    case AllGatherAlgo::kRing:
      return "ring";
    case AllGatherAlgo::kBruck:
      return "bruck";
  }
  return "?";
}

std::optional<AllGatherAlgo> ParseAllGatherAlgo(std::string_view name) {
  if (name == "auto") return AllGatherAlgo::kAuto;
  if (name == "ring") return AllGatherAlgo::kRing;
  if (name == "bruck") return AllGatherAlgo::kBruck;
  return std::nullopt;
}

std::string_view ReduceScatterAlgoName(ReduceScatterAlgo algo) {
  switch (algo) {
    case ReduceScatterAlgo::kAuto:
      return "auto";
    case ReduceScatterAlgo::kRing:
      return "ring";
    case ReduceScatterAlgo::kDeterministic:
      return "deterministic";
  }
  return "?";
}

std::optional<ReduceScatterAlgo> ParseReduceScatterAlgo(std::string_view name) {
  if (name == "auto") return ReduceScatterAlgo::kAuto;
  if (name == "ring") return ReduceScatterAlgo::kRing;
  if (name == "deterministic") return ReduceScatterAlgo::kDeterministic;
  return std::nullopt;
}

std::string_view BroadcastAlgoName(BroadcastAlgo algo) {
  switch (algo) {
    case BroadcastAlgo::kAuto:
      return "auto";
    case BroadcastAlgo::kBinomialTree:
      return "tree";
    case BroadcastAlgo::kPipelinedChain:
      return "chain";
  }
  return "?";
}

std::optional<BroadcastAlgo> ParseBroadcastAlgo(std::string_view name) {
  if (name == "auto") return BroadcastAlgo::kAuto;
  if (name == "tree" || name == "binomial") return BroadcastAlgo::kBinomialTree;
  if (name == "chain" || name == "pipelined_chain") return BroadcastAlgo::kPipelinedChain;
  return std::nullopt;
}

namespace {

constexpr int64_t kMaxTcpEmulatedDelayUs = 10'000'000;

Status ParseSizeKnob(const char* name, size_t* out) {
  auto text = EnvString(name);
  if (!text) return Status::Ok();
  auto value = ParseSizeBytes(*text);
  if (!value || *value < 0) {
    return InvalidArgumentError(std::string(name) + "='" + *text + "' is not a size");
  }
  *out = static_cast<size_t>(*value);
  return Status::Ok();
}

Status ParseIntKnob(const char* name, int64_t* out) {
  auto text = EnvString(name);
  if (!text) return Status::Ok();
  auto value = ParseSizeBytes(*text);
  if (!value) return InvalidArgumentError(std::string(name) + "='" + *text + "' is not a number");
  *out = *value;
  return Status::Ok();
}

template <typename T, typename Parse>
Status ParseEnumKnob(const char* name, Parse parse, T* out) {
  auto text = EnvString(name);
  if (!text) return Status::Ok();
  auto value = parse(*text);
  if (!value) return InvalidArgumentError(std::string(name) + "='" + *text + "' is not known");
  *out = *value;
  return Status::Ok();
}

}  // namespace

std::optional<uint32_t> ParseMpiCollectives(std::string_view list) {
  uint32_t bits = 0;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    if (name == "all") {
      bits |= kMpiAllGather | kMpiAllToAll | kMpiAllToAllv;
    } else if (name == "allgather") {
      bits |= kMpiAllGather;
    } else if (name == "alltoall") {
      bits |= kMpiAllToAll;
    } else if (name == "alltoallv") {
      bits |= kMpiAllToAllv;
    } else if (!name.empty()) {
      return std::nullopt;
    }
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return bits;
}

Result<CommOptions> CommOptions::FromEnvironment() {
  CommOptions o;
  if (auto job = EnvString("TESSERA_JOB_ID")) o.job_id = *job;
  if (auto token = EnvString("TESSERA_CLUSTER_TOKEN")) o.cluster_token = *token;
  if (auto host = EnvString("TESSERA_COMM_LISTEN_HOST")) o.listen_host = *host;
  TESSERA_ASSIGN_OR_RETURN(o.insecure_no_token, EnvBoolOr("TESSERA_INSECURE_NO_TOKEN", false));
  TESSERA_ASSIGN_OR_RETURN(o.tcp_frame_auth, EnvBoolOr("TESSERA_TCP_FRAME_AUTH", true));
  TESSERA_ASSIGN_OR_RETURN(o.tcp_tls, EnvBoolOr("TESSERA_TCP_TLS", false));
  TESSERA_RETURN_IF_ERROR(ParseEnumKnob("TESSERA_TRANSPORT", ParseTransportKind, &o.transport));
  TESSERA_RETURN_IF_ERROR(
      ParseEnumKnob("TESSERA_MPI_COLLECTIVES", ParseMpiCollectives, &o.mpi_collectives));
  TESSERA_RETURN_IF_ERROR(ParseIntKnob("TESSERA_COMM_TIMEOUT_MS", &o.timeout_ms));
  TESSERA_RETURN_IF_ERROR(ParseIntKnob("TESSERA_COMM_FROZEN_MS", &o.frozen_peer_ms));
  TESSERA_RETURN_IF_ERROR(ParseIntKnob("TESSERA_COMM_SPIN_US", &o.spin_us));
  TESSERA_RETURN_IF_ERROR(ParseSizeKnob("TESSERA_SHM_RING_BYTES", &o.shm_ring_bytes));
  TESSERA_RETURN_IF_ERROR(ParseSizeKnob("TESSERA_SHM_CHUNK_BYTES", &o.shm_chunk_bytes));
  TESSERA_RETURN_IF_ERROR(ParseSizeKnob("TESSERA_SHM_SINGLE_COPY_BYTES", &o.shm_single_copy_bytes));
  TESSERA_RETURN_IF_ERROR(
      ParseSizeKnob("TESSERA_SHM_SINGLE_COPY_MAX_BYTES", &o.shm_single_copy_max_bytes));
  // Either knob pins the window: the calibration then leaves it alone.
  if (EnvString("TESSERA_SHM_SINGLE_COPY_BYTES") ||
      EnvString("TESSERA_SHM_SINGLE_COPY_MAX_BYTES")) {
    o.shm_single_copy_source = SettingSource::kEnv;
  }
  TESSERA_RETURN_IF_ERROR(
      ParseEnumKnob("TESSERA_COMM_CALIBRATION", ParseCalibrationMode, &o.calibration));
  TESSERA_RETURN_IF_ERROR(ParseSizeKnob("TESSERA_SHM_SINGLE_COPY_ALLREDUCE_MAX_BYTES",
                                        &o.shm_single_copy_allreduce_max_bytes));
  TESSERA_RETURN_IF_ERROR(
      ParseSizeKnob("TESSERA_SHM_SHARED_BUFFER_BYTES", &o.shm_shared_buffer_bytes));
  TESSERA_RETURN_IF_ERROR(
      ParseSizeKnob("TESSERA_COPY_BYPASS_CACHE_BYTES", &o.copy_bypass_cache_bytes));
  int64_t conns = o.tcp_connections;
  TESSERA_RETURN_IF_ERROR(ParseIntKnob("TESSERA_TCP_CONNECTIONS", &conns));
  if (conns < 1 || conns > 64) return InvalidArgumentError("TESSERA_TCP_CONNECTIONS must be 1..64");
  o.tcp_connections = static_cast<int>(conns);
  TESSERA_RETURN_IF_ERROR(ParseSizeKnob("TESSERA_TCP_STRIPE_BYTES", &o.tcp_stripe_bytes));
  TESSERA_RETURN_IF_ERROR(ParseIntKnob("TESSERA_TCP_DELAY_US", &o.tcp_emulated_delay_us));
  if (o.tcp_emulated_delay_us < 0 || o.tcp_emulated_delay_us > kMaxTcpEmulatedDelayUs) {
    return InvalidArgumentError("TESSERA_TCP_DELAY_US must be 0..10000000 (10 s)");
  }
  TESSERA_RETURN_IF_ERROR(
      ParseSizeKnob("TESSERA_COMM_UNEXPECTED_BYTES", &o.unexpected_limit_bytes));
  TESSERA_RETURN_IF_ERROR(
      ParseEnumKnob("TESSERA_ALLREDUCE_ALGO", ParseAllReduceAlgo, &o.allreduce_algo));
  TESSERA_RETURN_IF_ERROR(
      ParseEnumKnob("TESSERA_ALLGATHER_ALGO", ParseAllGatherAlgo, &o.allgather_algo));
  TESSERA_RETURN_IF_ERROR(
      ParseEnumKnob("TESSERA_BROADCAST_ALGO", ParseBroadcastAlgo, &o.broadcast_algo));
  TESSERA_RETURN_IF_ERROR(ParseSizeKnob("TESSERA_ALLREDUCE_SMALL_BYTES", &o.allreduce_small_bytes));
  TESSERA_RETURN_IF_ERROR(
      ParseSizeKnob("TESSERA_ALLREDUCE_ONESHOT_BYTES", &o.allreduce_oneshot_bytes));
  if (o.allreduce_oneshot_bytes > (size_t{64} << 20)) {
    return InvalidArgumentError("TESSERA_ALLREDUCE_ONESHOT_BYTES must be at most 64M");
  }
  if (o.shm_ring_bytes < (size_t{64} << 10) || o.shm_ring_bytes % 4096 != 0) {
    return InvalidArgumentError("TESSERA_SHM_RING_BYTES must be a multiple of 4096, >= 64k");
  }
  return o;
}

}  // namespace tessera::comm
