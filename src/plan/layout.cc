#include "plan/layout.h"

#include <charconv>

namespace tessera::plan {
namespace {

std::string S(int64_t v) { return std::to_string(v); }

Status RowSplitAligned(std::string_view what, int64_t cols, int64_t tp, const DType& dtype) {
  if (cols % tp != 0) {
    return InvalidArgumentError("tp (" + S(tp) + ") must divide " + std::string(what) + " (" +
                                S(cols) + ")");
  }
  if ((cols / tp) % dtype.block_elems != 0) {
    if (tp == 1) {
      return InvalidArgumentError(std::string(what) + " (" + S(cols) +
                                  ") is not a whole number of " + dtype.name + " blocks (" +
                                  S(dtype.block_elems) + " elements): the model cannot be " +
                                  "stored as " + dtype.name);
    }
    return InvalidArgumentError(std::string(what) + " / tp = " + S(cols / tp) +
                                " is not a whole number of " + dtype.name + " blocks (" +
                                S(dtype.block_elems) +
                                " elements): the row-parallel split would cut a block");
  }
  return Status::Ok();
}

}  // namespace

std::string Parallelism::ToString() const {
  std::string out;
  auto add = [&](const char* name, int64_t v) {
    if (v == 1) return;
    if (!out.empty()) out += ' ';
    out.append(name).append(S(v));
  };
  add("tp", tp);
  add("pp", pp);
  add("dp", dp);
  add("ep", ep);
  add("cp", cp);
  if (sp > 0) out += sp == 1 ? " sp" : " sp>=" + S(sp);
  return out.empty() ? "tp1" : out;
}

std::string Layout::ToString() const {
  if (!prefill) return decode.ToString();
  return "P[" + prefill->ToString() + "] D[" + decode.ToString() + "]";
}

Result<Parallelism> ParseParallelism(std::string_view text) {
  Parallelism p;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = item.find('=');
    int64_t value = 0;
    if (eq == std::string_view::npos) {
      return InvalidArgumentError("layout '" + std::string(text) +
                                  "': expected NAME=N items like tp=2,pp=2");
    }
    const std::string_view name = item.substr(0, eq);
    const std::string_view number = item.substr(eq + 1);
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
    if (ec != std::errc() || end != number.data() + number.size() || value < 1) {
      return InvalidArgumentError("layout '" + std::string(text) + "': '" + std::string(item) +
                                  "' needs a positive integer");
    }
    if (name == "tp") {
      p.tp = value;
    } else if (name == "pp") {
      p.pp = value;
    } else if (name == "dp") {
      p.dp = value;
    } else if (name == "ep") {
      p.ep = value;
    } else if (name == "cp") {
      p.cp = value;
    } else if (name == "sp") {
      p.sp = value;
    } else {
      return InvalidArgumentError("layout '" + std::string(text) + "': unknown degree '" +
                                  std::string(name) + "' (known: tp, pp, dp, ep, cp, sp)");
    }
  }
  return p;
}

LayerRange StageLayers(int64_t n_layers, int64_t pp, int64_t stage) {
  const int64_t base = n_layers / pp;
  const int64_t longer = n_layers % pp;
  const int64_t first = stage * base + std::min(stage, longer);
  return {first, first + base + (stage < longer ? 1 : 0)};
}

Status ValidateParallelism(const ModelShape& m, const DType& wdt, const Parallelism& p) {
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.ep < 1 || p.cp < 1) {
    return InvalidArgumentError("every parallel degree must be at least 1 (" + p.ToString() + ")");
  }
  if (p.sp > 0 && (p.tp < 2 || m.is_moe() || p.ep > 1)) {
    return InvalidArgumentError(
        "sp splits a dense model's steps over the tp ranks: it needs "
        "tp >= 2, no experts and no ep (" +
        p.ToString() + ")");
  }
  if (m.num_heads % p.tp != 0) {
    return InvalidArgumentError("tp (" + S(p.tp) + ") must divide the query heads (" +
                                S(m.num_heads) + ")");
  }
  if (m.kv_latent_dim == 0) {
    if (p.tp <= m.num_kv_heads ? m.num_kv_heads % p.tp != 0 : p.tp % m.num_kv_heads != 0) {
      return InvalidArgumentError("tp (" + S(p.tp) + ") and the KV heads (" + S(m.num_kv_heads) +
                                  ") must divide one another (KV heads are split, or "
                                  "replicated when tp exceeds them)");
    }
  }
  if (p.pp > m.num_layers) {
    return InvalidArgumentError("pp (" + S(p.pp) + ") exceeds the layers (" + S(m.num_layers) +
                                ")");
  }
  TESSERA_RETURN_IF_ERROR(RowSplitAligned("the attention output width heads*head_dim",
                                          m.num_heads * m.head_dim, p.tp, wdt));
  const bool has_dense_layers = !m.is_moe() || m.num_dense_layers > 0;
  if (has_dense_layers) TESSERA_RETURN_IF_ERROR(RowSplitAligned("ffn", m.ffn_dim, p.tp, wdt));
  if (m.is_moe() && p.ep == 1) {
    TESSERA_RETURN_IF_ERROR(RowSplitAligned("expert_ffn", m.expert_ffn_dim, p.tp, wdt));
  }
  if (m.num_shared_experts > 0 && p.ep == 1) {
    TESSERA_RETURN_IF_ERROR(
        RowSplitAligned("shared_expert_ffn", m.shared_expert_ffn_dim, p.tp, wdt));
  }
  if (p.ep > 1) {
    if (!m.is_moe()) {
      return InvalidArgumentError("ep (" + S(p.ep) + ") needs an MoE model; '" + m.name +
                                  "' is dense");
    }
    if (m.num_experts % p.ep != 0) {
      return InvalidArgumentError("ep (" + S(p.ep) + ") must divide the experts (" +
                                  S(m.num_experts) + ")");
    }
    if ((p.tp * p.dp) % p.ep != 0) {
      return InvalidArgumentError("ep (" + S(p.ep) + ") must divide tp*dp (" + S(p.tp * p.dp) +
                                  "): an EP group is made of one stage's TP and DP ranks");
    }
    if (p.cp > 1) return InvalidArgumentError("ep > 1 with cp > 1 is not modelled");
  }
  return Status::Ok();
}

Status ValidateLayout(const ModelShape& model, const Cluster& cluster, const DType& wdt,
                      const Layout& layout) {
  TESSERA_RETURN_IF_ERROR(ValidateParallelism(model, wdt, layout.decode));
  if (layout.prefill) {
    TESSERA_RETURN_IF_ERROR(
        ValidateParallelism(model, wdt, *layout.prefill).WithContext("prefill instances"));
  }
  if (layout.devices() > cluster.total_devices()) {
    return InvalidArgumentError("layout " + layout.ToString() + " needs " + S(layout.devices()) +
                                " devices; the cluster has " + S(cluster.total_devices()));
  }
  return Status::Ok();
}

std::vector<Layout> EnumerateLayouts(const ModelShape& model, const Cluster& cluster,
                                     const DType& wdt, const EnumerateOptions& options) {
  const int64_t n = cluster.total_devices();
  std::vector<Parallelism> singles;
  for (int64_t tp = 1; tp <= n; ++tp) {
    for (int64_t pp = 1; tp * pp <= n; ++pp) {
      for (int64_t cp = 1; tp * pp * cp <= n; cp *= 2) {
        if (cp > 1 && !options.context_parallel) break;
        for (int64_t dp = 1; tp * pp * cp * dp <= n; ++dp) {
          for (int64_t ep = 1; ep <= tp * dp; ++ep) {
            if (ep > 1 && (!model.is_moe() || (tp * dp) % ep != 0)) continue;
            Parallelism p{tp, pp, dp, ep, cp};
            if (ValidateParallelism(model, wdt, p).ok()) singles.push_back(p);
          }
        }
      }
    }
  }
  std::vector<Layout> layouts;
  for (const Parallelism& p : singles) layouts.push_back({p, std::nullopt});
  if (options.prefill_decode_split) {
    for (const Parallelism& prefill : singles) {
      for (const Parallelism& decode : singles) {
        if (prefill.devices() + decode.devices() > n) continue;
        if (static_cast<int64_t>(layouts.size()) >= options.max_layouts) return layouts;
        layouts.push_back({decode, prefill});
      }
    }
  }
  return layouts;
}

}  // namespace tessera::plan
