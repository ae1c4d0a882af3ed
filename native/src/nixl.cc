// NIXL family: the NVIDIA Inference Xfer Library's C API (libnixl_capi.so), loaded at run time with dlopen so the
// addon neither links nor needs NIXL. The library ships in the PyPI wheel nixl-cu12 (`npm run nixl:fetch` unpacks it
// under .cache/nixl/); the wheel has no C header, so the few prototypes used are declared below, taken from
// ai-dynamo/nixl src/bindings/rust/wrapper.h (the C API the Rust binding uses; same in release 1.5.1).
//
// JS entry points (wrapped by packages/core/src/pd/nixl-transfer.ts; every handle is an opaque External):
//   nixlLoad(capiPath: string) -> undefined            dlopen(RTLD_NOW|RTLD_LOCAL) + dlsym of every function below;
//                                                     throws Error(code ERR_SPECD_NIXL_MISSING) naming dlerror()
//   nixlCreateAgent(name: string, progressDelayUs: 0..1e6) -> agent   nixlAgent; 0: no progress thread (the caller
//                                                     progresses UCX through nixlXferStatus / nixlGetNotifs, all on
//                                                     one thread); else a progress thread that waits for UCX events
//                                                     in poll(), timeout progressDelayUs (ms-rounded)
//   nixlCreateBackend(agent, plugin: string) -> backend   the plugin's default parameters (e.g. "UCX")
//   nixlRegister(agent, backend, bytes: Uint8Array) -> number   registers DRAM [addr, addr + length); returns addr
//   nixlDeregister(agent, backend, addr: number, length: number) -> undefined
//   nixlAddress(bytes: Uint8Array) -> number           the view's first byte's address (x86-64 user space < 2^53)
//   nixlLocalMetadata(agent) -> Buffer                 the agent's metadata (its backends' connection info + keys)
//   nixlLoadRemoteMetadata(agent, md: Uint8Array) -> string   the remote agent's name
//   nixlInvalidateRemote(agent, name: string) -> undefined
//   nixlPostWrite(agent, backend, remote: string, local: Float64Array [2n], remoteDescs: Float64Array [2n],
//                 notif: Uint8Array) -> xfer           [addr, length] pairs; one NIXL WRITE request of n descriptors
//                                                     (its notification delivered after the data); posted
//   nixlXferStatus(agent, xfer) -> number              0 done, 1 in progress, < 0 a nixl_capi_status_t error
//   nixlReleaseXfer(agent, xfer) -> undefined          releases (aborts if still in progress) and frees
//   nixlGetNotifs(agent) -> [agentName: string, msg: Buffer][]   notifications received since the last call
//   nixlDestroyBackend(backend), nixlDestroyAgent(agent) -> undefined
// Errors: Error naming the C API call and its status (e.g. "nixlPostWrite: nixl_capi_post_xfer_req: -2 (backend)").
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "families.h"

namespace specd {
namespace {

// ---- The C API subset (wrapper.h of ai-dynamo/nixl) ----
using Status = int;  // nixl_capi_status_t: 0 success, 1 in progress, negative errors
using Handle = void*;
constexpr int kMemDram = 0;    // NIXL_CAPI_MEM_DRAM
constexpr int kXferWrite = 1;  // NIXL_CAPI_XFER_OP_WRITE

// nixl_capi_agent_config_t (unchanged since the C API gained it, ai-dynamo/nixl #824, through 1.5.1)
struct AgentConfig {
  bool enable_prog_thread;
  bool enable_listen_thread;
  int listen_port;
  int thread_sync;  // nixl_capi_thread_sync_t: 0 = NIXL_CAPI_THREAD_SYNC_DEFAULT
  unsigned int num_workers;
  uint64_t pthr_delay_us;
  uint64_t lthr_delay_us;
  bool capture_telemetry;
};

struct Api {
  Status (*create_configured_agent)(const char*, const AgentConfig*, Handle*);
  Status (*destroy_agent)(Handle);
  Status (*get_plugin_params)(Handle, const char*, Handle*, Handle*);
  Status (*destroy_mem_list)(Handle);
  Status (*destroy_params)(Handle);
  Status (*create_backend)(Handle, const char*, Handle, Handle*);
  Status (*destroy_backend)(Handle);
  Status (*create_opt_args)(Handle*);
  Status (*destroy_opt_args)(Handle);
  Status (*opt_args_add_backend)(Handle, Handle);
  Status (*opt_args_set_notif_msg)(Handle, const void*, size_t);
  Status (*opt_args_set_has_notif)(Handle, bool);
  Status (*create_reg_dlist)(int, Handle*);
  Status (*destroy_reg_dlist)(Handle);
  Status (*reg_dlist_add_desc)(Handle, uintptr_t, size_t, uint64_t, const void*, size_t);
  Status (*register_mem)(Handle, Handle, Handle);
  Status (*deregister_mem)(Handle, Handle, Handle);
  Status (*get_local_md)(Handle, void**, size_t*);
  Status (*load_remote_md)(Handle, const void*, size_t, char**);
  Status (*invalidate_remote_md)(Handle, const char*);
  Status (*create_xfer_dlist)(int, Handle*);
  Status (*destroy_xfer_dlist)(Handle);
  Status (*xfer_dlist_add_desc)(Handle, uintptr_t, size_t, uint64_t);
  Status (*create_xfer_req)(Handle, int, Handle, Handle, const char*, Handle*, Handle);
  Status (*post_xfer_req)(Handle, Handle, Handle);
  Status (*get_xfer_status)(Handle, Handle);
  Status (*release_xfer_req)(Handle, Handle);
  Status (*destroy_xfer_req)(Handle);
  Status (*create_notif_map)(Handle*);
  Status (*destroy_notif_map)(Handle);
  Status (*get_notifs)(Handle, Handle, Handle);
  Status (*notif_map_size)(Handle, size_t*);
  Status (*notif_map_get_agent_at)(Handle, size_t, const char**);
  Status (*notif_map_get_notifs_size)(Handle, const char*, size_t*);
  Status (*notif_map_get_notif)(Handle, const char*, size_t, const void**, size_t*);
};

Api g_api;
void* g_lib = nullptr;

const char* StatusName(Status s) {
  switch (s) {
    case 0: return "success";
    case 1: return "in progress";
    case -1: return "invalid parameter";
    case -2: return "backend";
    case -3: return "invalid state";
    case -4: return "exception";
    case -5: return "no telemetry";
    case -6: return "not found";
    default: return "unknown";
  }
}

[[noreturn]] void Fail(Napi::Env env, const char* fn, const char* call, Status s) {
  throw Napi::Error::New(env, std::string(fn) + ": " + call + ": " + std::to_string(s) + " (" + StatusName(s) + ")");
}

void Check(Napi::Env env, const char* fn, const char* call, Status s) {
  if (s != 0) Fail(env, fn, call, s);
}

void RequireLoaded(Napi::Env env, const char* fn) {
  if (g_lib == nullptr)
    throw Napi::Error::New(env, std::string(fn) + ": the NIXL library is not loaded (call nixlLoad first)");
}

/** A Uint8Array argument (any length). */
Napi::Uint8Array BytesArg(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name) {
  if (info.Length() <= i || !info[i].IsTypedArray() ||
      info[i].As<Napi::TypedArray>().TypedArrayType() != napi_uint8_array)
    throw Napi::TypeError::New(info.Env(), std::string(fn) + ": " + name + ": expected a Uint8Array");
  return info[i].As<Napi::Uint8Array>();
}

Handle HandleArg(const Napi::CallbackInfo& info, size_t i, const char* fn, const char* name) {
  if (info.Length() <= i || !info[i].IsExternal())
    throw Napi::TypeError::New(info.Env(), std::string(fn) + ": " + name + ": expected a NIXL handle");
  return info[i].As<Napi::External<void>>().Data();
}

/** Frees an opt_args handle on every exit path. */
struct OptArgs {
  Handle h = nullptr;
  ~OptArgs() {
    if (h != nullptr) g_api.destroy_opt_args(h);
  }
};

template <typename F>
bool Sym(void* lib, const char* name, F* out, std::string* missing) {
  void* p = dlsym(lib, name);
  if (p == nullptr) {
    *missing += (missing->empty() ? "" : ", ") + std::string(name);
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

Napi::Value LoadBinding(const Napi::CallbackInfo& info) {
  ArgReader args(info, "nixlLoad");
  const std::string path = args.String(0, "capiPath");
  if (g_lib != nullptr) return info.Env().Undefined();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    Napi::Error e = Napi::Error::New(info.Env(), "nixlLoad: cannot load " + path + ": " + (why ? why : "unknown"));
    e.Set("code", "ERR_SPECD_NIXL_MISSING");
    throw e;
  }
  Api a{};
  std::string missing;
#define SPECD_NIXL_SYM(field) Sym(lib, "nixl_capi_" #field, &a.field, &missing)
  SPECD_NIXL_SYM(create_configured_agent);
  SPECD_NIXL_SYM(destroy_agent);
  SPECD_NIXL_SYM(get_plugin_params);
  SPECD_NIXL_SYM(destroy_mem_list);
  SPECD_NIXL_SYM(destroy_params);
  SPECD_NIXL_SYM(create_backend);
  SPECD_NIXL_SYM(destroy_backend);
  SPECD_NIXL_SYM(create_opt_args);
  SPECD_NIXL_SYM(destroy_opt_args);
  SPECD_NIXL_SYM(opt_args_add_backend);
  SPECD_NIXL_SYM(opt_args_set_notif_msg);
  SPECD_NIXL_SYM(opt_args_set_has_notif);
  SPECD_NIXL_SYM(create_reg_dlist);
  SPECD_NIXL_SYM(destroy_reg_dlist);
  SPECD_NIXL_SYM(reg_dlist_add_desc);
  SPECD_NIXL_SYM(register_mem);
  SPECD_NIXL_SYM(deregister_mem);
  SPECD_NIXL_SYM(get_local_md);
  SPECD_NIXL_SYM(load_remote_md);
  SPECD_NIXL_SYM(invalidate_remote_md);
  SPECD_NIXL_SYM(create_xfer_dlist);
  SPECD_NIXL_SYM(destroy_xfer_dlist);
  SPECD_NIXL_SYM(xfer_dlist_add_desc);
  SPECD_NIXL_SYM(create_xfer_req);
  SPECD_NIXL_SYM(post_xfer_req);
  SPECD_NIXL_SYM(get_xfer_status);
  SPECD_NIXL_SYM(release_xfer_req);
  SPECD_NIXL_SYM(destroy_xfer_req);
  SPECD_NIXL_SYM(create_notif_map);
  SPECD_NIXL_SYM(destroy_notif_map);
  SPECD_NIXL_SYM(get_notifs);
  SPECD_NIXL_SYM(notif_map_size);
  SPECD_NIXL_SYM(notif_map_get_agent_at);
  SPECD_NIXL_SYM(notif_map_get_notifs_size);
  SPECD_NIXL_SYM(notif_map_get_notif);
#undef SPECD_NIXL_SYM
  if (!missing.empty()) {
    dlclose(lib);
    throw Napi::Error::New(info.Env(), "nixlLoad: " + path + " lacks the C API functions " + missing);
  }
  g_api = a;
  g_lib = lib;
  return info.Env().Undefined();
}

Napi::Value CreateAgentBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlCreateAgent");
  ArgReader args(info, "nixlCreateAgent");
  const std::string name = args.String(0, "name");
  const int64_t delay_us = args.Int(1, "progressDelayUs", 0, 1000000);
  // delay_us > 0: a progress thread (so UCX moves bytes without the event loop) that sleeps in poll() on the workers'
  // event fds with a timeout of delay_us rounded up to ms (the C API's default delay, 0, makes that poll() spin a
  // core). delay_us == 0: no progress thread; UCX then runs only inside the caller's NIXL calls.
  const AgentConfig cfg{delay_us > 0, false, 0, 0, 1, static_cast<uint64_t>(delay_us), 100000, false};
  Handle agent = nullptr;
  Check(info.Env(), "nixlCreateAgent", "nixl_capi_create_configured_agent",
        g_api.create_configured_agent(name.c_str(), &cfg, &agent));
  return Napi::External<void>::New(info.Env(), agent);
}

Napi::Value CreateBackendBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlCreateBackend");
  Handle agent = HandleArg(info, 0, "nixlCreateBackend", "agent");
  ArgReader args(info, "nixlCreateBackend");
  const std::string plugin = args.String(1, "plugin");
  Handle mems = nullptr, params = nullptr, backend = nullptr;
  Check(info.Env(), "nixlCreateBackend", "nixl_capi_get_plugin_params",
        g_api.get_plugin_params(agent, plugin.c_str(), &mems, &params));
  const Status s = g_api.create_backend(agent, plugin.c_str(), params, &backend);
  g_api.destroy_mem_list(mems);
  g_api.destroy_params(params);
  Check(info.Env(), "nixlCreateBackend", "nixl_capi_create_backend", s);
  return Napi::External<void>::New(info.Env(), backend);
}

Napi::Value AddressBinding(const Napi::CallbackInfo& info) {
  auto bytes = BytesArg(info, 0, "nixlAddress", "bytes");
  return Napi::Number::New(info.Env(), static_cast<double>(reinterpret_cast<uintptr_t>(bytes.Data())));
}

/** Registers (register = true) or deregisters DRAM [addr, addr + length) with the agent's backend. */
void RegisterRange(Napi::Env env, const char* fn, Handle agent, Handle backend, uintptr_t addr, size_t length,
                   bool reg) {
  Handle dlist = nullptr;
  Check(env, fn, "nixl_capi_create_reg_dlist", g_api.create_reg_dlist(kMemDram, &dlist));
  OptArgs opt;
  Status s = g_api.reg_dlist_add_desc(dlist, addr, length, 0, nullptr, 0);
  if (s == 0) s = g_api.create_opt_args(&opt.h);
  if (s == 0) s = g_api.opt_args_add_backend(opt.h, backend);
  const Status r = s != 0 ? s
                   : reg  ? g_api.register_mem(agent, dlist, opt.h)
                          : g_api.deregister_mem(agent, dlist, opt.h);
  g_api.destroy_reg_dlist(dlist);
  Check(env, fn, reg ? "nixl_capi_register_mem" : "nixl_capi_deregister_mem", r);
}

Napi::Value RegisterBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlRegister");
  Handle agent = HandleArg(info, 0, "nixlRegister", "agent");
  Handle backend = HandleArg(info, 1, "nixlRegister", "backend");
  ArgReader args(info, "nixlRegister");
  auto bytes = BytesArg(info, 2, "nixlRegister", "bytes");
  const uintptr_t addr = reinterpret_cast<uintptr_t>(bytes.Data());
  RegisterRange(info.Env(), "nixlRegister", agent, backend, addr, bytes.ElementLength(), true);
  return Napi::Number::New(info.Env(), static_cast<double>(addr));
}

Napi::Value DeregisterBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlDeregister");
  Handle agent = HandleArg(info, 0, "nixlDeregister", "agent");
  Handle backend = HandleArg(info, 1, "nixlDeregister", "backend");
  ArgReader args(info, "nixlDeregister");
  const int64_t addr = args.Int(2, "addr", 0, int64_t{1} << 53);
  const int64_t length = args.Int(3, "length", 0, int64_t{1} << 53);
  RegisterRange(info.Env(), "nixlDeregister", agent, backend, static_cast<uintptr_t>(addr), static_cast<size_t>(length),
                false);
  return info.Env().Undefined();
}

Napi::Value LocalMetadataBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlLocalMetadata");
  Handle agent = HandleArg(info, 0, "nixlLocalMetadata", "agent");
  void* data = nullptr;
  size_t len = 0;
  Check(info.Env(), "nixlLocalMetadata", "nixl_capi_get_local_md", g_api.get_local_md(agent, &data, &len));
  Napi::Buffer<uint8_t> out = Napi::Buffer<uint8_t>::Copy(info.Env(), static_cast<const uint8_t*>(data), len);
  free(data);  // the C API hands over a malloc'ed copy
  return out;
}

Napi::Value LoadRemoteMetadataBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlLoadRemoteMetadata");
  Handle agent = HandleArg(info, 0, "nixlLoadRemoteMetadata", "agent");
  ArgReader args(info, "nixlLoadRemoteMetadata");
  auto md = BytesArg(info, 1, "nixlLoadRemoteMetadata", "md");
  char* name = nullptr;
  Check(info.Env(), "nixlLoadRemoteMetadata", "nixl_capi_load_remote_md",
        g_api.load_remote_md(agent, md.Data(), md.ElementLength(), &name));
  std::string out = name != nullptr ? name : "";
  free(name);
  return Napi::String::New(info.Env(), out);
}

Napi::Value InvalidateRemoteBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlInvalidateRemote");
  Handle agent = HandleArg(info, 0, "nixlInvalidateRemote", "agent");
  ArgReader args(info, "nixlInvalidateRemote");
  const std::string name = args.String(1, "name");
  Check(info.Env(), "nixlInvalidateRemote", "nixl_capi_invalidate_remote_md",
        g_api.invalidate_remote_md(agent, name.c_str()));
  return info.Env().Undefined();
}

/** Builds a DRAM xfer descriptor list from [addr, length] pairs. */
Handle XferList(Napi::Env env, const Napi::Float64Array& pairs) {
  Handle dlist = nullptr;
  Check(env, "nixlPostWrite", "nixl_capi_create_xfer_dlist", g_api.create_xfer_dlist(kMemDram, &dlist));
  for (size_t i = 0; i + 1 < pairs.ElementLength(); i += 2) {
    const Status s =
        g_api.xfer_dlist_add_desc(dlist, static_cast<uintptr_t>(pairs[i]), static_cast<size_t>(pairs[i + 1]), 0);
    if (s != 0) {
      g_api.destroy_xfer_dlist(dlist);
      Fail(env, "nixlPostWrite", "nixl_capi_xfer_dlist_add_desc", s);
    }
  }
  return dlist;
}

Napi::Value PostWriteBinding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "nixlPostWrite");
  Handle agent = HandleArg(info, 0, "nixlPostWrite", "agent");
  Handle backend = HandleArg(info, 1, "nixlPostWrite", "backend");
  ArgReader args(info, "nixlPostWrite");
  const std::string remote = args.String(2, "remote");
  if (info.Length() < 6 || !info[3].IsTypedArray() || !info[4].IsTypedArray() ||
      info[3].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array ||
      info[4].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array)
    throw Napi::TypeError::New(env, "nixlPostWrite: local, remoteDescs: expected Float64Array [addr, length] pairs");
  Napi::Float64Array local = info[3].As<Napi::Float64Array>();
  Napi::Float64Array far = info[4].As<Napi::Float64Array>();
  if (local.ElementLength() != far.ElementLength() || local.ElementLength() % 2 != 0)
    throw Napi::RangeError::New(env, "nixlPostWrite: local and remoteDescs must be equal lists of [addr, length]");
  auto notif = BytesArg(info, 5, "nixlPostWrite", "notif");
  Handle l = XferList(env, local);
  Handle r = nullptr;
  try {
    r = XferList(env, far);
  } catch (...) {
    g_api.destroy_xfer_dlist(l);
    throw;
  }
  OptArgs opt;
  Status s = g_api.create_opt_args(&opt.h);
  if (s == 0) s = g_api.opt_args_add_backend(opt.h, backend);
  if (s == 0) s = g_api.opt_args_set_notif_msg(opt.h, notif.Data(), notif.ElementLength());
  if (s == 0) s = g_api.opt_args_set_has_notif(opt.h, true);
  Handle req = nullptr;
  const char* call = "nixl_capi_create_opt_args";
  if (s == 0) {
    call = "nixl_capi_create_xfer_req";
    s = g_api.create_xfer_req(agent, kXferWrite, l, r, remote.c_str(), &req, opt.h);
  }
  g_api.destroy_xfer_dlist(l);
  g_api.destroy_xfer_dlist(r);
  if (s != 0) Fail(env, "nixlPostWrite", call, s);
  s = g_api.post_xfer_req(agent, req, nullptr);
  if (s < 0) {
    if (g_api.release_xfer_req(agent, req) == 0) g_api.destroy_xfer_req(req);
    Fail(env, "nixlPostWrite", "nixl_capi_post_xfer_req", s);
  }
  return Napi::External<void>::New(env, req);
}

Napi::Value XferStatusBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlXferStatus");
  Handle agent = HandleArg(info, 0, "nixlXferStatus", "agent");
  Handle req = HandleArg(info, 1, "nixlXferStatus", "xfer");
  return Napi::Number::New(info.Env(), g_api.get_xfer_status(agent, req));
}

Napi::Value ReleaseXferBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlReleaseXfer");
  Handle agent = HandleArg(info, 0, "nixlReleaseXfer", "agent");
  Handle req = HandleArg(info, 1, "nixlReleaseXfer", "xfer");
  const Status s = g_api.release_xfer_req(agent, req);
  if (s == 0) g_api.destroy_xfer_req(req);  // on failure the request is still NIXL's (destroy would refuse)
  Check(info.Env(), "nixlReleaseXfer", "nixl_capi_release_xfer_req", s);
  return info.Env().Undefined();
}

Napi::Value GetNotifsBinding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  RequireLoaded(env, "nixlGetNotifs");
  Handle agent = HandleArg(info, 0, "nixlGetNotifs", "agent");
  Handle map = nullptr;
  Check(env, "nixlGetNotifs", "nixl_capi_create_notif_map", g_api.create_notif_map(&map));
  Napi::Array out = Napi::Array::New(env);
  Status s = g_api.get_notifs(agent, map, nullptr);
  size_t agents = 0;
  if (s == 0) s = g_api.notif_map_size(map, &agents);
  uint32_t k = 0;
  for (size_t a = 0; s == 0 && a < agents; a++) {
    const char* name = nullptr;
    size_t n = 0;
    s = g_api.notif_map_get_agent_at(map, a, &name);
    if (s == 0) s = g_api.notif_map_get_notifs_size(map, name, &n);
    for (size_t i = 0; s == 0 && i < n; i++) {
      const void* data = nullptr;
      size_t len = 0;
      s = g_api.notif_map_get_notif(map, name, i, &data, &len);
      if (s != 0) break;
      Napi::Array pair = Napi::Array::New(env, 2);
      pair.Set(0u, Napi::String::New(env, name));
      pair.Set(1u, Napi::Buffer<uint8_t>::Copy(env, static_cast<const uint8_t*>(data), len));
      out.Set(k++, pair);
    }
  }
  g_api.destroy_notif_map(map);
  Check(env, "nixlGetNotifs", "nixl_capi_get_notifs", s);
  return out;
}

Napi::Value DestroyBackendBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlDestroyBackend");
  Check(info.Env(), "nixlDestroyBackend", "nixl_capi_destroy_backend",
        g_api.destroy_backend(HandleArg(info, 0, "nixlDestroyBackend", "backend")));
  return info.Env().Undefined();
}

Napi::Value DestroyAgentBinding(const Napi::CallbackInfo& info) {
  RequireLoaded(info.Env(), "nixlDestroyAgent");
  Check(info.Env(), "nixlDestroyAgent", "nixl_capi_destroy_agent",
        g_api.destroy_agent(HandleArg(info, 0, "nixlDestroyAgent", "agent")));
  return info.Env().Undefined();
}

}  // namespace

void RegisterNixl(Napi::Env env, Napi::Object exports) {
  exports.Set("nixlLoad", Napi::Function::New(env, Guarded<LoadBinding>, "nixlLoad"));
  exports.Set("nixlCreateAgent", Napi::Function::New(env, Guarded<CreateAgentBinding>, "nixlCreateAgent"));
  exports.Set("nixlCreateBackend", Napi::Function::New(env, Guarded<CreateBackendBinding>, "nixlCreateBackend"));
  exports.Set("nixlAddress", Napi::Function::New(env, Guarded<AddressBinding>, "nixlAddress"));
  exports.Set("nixlRegister", Napi::Function::New(env, Guarded<RegisterBinding>, "nixlRegister"));
  exports.Set("nixlDeregister", Napi::Function::New(env, Guarded<DeregisterBinding>, "nixlDeregister"));
  exports.Set("nixlLocalMetadata", Napi::Function::New(env, Guarded<LocalMetadataBinding>, "nixlLocalMetadata"));
  exports.Set("nixlLoadRemoteMetadata",
              Napi::Function::New(env, Guarded<LoadRemoteMetadataBinding>, "nixlLoadRemoteMetadata"));
  exports.Set("nixlInvalidateRemote",
              Napi::Function::New(env, Guarded<InvalidateRemoteBinding>, "nixlInvalidateRemote"));
  exports.Set("nixlPostWrite", Napi::Function::New(env, Guarded<PostWriteBinding>, "nixlPostWrite"));
  exports.Set("nixlXferStatus", Napi::Function::New(env, Guarded<XferStatusBinding>, "nixlXferStatus"));
  exports.Set("nixlReleaseXfer", Napi::Function::New(env, Guarded<ReleaseXferBinding>, "nixlReleaseXfer"));
  exports.Set("nixlGetNotifs", Napi::Function::New(env, Guarded<GetNotifsBinding>, "nixlGetNotifs"));
  exports.Set("nixlDestroyBackend", Napi::Function::New(env, Guarded<DestroyBackendBinding>, "nixlDestroyBackend"));
  exports.Set("nixlDestroyAgent", Napi::Function::New(env, Guarded<DestroyAgentBinding>, "nixlDestroyAgent"));
}

}  // namespace specd
