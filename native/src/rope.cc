// RoPE family: rotary position embeddings applied to [tokens, heads, headDim] f32.
//
// JS entry point (wrapped by native/src/rope.ts):
//   rope(x: Float32Array [tokens*heads*headDim], positions: Int32Array [tokens] (>= 0),
//        tokens, heads, headDim, rotaryDim (even, <= headDim), theta (> 0),
//        style: "neox" | "interleaved", out: Float32Array [same as x]) -> undefined
// For i in [0, rotaryDim/2): inv_freq_i = theta^(-2i/rotaryDim), angle = pos * inv_freq_i,
// computed in double, then c = cos, s = sin rounded to f32. Pairs (a, b) rotate to
// (a*c - b*s, b*c + a*s) where
//   neox (rotate halves, HF rotate_half / GPT-NeoX): a = v[i], b = v[i + rotaryDim/2]
//   interleaved (GPT-J / original RoFormer pairs):   a = v[2i], b = v[2i+1]
// Dimensions >= rotaryDim are copied unchanged (partial rotary). out may alias x.
//
// The (c, s) of positions below kCachedPositions are kept in a process-wide table per (theta,
// rotaryDim), filled on first use by the same formula (so the same bits): a forward calls rope twice
// per layer on the same positions, and the double cos/sin were most of the call.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "common.h"
#include "families.h"
#include "threadpool.h"

namespace specd {
namespace {

constexpr int64_t kCachedPositions = int64_t{1} << 15;  // 8 MiB of table for rotaryDim 64
constexpr size_t kMaxTables = 8;

/** cs[pos * rotary + i] = c_i, cs[pos * rotary + half + i] = s_i for pos < positions. */
struct RopeTable {
  double theta;
  int64_t rotary;
  int64_t positions;
  std::vector<float> cs;
};

/** inv_freq_i = theta^(-2i/rotaryDim) in double (the header's formula). */
std::vector<double> InvFreq(double theta, int64_t rotary) {
  std::vector<double> inv(static_cast<size_t>(rotary / 2));
  for (int64_t i = 0; i < rotary / 2; ++i)
    inv[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary));
  return inv;
}

/** c and s of position p: c[i], s[i] for i < inv.size(). */
void CosSin(const std::vector<double>& inv, int64_t p, float* c, float* s) {
  for (size_t i = 0; i < inv.size(); ++i) {
    const double angle = static_cast<double>(p) * inv[i];
    c[i] = static_cast<float>(std::cos(angle));
    s[i] = static_cast<float>(std::sin(angle));
  }
}

/** A table of (theta, rotary) covering positions [0, need) (need <= kCachedPositions); thread-safe. */
std::shared_ptr<const RopeTable> CachedTable(double theta, int64_t rotary, int64_t need) {
  static std::mutex mu;
  static std::vector<std::shared_ptr<const RopeTable>> tables;  // most recently grown last
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<const RopeTable> old;
  for (size_t i = 0; i < tables.size(); ++i) {
    if (tables[i]->theta != theta || tables[i]->rotary != rotary) continue;
    if (tables[i]->positions >= need) return tables[i];
    old = tables[i];
    tables.erase(tables.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  auto t = std::make_shared<RopeTable>();
  t->theta = theta;
  t->rotary = rotary;
  const int64_t have = old ? old->positions : 0;
  t->positions = std::min(kCachedPositions, std::max({need, 2 * have, int64_t{256}}));
  t->cs.resize(static_cast<size_t>(t->positions * rotary));
  if (old) std::memcpy(t->cs.data(), old->cs.data(), old->cs.size() * sizeof(float));
  const std::vector<double> inv = InvFreq(theta, rotary);
  for (int64_t p = have; p < t->positions; ++p) CosSin(inv, p, &t->cs[p * rotary], &t->cs[p * rotary + rotary / 2]);
  if (tables.size() >= kMaxTables) tables.erase(tables.begin());
  tables.push_back(t);
  return t;
}

Napi::Value RopeBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "rope");
  const int64_t tokens = args.Int(2, "tokens", 0);
  const int64_t heads = args.Int(3, "heads", 1);
  const int64_t head_dim = args.Int(4, "headDim", 1);
  const int64_t rotary = args.Int(5, "rotaryDim", 0, head_dim);
  if (rotary % 2 != 0) args.Fail("rotaryDim", "an even integer", std::to_string(rotary));
  const double theta = args.Number(6, "theta");
  if (!(theta > 0)) args.Fail("theta", "a number > 0", std::to_string(theta));
  const std::string style = args.String(7, "style");
  const bool neox = style == "neox";
  if (!neox && style != "interleaved") args.Fail("style", "\"neox\" or \"interleaved\"", "\"" + style + "\"");
  const size_t total = CheckedProduct("rope", {tokens, heads, head_dim});
  auto x = args.F32(0, "x", total, "tokens*heads*headDim");
  auto pos = args.I32(1, "positions", static_cast<size_t>(tokens), "tokens");
  auto out = args.F32(8, "out", total, "tokens*heads*headDim");
  const int32_t* pp = pos.Data();
  for (int64_t t = 0; t < tokens; ++t) {
    if (pp[t] < 0)
      args.Fail("positions", "values >= 0", "positions[" + std::to_string(t) + "] = " + std::to_string(pp[t]));
  }
  const int64_t half = rotary / 2;
  int64_t max_pos = -1;
  for (int64_t t = 0; t < tokens; ++t) max_pos = std::max<int64_t>(max_pos, pp[t]);
  std::shared_ptr<const RopeTable> table;
  std::vector<double> inv_freq;  // positions beyond the table only
  if (half > 0 && max_pos >= 0 && max_pos < kCachedPositions) table = CachedTable(theta, rotary, max_pos + 1);
  else inv_freq = InvFreq(theta, rotary);
  const float* px = x.Data();
  float* po = out.Data();
  ParallelFor(
      tokens,
      [&](int64_t begin, int64_t end) {  // work per token: heads*headDim (+ cos/sin)
        std::vector<float> cs_buf(table ? 0 : static_cast<size_t>(rotary));
        for (int64_t t = begin; t < end; ++t) {
          const float* c;
          if (table) {
            c = table->cs.data() + pp[t] * rotary;
          } else {
            CosSin(inv_freq, pp[t], cs_buf.data(), cs_buf.data() + half);
            c = cs_buf.data();
          }
          const float* s = c + half;
          for (int64_t h = 0; h < heads; ++h) {
            const float* v = px + (t * heads + h) * head_dim;
            float* o = po + (t * heads + h) * head_dim;
            if (neox) {
              for (int64_t i = 0; i < half; ++i) {
                const float a = v[i], b = v[i + half];
                o[i] = a * c[i] - b * s[i];
                o[i + half] = b * c[i] + a * s[i];
              }
            } else {
              for (int64_t i = 0; i < half; ++i) {
                const float a = v[2 * i], b = v[2 * i + 1];
                o[2 * i] = a * c[i] - b * s[i];
                o[2 * i + 1] = b * c[i] + a * s[i];
              }
            }
            if (o != v) {
              for (int64_t i = rotary; i < head_dim; ++i) o[i] = v[i];
            }
          }
        }
      },
      heads * (head_dim + half));
  return info.Env().Undefined();
}

}  // namespace

void RegisterRope(Napi::Env env, Napi::Object exports) {
  exports.Set("rope", Napi::Function::New(env, Guarded<RopeBinding>, "rope"));
}

}  // namespace specd
