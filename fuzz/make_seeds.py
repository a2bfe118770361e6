#!/usr/bin/env python3
"""Writes the seed corpus of gguf_fuzz (fuzz/corpus/gguf/*.gguf): tiny valid GGUF
files that reach every part of the reader — each metadata type, nested arrays, v2
and v3, custom alignment, quantised tensors, a complete llama model with an SPM
vocabulary and one with a BPE vocabulary — and that of tokenizer_fuzz
(fuzz/corpus/tokenizer/*.txt: a byte that picks the vocabulary and the encode
options, then text). Deterministic; run from anywhere:
  python3 fuzz/make_seeds.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")
TOKENIZER_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "tokenizer")
# tokenizer_fuzz's vocabularies (its first byte modulo their number: the real SPM
# vocabulary is the fifth when shared/ is there) and its option bits.
GPT2, LLAMA3, QWEN2, SPM, SPM_REAL = range(5)
ADD_SPECIAL, PARSE_SPECIAL = 0x40, 0x80
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
          BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
TYPE_F32, TYPE_F16, TYPE_Q4_0, TYPE_Q8_0 = 0, 1, 2, 8
BLOCK = {TYPE_F32: (1, 4), TYPE_F16: (1, 2), TYPE_Q4_0: (32, 18), TYPE_Q8_0: (32, 34)}


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def payload(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(payload(et, x) for x in items)
    return struct.pack(SCALAR[t], v)


def gguf(kvs, tensors, version=3, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, dims, data_bytes)]."""
    out = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + payload(t, v)
    offset, blobs = 0, []
    for name, gt, dims, data in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gt, offset)
        blobs.append((offset, data))
        offset += len(data)
        offset += (-offset) % alignment
    if tensors:
        out += b"\0" * ((-len(out)) % alignment)
        base = len(out)
        for off, data in blobs:
            out += b"\0" * (base + off - len(out)) + data
    return out


def tensor(name, gt, dims, seed):
    elems, bytes_per = BLOCK[gt]
    n = dims[0] // elems * bytes_per
    for d in dims[1:]:
        n *= d
    data = bytes((seed * 31 + i * 7) % 251 for i in range(n))
    if gt == TYPE_F32:  # small finite floats
        count = n // 4
        data = b"".join(struct.pack("<f", ((seed + i) % 17 - 8) / 16.0) for i in range(count))
    return (name, gt, dims, data)


def llama(vocab_kvs, vocab_size, gt=TYPE_F32, dim=32, moe=False):
    ffn = 32 if gt in (TYPE_Q4_0, TYPE_Q8_0) else 8
    kvs = [("general.architecture", STR, "llama"), ("general.name", STR, "seed"),
           ("llama.context_length", U32, 64), ("llama.embedding_length", U32, dim),
           ("llama.block_count", U32, 1), ("llama.feed_forward_length", U32, ffn),
           ("llama.attention.head_count", U32, 4), ("llama.attention.head_count_kv", U32, 2),
           ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
           ("llama.rope.freq_base", F32, 10000.0)] + vocab_kvs
    if moe:
        kvs += [("llama.expert_count", U32, 2), ("llama.expert_used_count", U32, 1)]
    hd = dim // 4
    ts = [tensor("token_embd.weight", gt, [dim, vocab_size], 1),
          tensor("blk.0.attn_norm.weight", TYPE_F32, [dim], 2),
          tensor("blk.0.attn_q.weight", gt, [dim, dim], 3),
          tensor("blk.0.attn_k.weight", gt, [dim, 2 * hd], 4),
          tensor("blk.0.attn_v.weight", gt, [dim, 2 * hd], 5),
          tensor("blk.0.attn_output.weight", gt, [dim, dim], 6),
          tensor("blk.0.ffn_norm.weight", TYPE_F32, [dim], 7)]
    if moe:
        ts += [tensor("blk.0.ffn_gate_inp.weight", TYPE_F32, [dim, 2], 8),
               tensor("blk.0.ffn_gate_exps.weight", gt, [dim, ffn, 2], 9),
               tensor("blk.0.ffn_up_exps.weight", gt, [dim, ffn, 2], 10),
               tensor("blk.0.ffn_down_exps.weight", gt, [ffn, dim, 2], 11)]
    else:
        ts += [tensor("blk.0.ffn_gate.weight", gt, [dim, ffn], 8),
               tensor("blk.0.ffn_up.weight", gt, [dim, ffn], 9),
               tensor("blk.0.ffn_down.weight", gt, [ffn, dim], 10)]
    ts += [tensor("output_norm.weight", TYPE_F32, [dim], 11)]  # tied output
    return gguf(kvs, ts)


def spm_vocab():
    toks = ["<unk>", "<s>", "</s>", "<0x0A>", "<0xF0>", "<0x9F>", "\u2581", "H", "e", "l", "o",
            "\u2581H", "ll", "\u2581Hello"]
    types = [2, 3, 3, 6, 6, 6] + [1] * (len(toks) - 6)
    scores = [0.0] * 6 + [-float(i) for i in range(len(toks) - 6)]
    return [("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, toks)),
            ("tokenizer.ggml.scores", ARR, (F32, scores)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2)], len(toks)


def bpe_vocab(pre):
    toks = ["H", "e", "l", "o", "\u0120", "w", "r", "d", "1", "2", "ll", "He", "\u0120w", "<|end|>"]
    merges = ["l l", "H e", "\u0120 w"]
    types = [1] * (len(toks) - 1) + [3]
    return [("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, pre),
            ("tokenizer.ggml.tokens", ARR, (STR, toks)),
            ("tokenizer.ggml.token_type", ARR, (I32, types)),
            ("tokenizer.ggml.merges", ARR, (STR, merges)),
            ("tokenizer.ggml.eos_token_id", U32, len(toks) - 1)], len(toks)


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {}
    every_type = [("u8", U8, 7), ("i8", I8, -7), ("u16", U16, 700), ("i16", I16, -700),
                  ("u32", U32, 70000), ("i32", I32, -70000), ("f32", F32, 0.5), ("bool", BOOL, True),
                  ("str", STR, "h\u00e9llo"), ("u64", U64, 1 << 40), ("i64", I64, -(1 << 40)),
                  ("f64", F64, 0.25), ("arr_i32", ARR, (I32, [1, -2, 3])),
                  ("arr_str", ARR, (STR, ["a", "", "bc"])),
                  ("arr_arr", ARR, (ARR, [(U8, [1, 2]), (U8, [3])]))]
    seeds["metadata_v3.gguf"] = gguf(every_type, [])
    seeds["metadata_v2.gguf"] = gguf(every_type[:6], [], version=2)
    seeds["tensors_align64.gguf"] = gguf(
        [("general.alignment", U32, 64)],
        [tensor("a", TYPE_F32, [4, 2], 1), tensor("q8", TYPE_Q8_0, [32, 2], 2),
         tensor("q4", TYPE_Q4_0, [32, 1, 2], 3), tensor("h", TYPE_F16, [3], 4)], alignment=64)
    kvs, n = spm_vocab()
    seeds["llama_spm_f32.gguf"] = llama(kvs, n, dim=8)
    seeds["llama_spm_moe_q8_0.gguf"] = llama(kvs, n, gt=TYPE_Q8_0, moe=True)
    kvs, n = bpe_vocab("llama-bpe")
    seeds["llama_bpe_llama3.gguf"] = llama(kvs, n, dim=8)
    kvs, n = bpe_vocab("qwen2")
    seeds["vocab_bpe_qwen2.gguf"] = gguf([("general.architecture", STR, "llama")] + kvs, [])
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")
    tokenizer_seeds(TOKENIZER_OUT)
    comm_seeds(os.path.join(os.path.dirname(OUT)))


def tokenizer_seeds(out):
    os.makedirs(out, exist_ok=True)
    texts = {
        "words": "hello world, the 123 4567 tell-all",
        "spaces": "  leading\tand\r\n trailing   ",
        "unicode": "h\u00e9llo \U0001f999 \u4e16\u754c \u0661\u0662 caf\u00e9",
        "contractions": "I'm you're it's WE'LL they've",
        "special": "<s>hi<|end|> <tool>x</s>",
        "spm_space": "\u2581the \u2581\u2581 he",
    }
    seeds = {}
    for name, text in texts.items():
        data = text.encode()
        for vocab, label in [(GPT2, "gpt2"), (LLAMA3, "llama3"), (QWEN2, "qwen2"), (SPM, "spm"),
                             (SPM_REAL, "spm_real")]:
            seeds[f"{label}_{name}.txt"] = bytes([vocab | ADD_SPECIAL]) + data
    seeds["gpt2_invalid_utf8.txt"] = bytes([GPT2]) + b"\xff\xfe\xe2\x82 z\xc3"
    seeds["spm_invalid_utf8.txt"] = bytes([SPM]) + b"ab\xe2\x82\xf0\x9f\xa6 \x80"
    seeds["llama3_parse_special.txt"] = bytes([LLAMA3 | PARSE_SPECIAL]) + b"a<|end|>b"
    seeds["spm_ids.txt"] = bytes([SPM]) + struct.pack("<8i", 300, 259, 3, -1, 1 << 30, 200, 0x1F, 270)
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(seeds)} tokenizer seeds")


def comm_seeds(corpus):
    """Seeds of the comm wire fuzzers: store_fuzz, comm_frame_fuzz, frame_auth_fuzz
    (the first byte picks each one's mode; see the targets' comments)."""
    def request(cmd, key, tail):
        return bytes([cmd]) + struct.pack("<I", len(key)) + key + tail

    def reply(code, payload):
        return bytes([code]) + struct.pack("<Q", len(payload)) + payload

    def frame(tag, payload):
        pad = (8 - len(payload) % 8) % 8
        return struct.pack("<IiQ", 0x314D5354, tag, len(payload)) + payload + b"\0" * pad

    sets = {
        "store": {
            "requests.bin": bytes([0]) + request(1, b"addr/0", struct.pack("<Q", 3) + b"a:1")
            + request(2, b"addr/0", struct.pack("<q", 0)) + request(3, b"n", struct.pack("<q", 5))
            + request(3, b"addr/0", struct.pack("<q", 1)) + request(9, b"x", b""),
            "oversized_key.bin": bytes([0]) + bytes([1]) + struct.pack("<I", 1 << 31),
            "replies.bin": bytes([1]) + reply(0, b"") + reply(1, b"key never set")
            + reply(2, b"bad") + reply(7, b""),
            "roundtrip.bin": bytes([2]) + b"some/key\0value bytes" * 3,
            "handshake_client.bin": bytes([3, 0]) + b"TSA1" + bytes(range(32)) + bytes([1])
            + bytes(32),
            "handshake_server.bin": bytes([3, 1]) + bytes(range(64)),
        },
        "comm_frame": {
            "raw_frames.bin": bytes([0]) + frame(0, b"abcdefgh" * 4) + frame(1, b"xyz")
            + struct.pack("<IIQQ", 0x31435354, 2, 16, 0) + bytes([2, 0, 0, 1, 0, 0, 0x40, 0]),
            "huge_frame.bin": bytes([0]) + struct.pack("<IiQ", 0x314D5354, 0, 1 << 60),
            "roundtrip.bin": bytes([1]) + bytes(range(64)),
            "flipped.bin": bytes([2]) + bytes(range(64, 128)),
        },
        "frame_auth": {
            "raw_record.bin": bytes([0]) + struct.pack("<IIQ", 0x31465354, 16, 0) + bytes(16 + 16),
            "raw_long.bin": bytes([0]) + struct.pack("<IIQ", 0x31465354, 1 << 16, 0) + bytes(64),
            "roundtrip.bin": bytes([1]) + bytes(range(48)),
            "tampered.bin": bytes([2]) + bytes(range(48, 96)),
        },
    }
    for name, seeds in sets.items():
        out = os.path.join(corpus, name)
        os.makedirs(out, exist_ok=True)
        for file, data in seeds.items():
            with open(os.path.join(out, file), "wb") as f:
                f.write(data)
        print(f"{len(seeds)} {name} seeds")


if __name__ == "__main__":
    main()
