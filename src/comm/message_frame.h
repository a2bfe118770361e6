// The messenger's wire format on a Channel. A streamed message is a 16-byte header
// {magic "TSM1", tag (4 bytes), size (8 bytes)}, the payload, and zeros to the next
// multiple of 8 bytes. A descriptor carries no payload: the receiver reads the bytes
// from the sender's memory (single copy, 24 bytes: the header with magic "TSC1",
// then the address) or from its mapping of the sender's shared buffer (32 bytes:
// magic "TSW1", then the buffer id and the offset). Layer: comm; internal to the
// messenger: messenger_send.cc writes frames, messenger_recv.cc parses them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::comm::frame {

inline constexpr uint32_t kFrameMagic = 0x314d5354;  // "TSM1"
// A DelayedChannel chunk header (tcp_channel.cc), met when only the peer delays.
inline constexpr uint32_t kDelayChunkMagic = 0x31445354;  // "TSD1"
inline constexpr size_t kHeaderBytes = 16;
// A single-copy descriptor: the header (magic "TSC1") and the sender's address.
inline constexpr uint32_t kCopyFrameMagic = 0x31435354;  // "TSC1"
inline constexpr size_t kCopyHeaderBytes = 24;
// A shared-buffer descriptor: the header (magic "TSW1"), the buffer's id and the
// offset of the bytes in it.
inline constexpr uint32_t kWindowFrameMagic = 0x31575354;  // "TSW1"
inline constexpr size_t kWindowHeaderBytes = 32;
inline constexpr size_t kSmallMessageBytes = 4096;  // header + payload sent in one write
// Most payload bytes moved per direction per peer in one progress pass, so sending
// and receiving interleave (both peers keep busy, data stays in cache).
inline constexpr size_t kBurstBytes = size_t{256} << 10;

inline size_t PadFor(uint64_t size) { return static_cast<size_t>((8 - size % 8) % 8); }

}  // namespace tessera::comm::frame
