#!/usr/bin/python3
"""Independent numpy reference forward pass for llama-architecture GGUF models.

Written from the model definitions (RMSNorm, RoPE, GQA attention, SwiGLU,
Mixtral-style MoE), sharing no code with tessera: a tiny pure-python GGUF reader
and a float64 forward pass over a whole token sequence. The C++ golden test runs it
with Debian's /usr/bin/python3 (python3-numpy) and compares every position's
logits with tessera's.

  /usr/bin/python3 tests/reference/llama_ref.py MODEL.gguf --tokens 1,403,407 \
      --out logits.f32 [--dump-hidden PREFIX]

--out: raw little-endian float32 logits, [n_tokens, vocab], position after position.
--dump-hidden: PREFIX.embd.f32 and PREFIX.layerNN.f32, the residual stream
  [n_tokens, dim] after the embedding and after each layer (for debugging).
Supports F32 and F16 tensors; llama arch (normal RoPE) and qwen2 (NeoX RoPE).
"""
import argparse
import struct
import sys

import numpy as np

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types -> struct format (scalars)
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
          10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# GGML tensor types this reference reads
TENSOR_DTYPE = {0: np.float32, 1: np.float16}


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, fmt):
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self):
        n = self.take("<Q")
        value = bytes(self.data[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return value

    def value(self, vtype):
        if vtype in SCALAR:
            return self.take(SCALAR[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item_type = self.take("<I")
            n = self.take("<Q")
            return [self.value(item_type) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_gguf(path):
    data = memoryview(open(path, "rb").read())
    r = Reader(data)
    if bytes(data[:4]) != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    r.pos = 4
    version = r.take("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} not supported")
    n_tensors = r.take("<Q")
    n_kv = r.take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.take("<I")
        dims = [r.take("<Q") for _ in range(n_dims)]
        ttype = r.take("<I")
        offset = r.take("<Q")
        infos.append((name, dims, ttype, offset))
    alignment = meta.get("general.alignment", 32)
    data_start = (r.pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, dims, ttype, offset in infos:
        if ttype not in TENSOR_DTYPE:
            continue  # quantised: not read by this reference
        count = int(np.prod(dims))
        array = np.frombuffer(data, dtype=TENSOR_DTYPE[ttype], count=count,
                              offset=data_start + offset)
        # GGUF dims are fastest-first; numpy wants slowest-first.
        tensors[name] = array.reshape(list(reversed(dims))).astype(np.float64)
    return meta, tensors, {name: ttype for name, _, ttype, _ in infos}


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(x, positions, n_rot, base, neox, scale):
    """x: [n_tokens, n_heads, head_dim]; rotates the first n_rot dims of each head."""
    out = x.copy()
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    angles = (positions[:, None].astype(np.float64) * scale) * inv_freq[None, :]  # [T, half]
    cos = np.cos(angles)[:, None, :]
    sin = np.sin(angles)[:, None, :]
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def dense_ffn(h, gate, up, down):
    return (silu(h @ gate.T) * (h @ up.T)) @ down.T


def moe_ffn(h, t, prefix, n_used, renormalize):
    router = h @ t[prefix + "ffn_gate_inp.weight"].T  # [T, n_expert]
    probs = softmax(router)
    gate, up, down = (t[prefix + f"ffn_{w}_exps.weight"] for w in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for i in range(h.shape[0]):
        # top-k by probability, ties to the lower expert id
        chosen = sorted(range(probs.shape[1]), key=lambda e: (-probs[i, e], e))[:n_used]
        weights = probs[i, chosen]
        if renormalize:  # Mixtral (llama arch) renormalises the k weights; qwen2moe does not
            weights = weights / np.sum(weights)
        for w, e in zip(weights, chosen):
            out[i] += w * dense_ffn(h[i:i + 1], gate[e], up[e], down[e])[0]
    if prefix + "ffn_gate_inp_shexp.weight" in t:  # qwen2moe shared expert, sigmoid-gated
        shared = dense_ffn(h, t[prefix + "ffn_gate_shexp.weight"],
                           t[prefix + "ffn_up_shexp.weight"], t[prefix + "ffn_down_shexp.weight"])
        g = 1.0 / (1.0 + np.exp(-(h @ t[prefix + "ffn_gate_inp_shexp.weight"].reshape(-1, 1))))
        out += g * shared
    return out


def forward(meta, t, tokens, dump_hidden=None):
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2", "qwen2moe", "mistral"):
        raise ValueError(f"architecture {arch} not supported by the reference")
    hp = lambda key, default=None: meta.get(f"{arch}.{key}", default)
    dim = hp("embedding_length")
    n_layers = hp("block_count")
    n_head = hp("attention.head_count")
    n_kv = hp("attention.head_count_kv", n_head)
    eps = hp("attention.layer_norm_rms_epsilon")
    head_dim = hp("attention.key_length", dim // n_head)
    n_rot = hp("rope.dimension_count", head_dim)
    base = hp("rope.freq_base", 10000.0)
    scaling = hp("rope.scaling.type", "none")
    scale = 1.0
    if scaling == "linear":
        scale = 1.0 / hp("rope.scaling.factor", 1.0)
    elif scaling not in ("none",):
        raise ValueError(f"rope scaling {scaling} not supported by the reference")
    n_used = hp("expert_used_count", 0)
    neox = arch in ("qwen2", "qwen2moe")

    tokens = np.asarray(tokens, dtype=np.int64)
    positions = np.arange(len(tokens))
    T = len(tokens)
    x = t["token_embd.weight"][tokens].copy()  # [T, dim]
    if dump_hidden:
        x.astype("<f4").tofile(f"{dump_hidden}.embd.f32")
    causal = np.triu(np.full((T, T), -np.inf), k=1)
    group = n_head // n_kv
    for layer in range(n_layers):
        p = f"blk.{layer}."
        h = rms_norm(x, t[p + "attn_norm.weight"], eps)
        q = h @ t[p + "attn_q.weight"].T
        k = h @ t[p + "attn_k.weight"].T
        v = h @ t[p + "attn_v.weight"].T
        if p + "attn_q.bias" in t:
            q += t[p + "attn_q.bias"]
            k += t[p + "attn_k.bias"]
            v += t[p + "attn_v.bias"]
        q = rope(q.reshape(T, n_head, head_dim), positions, n_rot, base, neox, scale)
        k = rope(k.reshape(T, n_kv, head_dim), positions, n_rot, base, neox, scale)
        v = v.reshape(T, n_kv, head_dim)
        attn = np.zeros((T, n_head, head_dim))
        for head in range(n_head):
            kv = head // group
            scores = q[:, head, :] @ k[:, kv, :].T / np.sqrt(head_dim) + causal
            attn[:, head, :] = softmax(scores) @ v[:, kv, :]
        x = x + attn.reshape(T, n_head * head_dim) @ t[p + "attn_output.weight"].T
        h = rms_norm(x, t[p + "ffn_norm.weight"], eps)
        if p + "ffn_gate_inp.weight" in t:
            x = x + moe_ffn(h, t, p, n_used, renormalize=arch != "qwen2moe")
        else:
            x = x + dense_ffn(h, t[p + "ffn_gate.weight"], t[p + "ffn_up.weight"],
                              t[p + "ffn_down.weight"])
        if dump_hidden:
            x.astype("<f4").tofile(f"{dump_hidden}.layer{layer:02d}.f32")
    h = rms_norm(x, t["output_norm.weight"], eps)
    output = t.get("output.weight", t["token_embd.weight"])  # tied when absent
    return h @ output.T  # [T, vocab]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", required=True, help="comma-separated token ids")
    parser.add_argument("--out", required=True, help="raw f32 logits [n_tokens, vocab]")
    parser.add_argument("--dump-hidden", help="prefix for per-layer hidden-state dumps")
    args = parser.parse_args()
    meta, tensors, types = read_gguf(args.model)
    needed = [n for n, ty in types.items() if ty not in TENSOR_DTYPE]
    if needed:
        sys.exit(f"{args.model}: tensors of unsupported (quantised) types, e.g. {needed[0]}")
    tokens = [int(s) for s in args.tokens.split(",") if s]
    logits = forward(meta, tensors, tokens, args.dump_hidden)
    logits.astype("<f4").tofile(args.out)


if __name__ == "__main__":
    main()
