// Quantized-weight family: GGUF Q4_0 / Q4_1 / Q8_0 blocks repacked at load, Y = X · Wᵀ with the
// weights dequantized on the fly (fp32 activations and accumulation) or with int8 activations
// (llama.cpp's scheme, integer dot products), and dequantization to bf16.
//
// JS entry points (wrapped by native/src/quant.ts; shapes row-major; type = "q4_0"|"q4_1"|"q8_0"):
//   quantPack(src: Uint8Array [n·(k/32)·RawBlockBytes] raw GGUF tensor bytes, type, n, k,
//             out: Uint8Array [PackedBytes(type, n, k)]) -> undefined
//   gemmQuant(x: Float32Array [m·k], m, k, packed: Uint8Array, type, n, y: Float32Array [m·n])
//             -> undefined                                   (synchronous, blocks the caller)
//             [, act: "f32" (default) | "int8" | "int16"]
//             act "f32": weights dequantized to fp32, fp32 activations; "int8": activations quantized
//             per 32-block to int8 once per call, integer block dot products (VNNI where present);
//             "int16": as int8 with 16-bit quants split into two int8 planes (two dot products each)
//   gemmQuantAsync(same arguments) -> Promise<undefined>     (libuv thread, like gemmBf16Async)
//   quantDequantBf16(packed: Uint8Array, type, n, k, out: Uint16Array [n·k]) -> undefined
//             (bf16 bits of d·q + m rounded to nearest even, row-major [n, k])
// k must be a positive multiple of 32 (the GGUF block size). Block formats, packed layout,
// numerics and the reduction order (batch invariance): quant_kernels.h. Threads split panels of 16
// rows (N), never K, so results do not depend on the thread count.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "families.h"
#include "isa.h"
#include "quant_kernels.h"
#include "threadpool.h"

namespace specd {
namespace {

using quant::Problem;
using quant::Type;

Type ReadType(ArgReader& args, size_t i) {
  const std::string s = args.String(i, "type");
  if (s == "q4_0") return Type::kQ4_0;
  if (s == "q4_1") return Type::kQ4_1;
  if (s == "q8_0") return Type::kQ8_0;
  args.Fail("type", "one of \"q4_0\", \"q4_1\", \"q8_0\"", "string \"" + s + "\"");
}

/** k: a positive multiple of 32. */
int64_t ReadK(ArgReader& args, size_t i) {
  const int64_t k = args.Int(i, "k", 1);
  if (k % quant::kBlock != 0) args.Fail("k", "a positive multiple of 32 (the GGUF block size)", std::to_string(k));
  return k;
}

/** Uint8Array argument of exactly `length` bytes (ArgReader has no U8 reader). */
Napi::Uint8Array ReadU8(ArgReader& args, const Napi::CallbackInfo& info, size_t i, const char* name, size_t length,
                        const char* what) {
  const std::string expected = "Uint8Array of length " + std::to_string(length) + " (" + what + ")";
  Napi::Value v = i < info.Length() ? info[i] : info.Env().Undefined();
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array) {
    static const char* const kNames[] = {"Int8Array",  "Uint8Array",  "Uint8ClampedArray", "Int16Array",  "Uint16Array",
                                         "Int32Array", "Uint32Array", "Float32Array",      "Float64Array"};
    std::string got = v.IsUndefined() ? "undefined"
                      : v.IsNull()    ? "null"
                      : v.IsString()  ? "string"
                      : v.IsNumber()  ? "number"
                                      : "object";
    if (v.IsTypedArray()) {
      const int type = static_cast<int>(v.As<Napi::TypedArray>().TypedArrayType());
      got = std::string(type >= 0 && type < 9 ? kNames[type] : "TypedArray") + " of length " +
            std::to_string(v.As<Napi::TypedArray>().ElementLength());
    }
    throw MakeError(info.Env(), ErrorKind::kTypeError, "ERR_SPECD_INVALID_ARG",
                    std::string(args.call()) + ": " + name + ": expected " + expected + ", got " + got);
  }
  Napi::Uint8Array a = v.As<Napi::Uint8Array>();
  if (a.ElementLength() != length)
    args.Fail(name, expected, "Uint8Array of length " + std::to_string(a.ElementLength()));
  return a;
}

/** Repacks n rows of raw GGUF blocks into the panel layout of quant_kernels.h (parallel over panels). */
void Pack(const uint8_t* src, Type t, int64_t n, int64_t k, uint8_t* out) {
  const int64_t blocks = k / quant::kBlock;
  const int64_t rb = quant::RawBlockBytes(t);
  const int64_t pbb = quant::PanelBlockBytes(t);
  const int64_t sb = quant::ScaleBytes(t);
  const int64_t qbytes = t == Type::kQ8_0 ? 32 : 16;  // quant bytes per raw block
  ParallelFor(
      quant::Panels(n),
      [&](int64_t begin, int64_t end) {
        for (int64_t panel = begin; panel < end; ++panel) {
          uint8_t* dst = out + panel * blocks * pbb;
          std::memset(dst, 0, static_cast<size_t>(blocks * pbb));  // padding rows: d = m = 0, q = 0
          for (int64_t lane = 0; lane < quant::kLanes; ++lane) {
            const int64_t row = panel * quant::kLanes + lane;
            if (row >= n) break;
            for (int64_t b = 0; b < blocks; ++b) {
              const uint8_t* s = src + (row * blocks + b) * rb;
              uint8_t* d = dst + b * pbb;
              std::memcpy(d + 2 * lane, s, 2);                                 // d
              if (t == Type::kQ4_1) std::memcpy(d + 32 + 2 * lane, s + 2, 2);  // m
              const uint8_t* qs = s + (t == Type::kQ4_1 ? 4 : 2);
              for (int64_t j = 0; j < qbytes; ++j) d[sb + j * quant::kLanes + lane] = qs[j];
            }
          }
        }
      },
      quant::kLanes * k);
}

/** bf16 (RNE) of every dequantized weight, row-major [n, k]; the same fp32 values the GEMM uses. */
void DequantBf16(const uint8_t* packed, Type t, int64_t n, int64_t k, uint16_t* out) {
  const int64_t blocks = k / quant::kBlock;
  const int64_t pbb = quant::PanelBlockBytes(t);
  const int64_t sb = quant::ScaleBytes(t);
  ParallelFor(
      quant::Panels(n),
      [&](int64_t begin, int64_t end) {
        for (int64_t panel = begin; panel < end; ++panel) {
          for (int64_t lane = 0; lane < quant::kLanes; ++lane) {
            const int64_t row = panel * quant::kLanes + lane;
            if (row >= n) break;
            for (int64_t b = 0; b < blocks; ++b) {
              const uint8_t* blk = packed + (panel * blocks + b) * pbb;
              uint16_t dh, mh = 0;
              std::memcpy(&dh, blk + 2 * lane, 2);
              if (t == Type::kQ4_1) std::memcpy(&mh, blk + 32 + 2 * lane, 2);
              const float d = quant::F16ToF32(dh);
              const float m = quant::F16ToF32(mh);
              uint16_t* o = out + row * k + b * quant::kBlock;
              const uint8_t* qs = blk + sb;
              if (t == Type::kQ8_0) {
                for (int j = 0; j < 32; ++j)
                  o[j] = F32ToBf16(d * static_cast<float>(static_cast<int8_t>(qs[j * 16 + lane])));
              } else {
                for (int j = 0; j < 16; ++j) {
                  const uint8_t q = qs[j * 16 + lane];
                  if (t == Type::kQ4_1) {
                    o[j] = F32ToBf16(d * static_cast<float>(q & 0xF) + m);
                    o[j + 16] = F32ToBf16(d * static_cast<float>(q >> 4) + m);
                  } else {  // as ggml: d·(q − 8), so a zero weight keeps the sign of d
                    o[j] = F32ToBf16(d * static_cast<float>((q & 0xF) - 8));
                    o[j + 16] = F32ToBf16(d * static_cast<float>((q >> 4) - 8));
                  }
                }
              }
            }
          }
        }
      },
      quant::kLanes * k);
}

void RunGemm(const Problem& p) {
  void (*kernel)(const Problem&, int64_t, int64_t, float*) = quant::PanelsPortable;
#if defined(SPECD_HAVE_AVX512_BUILD)
  if (CurrentIsa() == Isa::kAvx512) kernel = quant::PanelsAvx512;
#endif
  if (p.m == 0 || p.n == 0) return;
  ParallelFor(
      quant::Panels(p.n),
      [&](int64_t begin, int64_t end) {
        std::vector<float> scratch(static_cast<size_t>(quant::ScratchFloats(p.m)));
        kernel(p, begin, end, scratch.data());
      },
      quant::PanelWork(p.m, p.k));
}

/** AMX tiles for the int8 and int16 GEMMs when available (SPECD_QUANT_AMX=0 turns them off, for A/B runs). */
const bool g_int8_amx = [] {
  const char* v = std::getenv("SPECD_QUANT_AMX");
  return v == nullptr || std::string(v) != "0";
}();

/**
 * Rows from which the int8 GEMM takes the AMX tiles: quant::kAmxMinRows, or SPECD_QUANT_AMX_MIN_ROWS (an integer
 * >= 1; A/B runs on a machine with AMX: the same bits either way, only the speed differs).
 */
const int64_t g_amx_min_rows = [] {
  const char* v = std::getenv("SPECD_QUANT_AMX_MIN_ROWS");
  const long n = v == nullptr ? 0 : std::strtol(v, nullptr, 10);
  return n >= 1 ? static_cast<int64_t>(n) : quant::kAmxMinRows;
}();
/** The same for int16 activations: quant::kAmxMinRowsWide, or SPECD_QUANT_AMX_MIN_ROWS_WIDE (an integer >= 1). */
const int64_t g_amx_min_rows_wide = [] {
  const char* v = std::getenv("SPECD_QUANT_AMX_MIN_ROWS_WIDE");
  const long n = v == nullptr ? 0 : std::strtol(v, nullptr, 10);
  return n >= 1 ? static_cast<int64_t>(n) : quant::kAmxMinRowsWide;
}();

/**
 * Y = Q(X) · Wᵀ with int8 activations, or int16 ones with `wide` (quant_kernels.h, "int8 activations",
 * "int16 activations"): X quantized once per call (rows split over threads), then panels split over
 * threads. VNNI path when the ISA is avx512 and the CPU has VBMI (AMX-INT8 tiles where present for m >=
 * kAmxMinRows, int16: kAmxMinRowsWide), else portable; all give the same bits.
 */
void RunGemmI8(const Problem& p, bool wide) {
  if (p.m == 0 || p.n == 0) return;
  const bool vnni = CurrentIsa() == Isa::kAvx512 && Avx512VbmiAvailable();
  // Same integer sums, same fp32 combination: the AMX path changes no bit, only the speed.
  const bool amx = vnni && AmxInt8Available() && p.m >= (wide ? g_amx_min_rows_wide : g_amx_min_rows) && g_int8_amx;
  const int64_t blocks = p.k / quant::kBlock;
  // The quantized activations in kept scratch (common.h; the quantization writes every element; fresh zero-filled
  // vectors cost a 512-row prefill chunk ~0.6 MB of memset per GEMM).
  struct ActBuffers {
    std::vector<int8_t> q, lo;
    std::vector<float> d, s;
    std::vector<int32_t> sum;
  };
  thread_local ActBuffers kept;
  ActBuffers own;
  const quant::ActsI8 acts{KeptScratch(kept.q, own.q, p.m * p.k), KeptScratch(kept.d, own.d, p.m * blocks),
                           KeptScratch(kept.s, own.s, p.m * blocks), KeptScratch(kept.sum, own.sum, p.m * blocks),
                           wide ? KeptScratch(kept.lo, own.lo, p.m * p.k) : nullptr};
  ParallelFor(
      p.m,
      [&](int64_t begin, int64_t end) {
#if defined(SPECD_HAVE_AVX512_BUILD)
        if (vnni) return quant::QuantizeActsAvx512(p.x, p.ldx, p.k, begin, end, acts);
#endif
        quant::QuantizeActsPortable(p.x, p.ldx, p.k, begin, end, acts);
      },
      4 * p.k);
  const quant::ProblemI8 q{acts, p.packed, p.y, p.ldy, p.m, p.n, p.k, p.type};
  ParallelFor(
      quant::Panels(p.n),
      [&](int64_t begin, int64_t end) {
#if defined(SPECD_HAVE_AVX512_BUILD)
        if (amx) {
          // Kept per thread (common.h): a fresh vector of 128 KiB or more would be an mmap faulted in on every call.
          thread_local std::vector<uint8_t> kept_amx;
          std::vector<uint8_t> own_amx;
          uint8_t* raw = KeptScratch(kept_amx, own_amx, quant::ScratchBytesI8Amx(p.k) + 64);
          uint8_t* scratch = raw + (64 - reinterpret_cast<uintptr_t>(raw) % 64) % 64;
          return quant::PanelsI8Amx(q, begin, end, scratch);
        }
        if (vnni) return quant::PanelsI8Vnni(q, begin, end);
#endif
        quant::PanelsI8Portable(q, begin, end);
      },
      // int8 MACs run ~4× the fp32 FMA rate: a quarter of PanelWork, so small calls stay inline. int16:
      // two VPDPBUSD per int8 one (m/4), and counted like PanelWork (not a quarter), so the GEMVs of a
      // decode step split over 2 threads as the fp32 ones do: they stream the weights from DRAM, and a
      // second thread adds bandwidth (Zen 5, 2 threads, SmolLM2 decode step ×0.88–0.95 of fp32 against
      // ×1.0–1.1 with a quarter; docs/BENCHMARKS.md, "int16 activations").
      wide ? quant::kLanes * p.k * (1 + p.m / 4) : (quant::PanelWork(p.m, p.k) + 3) / 4);
}

/** Activation mode of gemmQuant: "f32" (default, weights dequantized), "int8" or "int16" (RunGemmI8). */
enum class Act { kF32, kInt8, kInt16 };

Act ReadAct(ArgReader& args, size_t i) {
  if (args.IsAbsent(i)) return Act::kF32;
  const std::string s = args.String(i, "act");
  if (s == "f32") return Act::kF32;
  if (s == "int8") return Act::kInt8;
  if (s == "int16") return Act::kInt16;
  args.Fail("act", "\"f32\", \"int8\" or \"int16\"", "string \"" + s + "\"");
}

void Run(const Problem& p, Act act) {
  if (act == Act::kF32) return RunGemm(p);
  RunGemmI8(p, act == Act::kInt16);
}

Napi::Value QuantPackBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "quantPack");
  const Type t = ReadType(args, 1);
  const int64_t n = args.Int(2, "n", 1);
  const int64_t k = ReadK(args, 3);
  auto src = ReadU8(args, info, 0, "src", CheckedProduct("quantPack", {n, k / quant::kBlock, quant::RawBlockBytes(t)}),
                    "n*(k/32)*blockBytes");
  auto out = ReadU8(args, info, 4, "out",
                    CheckedProduct("quantPack", {quant::Panels(n), k / quant::kBlock, quant::PanelBlockBytes(t)}),
                    "quantPackedBytes(type, n, k)");
  Pack(src.Data(), t, n, k, out.Data());
  return info.Env().Undefined();
}

struct GemmCall {
  Problem problem{};
  Act act = Act::kF32;
  Napi::Float32Array x, y;
  Napi::Uint8Array packed;
};

GemmCall ReadGemmArgs(const Napi::CallbackInfo& info, const char* call) {
  ArgReader args(info, call);
  GemmCall c;
  const Type t = ReadType(args, 4);
  const int64_t m = args.Int(1, "m", 0);
  const int64_t k = ReadK(args, 2);
  const int64_t n = args.Int(5, "n", 1);
  c.x = args.F32(0, "x", CheckedProduct(call, {m, k}), "m*k");
  c.packed = ReadU8(args, info, 3, "packed",
                    CheckedProduct(call, {quant::Panels(n), k / quant::kBlock, quant::PanelBlockBytes(t)}),
                    "quantPackedBytes(type, n, k)");
  c.y = args.F32(6, "y", CheckedProduct(call, {m, n}), "m*n");
  c.problem = Problem{c.x.Data(), k, c.packed.Data(), c.y.Data(), n, m, n, k, t};
  c.act = ReadAct(args, 7);
  return c;
}

Napi::Value GemmQuantBinding(const Napi::CallbackInfo& info) {
  const GemmCall c = ReadGemmArgs(info, "gemmQuant");
  Run(c.problem, c.act);
  return info.Env().Undefined();
}

Napi::Value GemmQuantAsyncBinding(const Napi::CallbackInfo& info) {
  GemmCall c = ReadGemmArgs(info, "gemmQuantAsync");
  const Problem p = c.problem;
  const Act act = c.act;
  return QueueKernel(info.Env(), "gemmQuantAsync", [p, act]() { Run(p, act); }, {c.x, c.packed, c.y});
}

Napi::Value QuantDequantBf16Binding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "quantDequantBf16");
  const Type t = ReadType(args, 1);
  const int64_t n = args.Int(2, "n", 1);
  const int64_t k = ReadK(args, 3);
  auto packed =
      ReadU8(args, info, 0, "packed",
             CheckedProduct("quantDequantBf16", {quant::Panels(n), k / quant::kBlock, quant::PanelBlockBytes(t)}),
             "quantPackedBytes(type, n, k)");
  auto out = args.U16(4, "out", CheckedProduct("quantDequantBf16", {n, k}), "n*k");
  DequantBf16(packed.Data(), t, n, k, out.Data());
  return info.Env().Undefined();
}

}  // namespace

void RegisterQuant(Napi::Env env, Napi::Object exports) {
  exports.Set("quantPack", Napi::Function::New(env, Guarded<QuantPackBinding>, "quantPack"));
  exports.Set("gemmQuant", Napi::Function::New(env, Guarded<GemmQuantBinding>, "gemmQuant"));
  exports.Set("gemmQuantAsync", Napi::Function::New(env, Guarded<GemmQuantAsyncBinding>, "gemmQuantAsync"));
  exports.Set("quantDequantBf16", Napi::Function::New(env, Guarded<QuantDequantBf16Binding>, "quantDequantBf16"));
}

}  // namespace specd
