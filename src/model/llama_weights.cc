#include "model/llama_weights.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "base/check.h"
#include "base/half.h"
#include "kernels/matmul.h"
#include "model/shard.h"

namespace tessera::model {
namespace {

// Binds tensor `name` (present and shape-checked by ValidateModelTensors).
WeightMatrix Matrix(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.FindTensor(name);
  TESSERA_CHECK(t != nullptr) << name;
  WeightMatrix m;
  m.type = t->type;
  m.cols = t->dims[0];
  m.rows = t->num_elements / t->dims[0];
  m.data = t->data;
  m.name = t->name;
  return m;
}

std::span<const float> Vector(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.FindTensor(name);
  TESSERA_CHECK(t != nullptr) << name;
  TESSERA_CHECK(t->type == kernels::WeightType::kF32) << name;
  TESSERA_CHECK(reinterpret_cast<uintptr_t>(t->data.data()) % alignof(float) == 0) << name;
  return {reinterpret_cast<const float*>(t->data.data()), static_cast<size_t>(t->num_elements)};
}

std::span<const float> OptionalVector(const GgufFile& file, const std::string& name) {
  return file.FindTensor(name) ? Vector(file, name) : std::span<const float>();
}

}  // namespace

std::vector<WeightMatrix> ExpertMatrices(const GgufFile& file, const std::string& name) {
  const GgufTensor* t = file.FindTensor(name);
  TESSERA_CHECK(t != nullptr && t->dims.size() == 3) << name;
  const int64_t num_experts = t->dims[2];
  const size_t slab = t->data.size() / static_cast<size_t>(num_experts);
  std::vector<WeightMatrix> out;
  for (int64_t e = 0; e < num_experts; ++e) {
    WeightMatrix m;
    m.type = t->type;
    m.cols = t->dims[0];
    m.rows = t->dims[1];
    m.data = t->data.subspan(static_cast<size_t>(e) * slab, slab);
    m.name = t->name;
    out.push_back(m);
  }
  return out;
}

namespace {

int64_t Bytes(const WeightMatrix& m) { return static_cast<int64_t>(m.data.size()); }

std::span<const float> Slice(std::span<const float> v, Range r, int64_t width) {
  if (v.empty()) return v;
  return v.subspan(static_cast<size_t>(r.begin * width), static_cast<size_t>(r.size() * width));
}

// Binds one rank's shard, copying out the column slices of row-parallel matrices.
class ShardBinder {
 public:
  // A measuring binder (kMeasure) copies nothing: it adds up the bytes the copies
  // would take (needed_bytes()) and leaves every view as it is, so that the real
  // binder's arena can be one chunk of exactly that size.
  enum Mode { kCopy, kMeasure };
  ShardBinder(const GgufFile& file, const ShardLayout& layout, LlamaWeights& out, Mode mode = kCopy)
      : file_(file), layout_(layout), out_(out), mode_(mode) {}

  // Output rows [r.begin, r.end) × `width` (column-parallel): a view.
  WeightMatrix RowsOf(const WeightMatrix& m, Range r, int64_t width) const {
    if (layout_.tp_size == 1) return m;
    return m.Rows(r.begin * width, r.end * width);
  }

  // Input columns [r.begin, r.end) × `width` (row-parallel): copied out (Own),
  // keeping this rank's share of the full matrix's K chunks.
  WeightMatrix ColumnsOf(const WeightMatrix& m, Range r, int64_t width) {
    if (layout_.tp_size == 1) return m;
    WeightMatrix shard = Own(m, kernels::ColumnShard(m.view(), r.begin * width, r.end * width));
    shard.k_chunks = kernels::CanonicalKChunks(m.type, m.cols) / layout_.tp_size;
    return shard;
  }

  // A matrix only the matmul reads: one the kernel can take interleaved 8 rows to a
  // group (faster, the same bits) is copied out (Own) unless ColumnsOf already
  // did; anything else stays as it is.
  void Interleave(WeightMatrix& m) {
    if (!m.empty() && kernels::CanInterleave8(m.view())) m = Own(m, m.view());
  }

  // The f32 vector `tensor` (empty if it is optional and absent; its [r.begin,
  // r.end) × width slice when width > 0), copied out of the mapping (Copy).
  std::span<const float> CopiedVector(const std::string& tensor, bool optional = false,
                                      Range r = {}, int64_t width = 0) {
    const GgufTensor* t = file_.FindTensor(tensor);
    if (t != nullptr && t->type != kernels::WeightType::kF32) return Widened(*t, r, width);
    std::span<const float> v =
        optional ? OptionalVector(file_, tensor) : model::Vector(file_, tensor);
    if (width > 0) v = Slice(v, r, width);
    return Copy(v, tensor);
  }

  // A query/key projection's rows (whole heads of `head` rows in Hugging Face's
  // rotate-half order, GgufTensor::rope_halves_head) reordered into GGUF's pairs in a
  // buffer of this rank's (Own): row 2i + j of a head is the stored row j * head/2 + i.
  // The same dot products come out in the order the rope kernel pairs them, so the
  // results are those of the GGUF the checkpoint was converted from, bit for bit.
  WeightMatrix RopePairOrder(const WeightMatrix& m, int64_t head) {
    if (head == 0 || m.empty()) return m;
    TESSERA_CHECK(m.layout == kernels::WeightLayout::kRows && m.rows % head == 0 && head % 2 == 0)
        << m.name;
    return Own(m, m.view(), head);
  }

  // Ok, or why a matrix could not be copied out (no memory): the weights are then
  // unusable. Once it is set, later copies are skipped.
  const Status& status() const { return status_; }

  // The arena bytes this binder's copies took (or, measuring, would take).
  size_t needed_bytes() const { return needed_bytes_; }

  // Drops every released range once more when all copies are done: a later fault in
  // the same large folio (a slab's read, a vector's) may have mapped it back.
  void ReleaseAgain() {
    const std::vector<std::span<const uint8_t>> released = std::move(released_);
    released_.clear();
    for (std::span<const uint8_t> bytes : released) Release(bytes);
  }

 private:
  // A small f32 vector (a norm's or a bias's weights) in a buffer of this rank's, so
  // that decode never reads the file: the page cache holds it in large folios (2 MiB
  // here), and a fault on a norm between two matrices mapped its folio back, pages
  // of released matrices with it. The 110M Q8_0 decode kept 38–42 MiB of its file
  // resident that way (pagemap; the faults were RmsNorm's, in perf's page-fault
  // samples): peak RSS 158.9 MiB against 137.2 of weights and KV, 133.0 now.
  std::span<const float> Copy(std::span<const float> v, std::string_view name) {
    if (v.empty() || !status_.ok()) return v;
    const size_t bytes = v.size_bytes();
    needed_bytes_ += HugePageArena::RoundedBytes(bytes);
    if (mode_ == kMeasure) return v;
    Result<std::span<uint8_t>> allocated = out_.owned.Allocate(bytes);
    if (!allocated.ok()) {
      status_ = ResourceExhaustedError(
          "GGUF '" + file_.name() + "': no memory for " + std::string(name) + " (" +
          std::to_string(bytes) +
          " bytes, copied out of the file): " + allocated.status().message());
      return v;
    }
    std::memcpy(allocated->data(), v.data(), bytes);
    Release(std::as_bytes(v));
    return {reinterpret_cast<const float*>(allocated->data()), v.size()};
  }

  // An f16/bf16 vector (a Hugging Face checkpoint's norms), or its [r.begin, r.end) ×
  // width slice, widened to f32 in a buffer of this rank's; the source pages released.
  std::span<const float> Widened(const GgufTensor& t, Range r, int64_t width) {
    int64_t begin = 0, count = t.num_elements;
    if (width > 0) {
      begin = r.begin * width;
      count = r.size() * width;
    }
    if (count == 0 || !status_.ok()) return {};
    const size_t bytes = static_cast<size_t>(count) * sizeof(float);
    needed_bytes_ += HugePageArena::RoundedBytes(bytes);
    if (mode_ == kMeasure) return {};
    Result<std::span<uint8_t>> allocated = out_.owned.Allocate(bytes);
    if (!allocated.ok()) {
      status_ = ResourceExhaustedError("'" + file_.name() + "': no memory for " +
                                       std::string(t.name) + ": " + allocated.status().message());
      return {};
    }
    auto* out = reinterpret_cast<float*>(allocated->data());
    const uint8_t* in = t.data.data() + static_cast<size_t>(begin) * 2;
    for (int64_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      out[i] = t.type == kernels::WeightType::kBF16 ? Bf16ToF32(h) : F16ToF32(h);
    }
    Release(std::span<const uint8_t>(in, static_cast<size_t>(count) * 2));
    return {out, static_cast<size_t>(count)};
  }

  // `source` (m's rows or a column shard of them) in a buffer of this rank's:
  // interleaved when the kernel takes its type so (kernels::CanInterleave8), packed
  // rows otherwise. It goes over in slabs of rows, each slab's pages in the mapping
  // released once it is copied, so that loading holds at most one slab twice (an
  // output head is tens of MiB: 11% of a 110M model's resident size when it was
  // copied whole).
  // With rope_head > 0, the rows are reordered as RopePairOrder says, a slab of whole
  // heads at a time (a slab's worth of extra memory, not the matrix's).
  WeightMatrix Own(const WeightMatrix& m, const kernels::WeightView& source,
                   int64_t rope_head = 0) {
    constexpr int64_t kSlabBytes = int64_t{4} << 20;
    const bool interleave = kernels::CanInterleave8(source);
    const int64_t row_bytes = interleave ? kernels::Interleaved8RowBytes(m.type, source.cols)
                                         : *kernels::RowBytes(m.type, source.cols);
    const int64_t source_row_read = *kernels::RowBytes(m.type, source.cols);
    const auto bytes = static_cast<size_t>(row_bytes * m.rows);
    if (!status_.ok()) return m;
    needed_bytes_ += HugePageArena::RoundedBytes(bytes);
    if (mode_ == kMeasure) {  // the layout Interleave checks; the data stays the file's
      WeightMatrix measured = m;
      if (interleave) measured.layout = kernels::WeightLayout::kInterleaved8;
      return measured;
    }
    Result<std::span<uint8_t>> allocated = out_.owned.Allocate(bytes);
    if (!allocated.ok()) {  // m stays as it is; the caller returns status()
      status_ = ResourceExhaustedError(
          "GGUF '" + file_.name() + "': no memory for " + std::string(m.name) + " (" +
          std::to_string(bytes) +
          " bytes, repacked for the matmul): " + allocated.status().message());
      return m;
    }
    const std::span<uint8_t> buf = allocated->first(bytes);
    WeightMatrix owned = m;
    owned.cols = source.cols;
    owned.data = buf;
    if (interleave) owned.layout = kernels::WeightLayout::kInterleaved8;
    const int64_t unit = rope_head > 0 ? std::lcm<int64_t>(rope_head, 8) : 8;
    const int64_t slab = std::max<int64_t>(unit, kSlabBytes / source.row_bytes / unit * unit);
    std::vector<uint8_t> reordered;
    for (int64_t r0 = 0; r0 < m.rows; r0 += slab) {
      const int64_t r1 = std::min(m.rows, r0 + slab);
      kernels::WeightView rows = kernels::RowShard(source, r0, r1);
      if (rope_head > 0) {  // rows r0.. hold whole heads: pair them up in `reordered`
        const auto stride = static_cast<size_t>(source.row_bytes);
        reordered.resize(static_cast<size_t>(r1 - r0) * stride);
        for (int64_t h0 = 0; h0 < r1 - r0; h0 += rope_head) {
          for (int64_t k = 0; k < rope_head; ++k) {
            const int64_t from = h0 + (k % 2) * (rope_head / 2) + k / 2;
            std::memcpy(reordered.data() + (h0 + k) * stride, rows.data + from * stride,
                        static_cast<size_t>(source_row_read));
          }
        }
        rows.data = reordered.data();
      }
      if (interleave) {
        kernels::Interleave8(rows, buf.data() + r0 * row_bytes);
      } else {
        for (int64_t i = r0; i < r1; ++i) {
          std::memcpy(buf.data() + i * row_bytes, rows.data + (i - r0) * source.row_bytes,
                      static_cast<size_t>(row_bytes));
        }
      }
      // The slab's rows, up to the end of its last row's part of `source`.
      Release({source.data + r0 * source.row_bytes,
               static_cast<size_t>((r1 - 1 - r0) * source.row_bytes + source_row_read)});
    }
    Release(m.data);  // the rest of m's rows: a column shard's rows hold others' columns
    return owned;
  }

  // Drops the source pages a copy read from this process's memory (when they lie in
  // the mapping), and keeps the range for ReleaseAgain.
  void Release(std::span<const std::byte> bytes) {
    const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
    const MappedFile* mapping = file_.MappingOf({begin, bytes.size()});
    if (mapping == nullptr) return;
    mapping->AdviseDontNeed(static_cast<size_t>(begin - mapping->data()), bytes.size());
    released_.emplace_back(begin, bytes.size());
  }
  void Release(std::span<const uint8_t> bytes) { Release(std::as_bytes(bytes)); }

  const GgufFile& file_;
  const ShardLayout& layout_;
  LlamaWeights& out_;
  const Mode mode_;
  size_t needed_bytes_ = 0;
  Status status_;                                   // the first matrix that could not be copied out
  std::vector<std::span<const uint8_t>> released_;  // the source ranges Release dropped
};

// Adds the bytes of the experts `layout` holds in each of w's layers (bound:
// their first one is not empty) to w's totals, `sign` times: all of them to
// total_bytes, and num_experts_used / ep of them to what a decode token reads.
void AddExpertBytes(const ModelConfig& config, const ShardLayout& layout, LlamaWeights& w,
                    int sign = 1) {
  for (size_t li = 0; li < w.layers.size() && li < layout.held_experts.size(); ++li) {
    const LlamaLayerWeights& layer = w.layers[li];
    const std::vector<int32_t>& held_experts = layout.held_experts[li];
    const int64_t held = static_cast<int64_t>(held_experts.size());
    if (held == 0) continue;
    for (const auto* experts : {&layer.expert_gate, &layer.expert_up, &layer.expert_down}) {
      const WeightMatrix& first = (*experts)[static_cast<size_t>(held_experts[0])];
      if (first.empty()) continue;
      w.total_bytes += sign * Bytes(first) * held;
      const int64_t read = sign * Bytes(first) * config.num_experts_used / layout.ep_size;
      w.decode_bytes_per_token += read;
      if (read != 0) w.decode_bytes_by_type[first.type] += read;
    }
  }
}

// Binds every weight of `layout`'s shard into `w` through `bind` (which copies or,
// measuring, only counts).
Status BindInto(const GgufFile& file, const ModelConfig& config, const ShardLayout& layout,
                ShardBinder& bind, LlamaWeights& w) {
  const int64_t hd = config.head_dim;
  // `bytes` more read by a decode step, of m's type.
  const auto decode_reads = [&w](const WeightMatrix& m, int64_t bytes) {
    w.decode_bytes_per_token += bytes;
    if (bytes > 0) w.decode_bytes_by_type[m.type] += bytes;
  };
  if (layout.first_stage) {
    w.token_embd = bind.RowsOf(Matrix(file, "token_embd.weight"), layout.vocab, 1);
  }
  if (layout.last_stage) {
    w.output_norm = bind.CopiedVector("output_norm.weight");
    const WeightMatrix output =
        config.tied_output ? Matrix(file, "token_embd.weight") : Matrix(file, "output.weight");
    w.output = bind.RowsOf(output, layout.vocab, 1);
  }
  for (int64_t l = layout.layers.begin; l < layout.layers.end; ++l) {
    auto name = [l](std::string_view suffix) { return BlockTensorName(l, suffix); };
    LlamaLayerWeights& layer = w.layers.emplace_back();
    layer.attn_norm = bind.CopiedVector(name("attn_norm.weight"));
    layer.wq = bind.RowsOf(Matrix(file, name("attn_q.weight")), layout.heads, hd);
    layer.wk = bind.RowsOf(Matrix(file, name("attn_k.weight")), layout.kv_heads, hd);
    layer.wq =
        bind.RopePairOrder(layer.wq, file.FindTensor(name("attn_q.weight"))->rope_halves_head);
    layer.wk =
        bind.RopePairOrder(layer.wk, file.FindTensor(name("attn_k.weight"))->rope_halves_head);
    layer.wv = bind.RowsOf(Matrix(file, name("attn_v.weight")), layout.kv_heads, hd);
    layer.wo = bind.ColumnsOf(Matrix(file, name("attn_output.weight")), layout.heads, hd);
    layer.bq = bind.CopiedVector(name("attn_q.bias"), true, layout.heads, hd);
    layer.bk = bind.CopiedVector(name("attn_k.bias"), true, layout.kv_heads, hd);
    layer.bv = bind.CopiedVector(name("attn_v.bias"), true, layout.kv_heads, hd);
    layer.bo = bind.CopiedVector(name("attn_output.bias"), true);
    layer.ffn_norm = bind.CopiedVector(name("ffn_norm.weight"));
    if (config.is_moe()) {
      layer.router = Matrix(file, name("ffn_gate_inp.weight"));
      // Indexed by global expert id. Under expert parallelism a rank's experts go
      // into its expert slots once every other weight is bound (PlaceExperts); the
      // others stay empty (their pages are never touched).
      const bool ep = layout.ep_size > 1;
      const std::vector<WeightMatrix> gates = ExpertMatrices(file, name("ffn_gate_exps.weight"));
      const std::vector<WeightMatrix> ups = ExpertMatrices(file, name("ffn_up_exps.weight"));
      const std::vector<WeightMatrix> downs = ExpertMatrices(file, name("ffn_down_exps.weight"));
      for (size_t e = 0; e < gates.size(); ++e) {
        if (ep) {
          layer.expert_gate.emplace_back();
          layer.expert_up.emplace_back();
          layer.expert_down.emplace_back();
        } else {
          layer.expert_gate.push_back(bind.RowsOf(gates[e], layout.expert_ffn, 1));
          layer.expert_up.push_back(bind.RowsOf(ups[e], layout.expert_ffn, 1));
          layer.expert_down.push_back(bind.ColumnsOf(downs[e], layout.expert_ffn, 1));
        }
      }
      if (config.shared_expert_ffn_dim > 0) {
        layer.shared_gate = Matrix(file, name("ffn_gate_inp_shexp.weight"));
        layer.shared_ffn_gate = Matrix(file, name("ffn_gate_shexp.weight"));
        layer.shared_ffn_up = Matrix(file, name("ffn_up_shexp.weight"));
        layer.shared_ffn_down = Matrix(file, name("ffn_down_shexp.weight"));
        if (!ep) {  // under expert parallelism every rank holds it whole (moe_ep.h)
          layer.shared_ffn_gate = bind.RowsOf(layer.shared_ffn_gate, layout.shared_ffn, 1);
          layer.shared_ffn_up = bind.RowsOf(layer.shared_ffn_up, layout.shared_ffn, 1);
          layer.shared_ffn_down = bind.ColumnsOf(layer.shared_ffn_down, layout.shared_ffn, 1);
        }
      }
    } else {
      layer.ffn_gate = bind.RowsOf(Matrix(file, name("ffn_gate.weight")), layout.ffn, 1);
      layer.ffn_up = bind.RowsOf(Matrix(file, name("ffn_up.weight")), layout.ffn, 1);
      layer.ffn_down = bind.ColumnsOf(Matrix(file, name("ffn_down.weight")), layout.ffn, 1);
    }
    for (WeightMatrix* m :
         {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.ffn_gate, &layer.ffn_up,
          &layer.ffn_down, &layer.shared_ffn_gate, &layer.shared_ffn_up, &layer.shared_ffn_down}) {
      bind.Interleave(*m);
    }
    for (auto* experts : {&layer.expert_gate, &layer.expert_up, &layer.expert_down}) {
      for (WeightMatrix& m : *experts) bind.Interleave(m);
    }
    TESSERA_RETURN_IF_ERROR(bind.status());
    // The bytes as the matmul reads them (after interleaving: Q4_K's rows grow 148/144).
    // A decode step reads every matrix once, of an MoE layer's experts num_experts_used.
    for (const WeightMatrix* m :
         {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.ffn_gate, &layer.ffn_up,
          &layer.ffn_down, &layer.router, &layer.shared_gate, &layer.shared_ffn_gate,
          &layer.shared_ffn_up, &layer.shared_ffn_down}) {
      w.total_bytes += Bytes(*m);
      decode_reads(*m, Bytes(*m));
    }
  }
  AddExpertBytes(config, layout, w);
  // The head; when it is the embedding's matrix on this same rank, that one matrix,
  // which the lookup then reads back a row at a time (kernels::GgufRow): from the
  // GGUF rows a Q6_K matmul takes 1.2–2.3x the time (kernels_bench, 2026-12-01).
  if (layout.last_stage) {
    const bool shared = config.tied_output && layout.first_stage;
    if (shared) {
      bind.Interleave(w.token_embd);
      w.output = w.token_embd;
    } else {
      bind.Interleave(w.output);
    }
    TESSERA_RETURN_IF_ERROR(bind.status());
    w.total_bytes += shared ? 0 : Bytes(w.output);  // a shared head is the embedding's bytes
    decode_reads(w.output, Bytes(w.output));
  }
  if (layout.first_stage) {  // counted once the head has (or has not) interleaved it
    w.total_bytes += Bytes(w.token_embd);
    // Decode reads one embedding row.
    decode_reads(w.token_embd, static_cast<int64_t>(w.token_embd.row_bytes()));
  }
  return Status::Ok();
}

}  // namespace

WeightMatrix WeightMatrix::Rows(int64_t begin, int64_t end) const {
  TESSERA_CHECK(0 <= begin && begin <= end && end <= rows)
      << begin << ".." << end << " of " << rows;
  TESSERA_CHECK(layout == kernels::WeightLayout::kRows || (begin % 8 == 0 && end % 8 == 0))
      << name << ": rows " << begin << ".." << end << " split a group of 8 interleaved rows";
  WeightMatrix m = *this;
  const size_t bytes = row_bytes();
  m.rows = end - begin;
  m.data = data.subspan(static_cast<size_t>(begin) * bytes, static_cast<size_t>(m.rows) * bytes);
  return m;
}

Result<LlamaWeights> BindLlamaWeights(const GgufFile& file, const ModelConfig& config) {
  TESSERA_ASSIGN_OR_RETURN(ShardLayout layout, ResolveShard(config, ModelShard{}));
  return BindLlamaShard(file, config, layout);
}

Result<LlamaWeights> BindLlamaShard(const GgufFile& file, const ModelConfig& config,
                                    const ShardLayout& layout) {
  TESSERA_RETURN_IF_ERROR(ValidateModelTensors(file, config));
  for (const GgufTensor& t : file.tensors()) {
    if (t.type == kernels::WeightType::kF32 &&
        reinterpret_cast<uintptr_t>(t.data.data()) % alignof(float) != 0) {
      return InvalidArgumentError("GGUF '" + file.name() + "': f32 tensor " + std::string(t.name) +
                                  " is not 4-byte aligned");
    }
  }
  // Two passes: the first adds up what the copies take, so that they all go into one
  // arena chunk of that size (growing chunks left a partly used huge page at the end of
  // each and jumps over the tails: 3 MiB of the 110M Q8_0 model's resident memory).
  LlamaWeights measured;
  ShardBinder measure(file, layout, measured, ShardBinder::kMeasure);
  TESSERA_RETURN_IF_ERROR(BindInto(file, config, layout, measure, measured));
  LlamaWeights w;
  w.owned = HugePageArena(std::max<size_t>(measure.needed_bytes(), 1));
  ShardBinder bind(file, layout, w);
  TESSERA_RETURN_IF_ERROR(BindInto(file, config, layout, bind, w));
  TESSERA_CHECK_EQ(bind.needed_bytes(), measure.needed_bytes());
  if (layout.ep_size > 1 && config.is_moe()) {
    TESSERA_ASSIGN_OR_RETURN(w.expert_slots, CreateExpertSlots(file, config, layout));
    TESSERA_RETURN_IF_ERROR(
        PlaceExperts(file, layout, layout.held_experts, w.layers, w.expert_slots));
    AddExpertBytes(config, layout, w);
  }
  bind.ReleaseAgain();
  return w;
}

Status RebindExperts(const GgufFile& file, const ModelConfig& config, const ShardLayout& from,
                     const ShardLayout& to, LlamaWeights& w) {
  TESSERA_CHECK(to.ep_size > 1 && config.is_moe());
  AddExpertBytes(config, from, w, -1);
  const Status placed = PlaceExperts(file, to, to.held_experts, w.layers, w.expert_slots);
  AddExpertBytes(config, placed.ok() ? to : from, w);  // refused: nothing moved
  return placed;
}

}  // namespace tessera::model
