// Module entry point: one Register<Family>() per kernel family (see families.h for the pattern).
#include <napi.h>

#include "common.h"
#include "families.h"

namespace specd {

namespace {

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  try {
    RegisterRuntime(env, exports);  // first: applies SPECD_ISA / SPECD_NUM_THREADS
    RegisterConvert(env, exports);
    RegisterGemm(env, exports);
    RegisterNorm(env, exports);
    RegisterRope(env, exports);
    RegisterActivation(env, exports);
    RegisterSampling(env, exports);
    RegisterKda(env, exports);
    RegisterMoe(env, exports);
    RegisterAttention(env, exports);
    RegisterMla(env, exports);
    RegisterQuant(env, exports);
    RegisterNixl(env, exports);
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw MakeError(env, ErrorKind::kError, "ERR_SPECD_INIT", e.what());
  }
  return exports;
}

}  // namespace
}  // namespace specd

static Napi::Object InitSpecdNative(Napi::Env env, Napi::Object exports) { return specd::Init(env, exports); }

NODE_API_MODULE(specd_native, InitSpecdNative)
