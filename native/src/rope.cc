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
#include <cmath>
#include <vector>

#include "common.h"
#include "families.h"
#include "threadpool.h"

namespace specd {
namespace {

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
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(rotary));
  const float* px = x.Data();
  float* po = out.Data();
  ParallelFor(
      tokens,
      [&](int64_t begin, int64_t end) {  // work per token: heads*headDim (+ cos/sin)
        std::vector<float> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
        for (int64_t t = begin; t < end; ++t) {
          for (int64_t i = 0; i < half; ++i) {
            const double angle = static_cast<double>(pp[t]) * inv_freq[i];
            c[i] = static_cast<float>(std::cos(angle));
            s[i] = static_cast<float>(std::sin(angle));
          }
          for (int64_t h = 0; h < heads; ++h) {
            const float* v = px + (t * heads + h) * head_dim;
            float* o = po + (t * heads + h) * head_dim;
            for (int64_t i = 0; i < half; ++i) {
              const int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
              const float a = v[ia], b = v[ib];
              o[ia] = a * c[i] - b * s[i];
              o[ib] = b * c[i] + a * s[i];
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
