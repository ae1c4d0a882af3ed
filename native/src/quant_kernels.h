// Inner GEMM kernels over GGUF-quantized weights (Q4_0, Q4_1, Q8_0), shared by quant.cc (packing,
// dispatch, threading, bindings), quant_portable.cc and quant_avx512.cc. Plain declarations and
// static inline helpers only: safe for the ISA files (no STL, no napi; see CMakeLists.txt on ODR).
//
// ---- Source block formats (ggml: ggml-common.h block_q4_0/q4_1/q8_0, ggml-quants.c
//      dequantize_row_q4_0/q4_1/q8_0); QK = 32 weights along K per block, f16 = IEEE binary16 ----
//   Q4_0 (18 B): f16 d, uint8 qs[16]            w[j] = d·((qs[j] & 0xF) − 8), w[j+16] = d·((qs[j] >> 4) − 8)
//   Q4_1 (20 B): f16 d, f16 m, uint8 qs[16]     w[j] = d·(qs[j] & 0xF) + m,   w[j+16] = d·(qs[j] >> 4) + m
//   Q8_0 (34 B): f16 d, int8 qs[32]             w[j] = d·qs[j]
// A GGUF tensor of shape [n, k] (ggml ne = {k, n}) is n rows of k/32 consecutive blocks.
//
// ---- Packed layout ("16-row panels of blocks") -------------------------------------------------
// Rows are grouped into panels of 16 (lane = row % 16; rows past n are zero: d = m = 0, q = 0, so
// their weights are exactly 0). For panel p and block b (b = 0 .. k/32−1) one "panel block" of
// PanelBlockBytes(type) bytes is stored at  packed + (p·(k/32) + b)·PanelBlockBytes(type):
//   Q4_0 (288 B):  d[16] f16 (32 B) | qs[16][16] u8   qs[j][lane] = row's qs[j] (both nibbles)
//   Q4_1 (320 B):  d[16] f16 | m[16] f16 (64 B) | qs[16][16] u8 (as Q4_0)
//   Q8_0 (544 B):  d[16] f16 (32 B) | qs[32][16] i8   qs[j][lane] = row's qs[j]
// So one 16-byte line feeds 16 output columns (one zmm after widening), the scales of 16 rows are
// one 256-bit load, and a panel is one sequential stream over K (a GEMV reads the weights in
// order, as for the bf16 panels of gemm_kernels.h). Bytes moved per weight: Q4_0 4.5 bits, Q4_1 5,
// Q8_0 8.5 — exactly the GGUF sizes (scales stay f16, widened on the fly).
//
// ---- Numerics and reduction order (batch invariance) ------------------------------------------
// Weights are dequantized on the fly in fp32: w = d·q + m (Q4_1), d·q + (−8·d) (Q4_0), d·q (Q8_0),
// q the unsigned nibble / signed byte. d·q is exact in fp32 (11 × 8 significant bits), and −8·d
// too, so w is the correctly rounded d·q + m on both ISA paths (an FMA or a mul + add give the
// same bits; for Q4_0 and Q8_0 w is exact and equals ggml's value).
// Each output Y[r][col] is ONE fp32 accumulator starting at +0, updated block by block (b = 0..),
// and within a block in the fixed order
//   Q4_0 / Q4_1: k = 0, 16, 1, 17, ..., 15, 31   (low nibble of qs[j], then its high nibble)
//   Q8_0:        k = 0, 1, ..., 31
// whatever m, the row's tile or the thread (threads split panels, i.e. N, never K):
// acc = fma(x, w, acc) on AVX-512, acc = acc + x·w (two roundings, -ffp-contract=off) on the
// portable path. Hence row i of a GEMM equals the GEMV of row i bit for bit on one path; the two
// paths differ by the rounding of the products only.
//
// ---- int8 activations (gemmQuant act = "int8"; llama.cpp's q4_0/q4_1/q8_0 × q8_0/q8_1 scheme) ----
// Once per call, every row of X is quantized per block of 32 along K (QuantizeActs*, identical bits
// on both paths; rows are independent, so this is batch invariant too):
//   amax = max |x_j|;  d_x = amax / 127 (fp32 division);
//   q_j = d_x ≠ 0 ? clamp(round-to-nearest-even(x_j / d_x), −127, 127) : 0 (int8; the fp32 quotient
//         is correctly rounded, so only a subnormal d_x can reach the clamp);  Σq = Σ q_j (int32);
//   s_x = d_x · float(Σq) (fp32).   A block with a NaN/±Inf x: q = 0, Σq = 0, d_x = s_x = NaN.
// d_x stays fp32 (ggml's q8_0/q8_1 round it to f16 and multiply by 1/d_x instead of dividing).
// Per output Y[r][col] and weight block b, with the weight quants q_w (Q4_0: nibble − 8,
// Q4_1: nibble, Q8_0: signed byte) and d_w, m_w the f16 scales widened exactly:
//   isum = Σ_{j<32} q_w[j] · q_x[j]                           (int32, exact in any order)
//   t    = (d_w · d_x) · float(isum)                           (two fp32 roundings; float(isum) exact)
//   Q4_1 only: t = t + m_w · s_x                               (two more: ggml's q4_1 × q8_1 term)
//   acc  = acc + t                                             (acc starts at +0, b = 0, 1, …)
// No FMA anywhere in this combination, so the portable and AVX-512 paths give the same bits. The
// integer dot is exact whatever its order (AVX-512 VNNI VPDPBUSD sums u8 × s8 quads with the weight
// as the unsigned side: Q8_0 weights biased by +128 and Q4_0 nibbles unbiased, the bias removed by
// starting isum at −128·Σq resp. −8·Σq). Threads split panels (N), never K, and a row's sum never
// depends on its tile: row i of a GEMM equals the GEMV of row i bit for bit, for any m and thread
// count, and on either path. The AVX-512 path also needs AVX512_VBMI (VPERMB turns a 64-byte group
// of 4 quant lines [k][lane] into 16 dwords [lane][4 k]); without it the portable path runs. Where
// AMX-INT8 is usable, m >= kAmxMinRows computes the same int32 block sums with TDPBSUD tiles and
// combines them in the same fp32 order (quant_i8_amx.cc): same bits, so the GEMV (VNNI) and an AMX
// GEMM still agree row for row.
//
// ---- int16 activations (gemmQuant act = "int16"; int8 × 2 planes, same weights and combination) ----
// As int8, with 16-bit activation quants (~256× less rounding error): per row and block of 32,
//   d_x = amax / 32639 (fp32 division);  q_j = clamp(roundEven(x_j / d_x), ±32639) (d_x = 0: q = 0);
//   Σq, s_x = d_x · float(Σq) as above (|Σq| < 2^20, exact in fp32).
// 32639 = 127·256 + 127, so q splits exactly into two signed bytes q = 256·hi + lo with
//   hi = floor((q + 128) / 256) ∈ [−127, 127],  lo = q − 256·hi ∈ [−128, 127],
// stored as two int8 planes (ActsI8::q = hi, ActsI8::lo = lo). The integer block dot is then
//   isum = 256·Σ q_w·hi + Σ q_w·lo = Σ q_w·q     (int32, exact: |isum| <= 32·128·32639 < 2^27),
// i.e. two VPDPBUSD chains against the SAME weight operand (no other transform), the bias term
// −128·Σq (Q8_0) / −8·Σq (Q4_0) taken once with the q of 16 bits. The combination is the int8
// one: t = (d_w·d_x)·float(isum) (+ m_w·s_x), acc = acc + t — float(isum) may now round (|isum| can
// pass 2^24), identically on both paths (round to nearest even). Same invariances as int8. Where AMX-INT8
// is usable, m >= kAmxMinRowsWide (16) computes the two planes' sums with two TDPBSUD per tile against the same B tiles
// and combines isum = 256·high + low exactly as above (quant_i8_amx.cc): same bits.
// Why (docs/BENCHMARKS.md, "int16 activations"): SmolLM2-135M's goldens drift 2–5 % per layer with
// int8 activations — every projection's 8-bit rounding (~0.6–0.9 % relative per GEMM, uniform over q/k/v,
// o, gate/up, down and the lm_head, not one outlier projection) compounds over 30 layers; 16 bits
// give ~2e-4.
#pragma once
#include <cstdint>

namespace specd {
namespace quant {

enum class Type : int { kQ4_0 = 0, kQ4_1 = 1, kQ8_0 = 2 };

constexpr int64_t kBlock = 32;  // weights per GGUF block (along K)
constexpr int64_t kLanes = 16;  // rows per panel

/** Bytes of one GGUF block of `t` (the raw tensor is n·(k/32) such blocks). */
static inline int64_t RawBlockBytes(Type t) { return t == Type::kQ4_0 ? 18 : t == Type::kQ4_1 ? 20 : 34; }
/** Bytes of the scale part of a panel block: d[16] (+ m[16] for Q4_1), f16. */
static inline int64_t ScaleBytes(Type t) { return t == Type::kQ4_1 ? 64 : 32; }
/** Bytes of the quant part of a panel block. */
static inline int64_t QuantBytes(Type t) { return t == Type::kQ8_0 ? 512 : 256; }
/** Bytes of one panel block (16 rows × 32 weights). */
static inline int64_t PanelBlockBytes(Type t) { return ScaleBytes(t) + QuantBytes(t); }
static inline int64_t Panels(int64_t n) { return (n + kLanes - 1) / kLanes; }
/** Packed bytes of an [n, k] matrix (k a multiple of 32). */
static inline int64_t PackedBytes(Type t, int64_t n, int64_t k) {
  return Panels(n) * (k / kBlock) * PanelBlockBytes(t);
}

/** Exact IEEE binary16 -> binary32 (subnormals, ±Inf, NaN kept). */
static inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    // Subnormal or zero: mant · 2^-24, exact in fp32 (mant < 2^10, power-of-two scale).
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    uint32_t vb;
    __builtin_memcpy(&vb, &v, sizeof vb);
    bits = sign | vb;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

/** One GEMM problem: Y[m, n] (f32, row stride ldy) = X[m, k] (f32, row stride ldx) · W[n, k]^T. */
struct Problem {
  const float* x;
  int64_t ldx;
  const uint8_t* packed;  // see layout above
  float* y;
  int64_t ldy;
  int64_t m, n, k;  // k a multiple of 32
  Type type;
};

/**
 * ParallelFor work units of one panel of an m-row GEMM with depth k (decides only how many threads
 * run a call, never a result): 16·k weights dequantized once per row tile, plus the multiply-adds.
 */
static inline int64_t PanelWork(int64_t m, int64_t k) { return kLanes * k * (1 + m / 8); }

/** Scratch floats a kernel call needs per thread for m rows (accumulators between K chunks). */
static inline int64_t ScratchFloats(int64_t m) { return (m + 8) * 4 * kLanes; }

/** Computes all rows of Y for panels [panel_begin, panel_end); `scratch` holds ScratchFloats(m). */
void PanelsPortable(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch);
void PanelsAvx512(const Problem& p, int64_t panel_begin, int64_t panel_end, float* scratch);

// ---- int8 activations (see the header comment) ----

/**
 * X quantized per 32-block: row r, block b at index r·(k/32) + b; q (and lo) row-major [m, k].
 * int8 mode: q the quants, lo = nullptr. int16 mode: the quant is 256·q + lo (both int8 planes).
 */
struct ActsI8 {
  int8_t* q;
  float* d;      // d_x
  float* s;      // d_x · float(Σq)
  int32_t* sum;  // Σq (of the 16-bit quants in int16 mode)
  int8_t* lo;    // int16 mode: the low plane; nullptr in int8 mode
};

/** Largest |quant| of the int16 mode: 127·256 + 127, so that q = 256·hi + lo with hi, lo int8. */
constexpr int32_t kI16Max = 32639;

/** One int8- (x.lo = nullptr) or int16-activation GEMM: Y[m, n] (f32, row stride ldy) = Q(X)[m, k] · W[n, k]^T. */
struct ProblemI8 {
  ActsI8 x;
  const uint8_t* packed;
  float* y;
  int64_t ldy;
  int64_t m, n, k;
  Type type;
};

/**
 * Quantizes rows [row_begin, row_end) of X [m, k] (row stride ldx) into `out` (same bits on both paths):
 * int8 quants, or with out.lo != nullptr the int16 ones split into out.q (high) and out.lo (low).
 */
void QuantizeActsPortable(const float* x, int64_t ldx, int64_t k, int64_t row_begin, int64_t row_end, ActsI8 out);
void QuantizeActsAvx512(const float* x, int64_t ldx, int64_t k, int64_t row_begin, int64_t row_end, ActsI8 out);

/** All rows of Y for panels [panel_begin, panel_end) (no scratch: the VNNI operands stay in registers). */
void PanelsI8Portable(const ProblemI8& p, int64_t panel_begin, int64_t panel_end);
void PanelsI8Vnni(const ProblemI8& p, int64_t panel_begin, int64_t panel_end);

/**
 * The VNNI operands of blocks [b0, b1) of `panels` (1..4) panels from panel0, into
 * ws + ((blk − b0)·panels + b)·640: 8 × 64 B (16 lanes × 4 consecutive k, u8: Q4 nibbles, Q8_0 + 128)
 * | d[16] f32 | m[16] f32. The 8 × 64 B are also an AMX B tile (8 rows of K/4, 64 B stride).
 */
void TransformPanelsI8(const ProblemI8& p, int64_t panel0, int panels, int64_t b0, int64_t b1, uint8_t* ws);

/** AMX-INT8 path (m >= kAmxMinRows; int16: kAmxMinRowsWide): the same block sums by TDPBSUD, the same bits. */
// From m = 96 on (prefill chunks); below, the VNNI tiles are as fast or faster (1 thread, AMX vs VNNI
// time: m = 16 ×0.7–1.0, m = 64 ×0.85–1.0, m = 128 ×1.1–2.2, m = 512 ×1.6–2.1). Measured against the
// former VNNI scratch tiles; the direct tiles that replaced them (quant_i8_avx512.cc) are ×1.1–1.2 faster
// at m = 65–512 (int8) on Zen 5, which has no AMX: not re-measured on an AMX machine.
constexpr int64_t kAmxMinRows = 96;
/**
 * int16 activations: rows from which the AMX path runs (two TDPBSUD a tile, the high and the low plane, where the
 * VNNI path issues two VPDPBUSD chains a row). The GPU machine's Xeon, 2 threads, SmolLM2's Q4_1 / Q8_0 shapes from
 * DRAM, a forward's GEMMs (30 layers + the lm_head), AMX ÷ VNNI time over two runs: m = 12 ×0.93 / ×1.08,
 * m = 16 ×0.78 (and ×1.15 with one outlier shape), m = 24 ×0.86 / ×0.94, m = 32 ×0.76 / ×0.80, m = 64–512 ×0.73–0.78;
 * below 12 the tiles' fixed work loses (m = 2–8 ×1.1–2.1). docs/BENCHMARKS.md, "int16 activations on AMX tiles". With
 * the kernel pipelined by a block, two starts of the host disagreed: m = 12 ×0.87 on one, VNNI ahead at 12 and even at
 * 14–16 on the other, so 16 stays (docs/BENCHMARKS.md, "The AMX host twice").
 * SPECD_QUANT_AMX_MIN_ROWS_WIDE moves it for A/B runs; the bits are the VNNI path's on real tiles (checked there) and
 * on emulated ones (native/test/amx-emulated.test.ts).
 */
constexpr int64_t kAmxMinRowsWide = 16;
/**
 * Scratch bytes of the AMX path for depth k: all of K transformed for 4 panels, two blocks' int32 sums (int16: of
 * both planes) and the fp32 accumulators.
 */
static inline int64_t ScratchBytesI8Amx(int64_t k) { return (k / kBlock) * 4 * 640 + 5 * 4096 + 64; }
void PanelsI8Amx(const ProblemI8& p, int64_t panel_begin, int64_t panel_end, uint8_t* scratch);

}  // namespace quant
}  // namespace specd
