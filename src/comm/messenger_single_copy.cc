// Messenger (messenger.h): single copy between same-host ranks. The receiving side
// reads a descriptor's bytes from the sender's memory (process_vm_readv, or memcpy
// when ranks are threads) or from its read-only mapping of the sender's shared
// buffer; the sending side completes such sends once the peer acknowledged them.
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "comm/messenger.h"

namespace tessera::comm {

bool Messenger::CompleteCopies(int peer, PeerState& ps) {
  bool progressed = false;
  while (!ps.copy_sends.empty() && peers_[peer].copy_acks_from->load(std::memory_order_acquire) >=
                                       ps.copy_sends.front()->copy_seq) {
    SendOp* op = ps.copy_sends.front();
    op->done = true;
    ledger_.mutable_entry(op->primitive).bytes_sent += op->bytes;
    ps.copy_sends.pop_front();
    progressed = true;
  }
  return progressed;
}

void Messenger::AddPeerWindow(int peer, uint64_t id, const uint8_t* base, size_t bytes) {
  state_[peer].windows.push_back(PeerState::Window{id, base, bytes});
}

Result<const uint8_t*> Messenger::PeerWindowBytes(const PeerState& ps, uint64_t id, uint64_t offset,
                                                  uint64_t size) const {
  for (const PeerState::Window& w : ps.windows) {
    if (w.id != id) continue;
    if (offset > w.bytes || size > w.bytes - offset) {
      return InvalidArgumentError("sent a descriptor for bytes [" + std::to_string(offset) + ", +" +
                                  std::to_string(size) + ") of its " + std::to_string(w.bytes) +
                                  "-byte shared buffer " + std::to_string(id));
    }
    return w.base + offset;
  }
  return InvalidArgumentError("sent a descriptor for shared buffer " + std::to_string(id) +
                              ", which it has not shared");
}

Status Messenger::ReadPeerMemory(int peer, void* dst, uint64_t addr, size_t size) {
  if (peers_[peer].pid == static_cast<int>(::getpid())) {  // ranks as threads
    std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)), size);
    return Status::Ok();
  }
  uint8_t* out = static_cast<uint8_t*>(dst);
  while (size > 0) {
    iovec local{out, size};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(addr)), size};
    const ssize_t got = ::process_vm_readv(peers_[peer].pid, &local, 1, &remote, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return UnavailableError(std::string("could not be read (process_vm_readv: ") +
                              (got < 0 ? std::strerror(errno) : "no progress") + ")");
    }
    out += got;
    addr += static_cast<uint64_t>(got);
    size -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace tessera::comm
