// Kernel families: one Register<Family>() per src/<family>.cc, called once by binding.cc.
//
// ---- How to add a family (e.g. attention.cc, mla.cc, kda.cc, moe.cc) ------------------------
// 1. Create src/<family>.cc. CMake globs src/*.cc, nothing to edit there.
// 2. In it, write bindings `Napi::Value FooBinding(const Napi::CallbackInfo& info)` that:
//    - read every argument through specd::ArgReader (common.h), which validates type, length and
//      range and throws a JS error "foo: <param>: expected ..., got ..." (never abort/exit);
//    - get tensors as views WITHOUT copies: `auto x = args.F32(0, "x", m * k, "m*k");` then
//      `float* px = x.Data();` points into the caller's ArrayBuffer (bf16 = args.U16, ints = args.I32);
//    - compute sizes with CheckedProduct() (overflow-safe) before comparing lengths;
//    - parallelise with specd::ParallelFor(n, [&](int64_t b, int64_t e){...}) (threadpool.h),
//      partitioning over independent outputs only, so results do not depend on the thread count.
// 3. Register them: `void RegisterFoo(Napi::Env env, Napi::Object exports)` doing
//      exports.Set("foo", Napi::Function::New(env, Guarded<FooBinding>, "foo"));
//    (Guarded<> turns any C++ exception into a JS error instead of std::terminate), declare it
//    below and add one line to binding.cc.
// 4. Long-running calls: also export an async variant returning a Promise; copy GemmWorker in
//    gemm.cc (validate + take pointers on the JS thread, Persistent references keep the typed
//    arrays alive, Execute() on a libuv thread touches no napi, OnOK/OnError settle the Promise).
// 5. ISA dispatch: put AVX-512 code in src/<family>_avx512.cc (CMake gives it the AVX-512 flags;
//    src/<family>_amx.cc additionally gets AMX), intrinsics and plain headers only (no STL/napi:
//    ODR, see CMakeLists.txt; helpers in shared headers must be `static inline`), declare its
//    entry points in a small <family>_kernels.h (see gemm_kernels.h), and pick it at run time with
//    `#if defined(SPECD_HAVE_AVX512_BUILD)` + `if (CurrentIsa() == Isa::kAvx512)` (isa.h; AMX also
//    needs AmxAvailable()); always keep a portable implementation, used when SPECD_ISA=portable or
//    the CPU lacks AVX-512. Keep every output's reduction order independent of the batch size, the
//    row's position and the thread count (batch invariance; see gemm_kernels.h) and test it bitwise.
// 6. Declare the new functions in RawAddon (native/src/addon.ts, the only module that loads the
//    addon), wrap them in native/src/<family>.ts (typed, validated via validate.ts), add the
//    wrappers to KernelBackend (backend.ts) and cpuBackend (cpu-backend.ts), and re-export them
//    from native/index.ts.
// 7. Tests: native/test/<family>.test.ts against a float64 TS reference, both ISA paths.
#pragma once
#include <napi.h>

namespace specd {

void RegisterRuntime(Napi::Env env, Napi::Object exports);     // runtime.cc: isa, threads, copy
void RegisterConvert(Napi::Env env, Napi::Object exports);     // convert.cc: bf16 <-> f32
void RegisterGemm(Napi::Env env, Napi::Object exports);        // gemm.cc: packing, GEMM/GEMV
void RegisterNorm(Napi::Env env, Napi::Object exports);        // norm.cc: RMSNorm (+gated)
void RegisterRope(Napi::Env env, Napi::Object exports);        // rope.cc: rotary embeddings
void RegisterActivation(Napi::Env env, Napi::Object exports);  // activation.cc: SiLU, SwiGLU
void RegisterSampling(Napi::Env env, Napi::Object exports);    // sampling.cc: softmax, argmax, top-k/p
void RegisterKda(Napi::Env env, Napi::Object exports);         // kda.cc: KDA conv + gated delta rule
void RegisterMoe(Napi::Env env, Napi::Object exports);         // moe.cc: MoE router, grouped experts
void RegisterAttention(Napi::Env env, Napi::Object exports);   // attention.cc: paged GQA attention, page writes/copies
void RegisterMla(Napi::Env env, Napi::Object exports);         // mla.cc: absorbed MLA over a paged latent cache
void RegisterQuant(Napi::Env env, Napi::Object exports);       // quant.cc: GGUF Q4_0/Q4_1/Q8_0 GEMM, dequant to bf16
void RegisterNixl(Napi::Env env, Napi::Object exports);        // nixl.cc: NIXL C API, loaded with dlopen (PD transfers)

}  // namespace specd
