#include "engine/rank_report.h"

#include <algorithm>
#include <cstring>

#include "base/proc_status.h"

namespace tessera::engine {
namespace {

// Reports travel as a flat list of int64 words (strings as length + bytes packed
// into words), so the driver can print every rank's figures.
class Words {
 public:
  void Put(int64_t v) { words_.push_back(v); }
  void PutString(const std::string& s) {
    Put(static_cast<int64_t>(s.size()));
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
      Put(w);
    }
  }
  const std::vector<int64_t>& words() const { return words_; }

 private:
  std::vector<int64_t> words_;
};

class WordReader {
 public:
  explicit WordReader(std::span<const int64_t> words) : words_(words) {}
  Result<int64_t> Get() {
    if (pos_ >= words_.size()) return InvalidArgumentError("report ends early");
    return words_[pos_++];
  }
  Result<std::string> GetString() {
    TESSERA_ASSIGN_OR_RETURN(int64_t n, Get());
    if (n < 0 || n > 4096) return InvalidArgumentError("report has a bad string length");
    std::string s(static_cast<size_t>(n), '\0');
    for (int64_t i = 0; i < n; i += 8) {
      TESSERA_ASSIGN_OR_RETURN(int64_t w, Get());
      std::memcpy(s.data() + i, &w, static_cast<size_t>(std::min<int64_t>(8, n - i)));
    }
    return s;
  }

 private:
  std::span<const int64_t> words_;
  size_t pos_ = 0;
};

void PutShare(Words& w, const TimeShare& t) {
  w.Put(t.steps);
  w.Put(t.compute_ns);
  w.Put(t.comm_ns);
  w.Put(t.wait_ns);
}

Status GetShare(WordReader& r, TimeShare& t) {
  TESSERA_ASSIGN_OR_RETURN(t.steps, r.Get());
  TESSERA_ASSIGN_OR_RETURN(t.compute_ns, r.Get());
  TESSERA_ASSIGN_OR_RETURN(t.comm_ns, r.Get());
  TESSERA_ASSIGN_OR_RETURN(t.wait_ns, r.Get());
  return Status::Ok();
}

void PutVector(Words& w, const std::vector<int64_t>& v) {
  w.Put(static_cast<int64_t>(v.size()));
  for (int64_t x : v) w.Put(x);
}

Status GetVector(WordReader& r, std::vector<int64_t>& v) {
  TESSERA_ASSIGN_OR_RETURN(int64_t n, r.Get());
  if (n < 0 || n > 4096) return InvalidArgumentError("report has a bad vector length");
  v.resize(static_cast<size_t>(n));
  for (int64_t& x : v) {
    TESSERA_ASSIGN_OR_RETURN(x, r.Get());
  }
  return Status::Ok();
}

// A ledger map: its size, then per key the name, calls, bytes sent and received.
void PutLedgerEntries(Words& w, const std::map<std::string, comm::LedgerEntry>& entries) {
  w.Put(static_cast<int64_t>(entries.size()));
  for (const auto& [key, e] : entries) {
    w.PutString(key);
    w.Put(static_cast<int64_t>(e.calls));
    w.Put(static_cast<int64_t>(e.bytes_sent));
    w.Put(static_cast<int64_t>(e.bytes_received));
  }
}

Status GetLedgerEntries(WordReader& r, std::map<std::string, comm::LedgerEntry>& entries) {
  TESSERA_ASSIGN_OR_RETURN(int64_t keys, r.Get());
  if (keys < 0 || keys > 64) return InvalidArgumentError("report has a bad ledger size");
  for (int64_t k = 0; k < keys; ++k) {
    TESSERA_ASSIGN_OR_RETURN(std::string key, r.GetString());
    comm::LedgerEntry e;
    TESSERA_ASSIGN_OR_RETURN(int64_t v, r.Get());
    e.calls = static_cast<uint64_t>(v);
    TESSERA_ASSIGN_OR_RETURN(v, r.Get());
    e.bytes_sent = static_cast<uint64_t>(v);
    TESSERA_ASSIGN_OR_RETURN(v, r.Get());
    e.bytes_received = static_cast<uint64_t>(v);
    entries[key] = e;
  }
  return Status::Ok();
}

}  // namespace

std::vector<int64_t> EncodeRankReport(const RankReport& report) {
  Words w;
  for (int64_t v :
       {int64_t{report.rank}, int64_t{report.stage}, int64_t{report.tp_rank}, report.weight_bytes,
        report.kv_bytes, report.peak_rss_bytes, report.activation_bytes}) {
    w.Put(v);
  }
  w.PutString(report.links);
  PutShare(w, report.decode);
  PutShare(w, report.prefill);
  PutVector(w, report.expert_rows_total);
  PutVector(w, report.expert_rows_by_layer);
  w.Put(report.expert_rows_computed);
  w.Put(static_cast<int64_t>(report.traffic.size()));
  for (const StepTraffic& t : report.traffic) {
    for (int64_t v : {static_cast<int64_t>(t.step_id), int64_t{t.decode}, t.sequences, t.tokens,
                      t.context, t.logit_rows}) {
      w.Put(v);
    }
    PutLedgerEntries(w, t.bytes);
    w.Put(t.ep_rows_sent);
    w.Put(t.ep_rows_received);
    w.Put(t.expert_rows_computed);
    PutVector(w, t.expert_rows);
  }
  PutLedgerEntries(w, report.ledger);
  return w.words();
}

Result<RankReport> DecodeRankReport(std::span<const int64_t> words) {
  WordReader r(words);
  RankReport report;
  int64_t v = 0;
  TESSERA_ASSIGN_OR_RETURN(v, r.Get());
  report.rank = static_cast<int>(v);
  TESSERA_ASSIGN_OR_RETURN(v, r.Get());
  report.stage = static_cast<int>(v);
  TESSERA_ASSIGN_OR_RETURN(v, r.Get());
  report.tp_rank = static_cast<int>(v);
  TESSERA_ASSIGN_OR_RETURN(report.weight_bytes, r.Get());
  TESSERA_ASSIGN_OR_RETURN(report.kv_bytes, r.Get());
  TESSERA_ASSIGN_OR_RETURN(report.peak_rss_bytes, r.Get());
  TESSERA_ASSIGN_OR_RETURN(report.activation_bytes, r.Get());
  TESSERA_ASSIGN_OR_RETURN(report.links, r.GetString());
  TESSERA_RETURN_IF_ERROR(GetShare(r, report.decode));
  TESSERA_RETURN_IF_ERROR(GetShare(r, report.prefill));
  TESSERA_RETURN_IF_ERROR(GetVector(r, report.expert_rows_total));
  TESSERA_RETURN_IF_ERROR(GetVector(r, report.expert_rows_by_layer));
  TESSERA_ASSIGN_OR_RETURN(report.expert_rows_computed, r.Get());
  TESSERA_ASSIGN_OR_RETURN(int64_t steps, r.Get());
  if (steps < 0 || steps > (int64_t{1} << 24)) return InvalidArgumentError("bad report");
  for (int64_t i = 0; i < steps; ++i) {
    StepTraffic& t = report.traffic.emplace_back();
    TESSERA_ASSIGN_OR_RETURN(v, r.Get());
    t.step_id = static_cast<uint64_t>(v);
    TESSERA_ASSIGN_OR_RETURN(v, r.Get());
    t.decode = v != 0;
    TESSERA_ASSIGN_OR_RETURN(t.sequences, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.tokens, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.context, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.logit_rows, r.Get());
    TESSERA_RETURN_IF_ERROR(GetLedgerEntries(r, t.bytes));
    TESSERA_ASSIGN_OR_RETURN(t.ep_rows_sent, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.ep_rows_received, r.Get());
    TESSERA_ASSIGN_OR_RETURN(t.expert_rows_computed, r.Get());
    TESSERA_RETURN_IF_ERROR(GetVector(r, t.expert_rows));
  }
  TESSERA_RETURN_IF_ERROR(GetLedgerEntries(r, report.ledger));
  return report;
}

int64_t PeakRssBytes() { return ProcStatusBytes("VmHWM"); }

}  // namespace tessera::engine
