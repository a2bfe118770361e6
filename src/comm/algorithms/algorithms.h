// The collective algorithms, one file each (gloo style). Each works for any rank
// count and element count (including 0, 1 and counts not divisible by the rank
// count) on caller buffers, and moves bytes only through the Messenger, so it never
// knows the transport. Called by communicator_collectives.cc after it has validated
// arguments and started the primitive (deadline, ledger entry).
// `send == recv` means in place wherever the communicator allows it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "comm/messenger.h"
#include "comm/types.h"

namespace tessera::comm::algorithms {

struct Context {
  Messenger& messenger;
  int rank;
  int size;
  int32_t tag;  // unique per collective call (internal tags are negative)
  std::vector<uint8_t>* scratch;

  // Scratch memory owned by the communicator; valid until the next call.
  uint8_t* Scratch(size_t bytes) {
    if (scratch->size() < bytes) scratch->resize(bytes);
    return scratch->data();
  }
};

// Element range of block `index` when `count` elements are split into `blocks`
// nearly equal blocks (the first count % blocks get one more).
struct Block {
  size_t offset;
  size_t count;
};
inline Block BlockOf(size_t count, int blocks, int index) {
  size_t base = count / static_cast<size_t>(blocks);
  size_t extra = count % static_cast<size_t>(blocks);
  size_t i = static_cast<size_t>(index);
  return Block{i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

// --- all-reduce (recv holds the result on every rank) ---
// Reduce-scatter + all-gather around the ring: 2(N-1)/N·M bytes per rank; the
// bandwidth choice.
Status AllReduceRing(Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                     ReduceOp op);
// Recursive doubling (non-power-of-two ranks fold in first): log2(N) rounds of
// whole-buffer exchange; the latency choice for small messages.
Status AllReduceRecursiveDoubling(Context& ctx, const void* send, void* recv, size_t count,
                                  DataType dtype, ReduceOp op);
// One-shot through the shared-memory mailbox (Messenger::mailbox_bytes() >= the
// message): publish, then every rank combines all N inputs with the canonical
// tree (TreeReduce). (N-1)·M bytes read per rank; the latency choice on one host,
// and deterministic.
Status AllReduceOneShot(Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                        ReduceOp op);
// Deterministic two-shot: each rank owns a shard, receives the N contributions of
// it and combines them with the canonical tree over rank index (reduce.h
// TreeReduce), then the shards are all-gathered. Bit-identical for every run and
// every rank; f16/bf16 accumulate in f32 and round once.
Status AllReduceDeterministic(Context& ctx, const void* send, void* recv, size_t count,
                              DataType dtype, ReduceOp op);

// --- all-gather (recv = N blocks of `bytes`, block r from rank r) ---
Status AllGatherRing(Context& ctx, const void* send, void* recv, size_t bytes);
Status AllGatherBruck(Context& ctx, const void* send, void* recv, size_t bytes);

// --- reduce-scatter (send = N blocks of `count`; recv = the reduced block r) ---
Status ReduceScatterRing(Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                         ReduceOp op);
// Deterministic: phase 1 of AllReduceDeterministic with shard p = block p, so every
// element is the canonical tree over ranks — the same bits as the deterministic
// all-reduce's (sequence parallelism relies on it). (N-1)·M bytes sent per rank.
Status ReduceScatterDeterministic(Context& ctx, const void* send, void* recv, size_t count,
                                  DataType dtype, ReduceOp op);

// --- broadcast from root ---
Status BroadcastBinomialTree(Context& ctx, void* buffer, size_t bytes, int root);
Status BroadcastPipelinedChain(Context& ctx, void* buffer, size_t bytes, int root,
                               size_t chunk_bytes);

// --- reduce to root (recv used on the root only) ---
Status ReduceBinomialTree(Context& ctx, const void* send, void* recv, size_t count, DataType dtype,
                          ReduceOp op, int root);

// --- gather / scatter (root-side buffers hold N blocks of `bytes`) ---
Status GatherDirect(Context& ctx, const void* send, void* recv, size_t bytes, int root);
Status ScatterDirect(Context& ctx, const void* send, void* recv, size_t bytes, int root);

// --- all-to-all(v) by pairwise exchange: step s sends to r+s and receives from r-s ---
// Byte counts and displacements per peer.
Status AllToAllvPairwise(Context& ctx, const void* send, std::span<const size_t> send_bytes,
                         std::span<const size_t> send_offsets, void* recv,
                         std::span<const size_t> recv_bytes, std::span<const size_t> recv_offsets);

// --- barrier: dissemination (ceil(log2 N) rounds of empty messages) ---
Status BarrierDissemination(Context& ctx);
// --- barrier through the mailbox (Messenger::mailbox_bytes() > 0): one empty exchange ---
Status BarrierMailbox(Context& ctx);

}  // namespace tessera::comm::algorithms
