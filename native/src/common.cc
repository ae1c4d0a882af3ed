// Argument readers and error construction (see common.h).
#include "common.h"

#include <cmath>

namespace specd {

Napi::Error MakeError(Napi::Env env, ErrorKind kind, const std::string& code, const std::string& message) {
  Napi::Error error;
  switch (kind) {
    case ErrorKind::kTypeError: error = Napi::TypeError::New(env, message); break;
    case ErrorKind::kRangeError: error = Napi::RangeError::New(env, message); break;
    default: error = Napi::Error::New(env, message); break;
  }
  error.Set("code", Napi::String::New(env, code));
  return error;
}

namespace {

std::string Describe(const Napi::Value& v) {
  if (v.IsUndefined()) return "undefined";
  if (v.IsNull()) return "null";
  if (v.IsTypedArray()) {
    Napi::TypedArray t = v.As<Napi::TypedArray>();
    const char* names[] = {"Int8Array",    "Uint8Array",    "Uint8ClampedArray", "Int16Array",
                           "Uint16Array",  "Int32Array",    "Uint32Array",       "Float32Array",
                           "Float64Array", "BigInt64Array", "BigUint64Array"};
    const int type = static_cast<int>(t.TypedArrayType());
    const char* name = (type >= 0 && type < 11) ? names[type] : "TypedArray";
    return std::string(name) + " of length " + std::to_string(t.ElementLength());
  }
  if (v.IsNumber()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v.As<Napi::Number>().DoubleValue());
    return buf;
  }
  if (v.IsString()) return "string \"" + v.As<Napi::String>().Utf8Value() + "\"";
  if (v.IsArray()) return "Array";
  if (v.IsBoolean()) return "boolean";
  if (v.IsFunction()) return "function";
  return "object";
}

}  // namespace

void ArgReader::Fail(const char* name, const std::string& expected, const std::string& got) const {
  throw MakeError(info_.Env(), ErrorKind::kRangeError, "ERR_SPECD_INVALID_ARG",
                  std::string(call_) + ": " + name + ": expected " + expected + ", got " + got);
}

Napi::TypedArray ArgReader::Typed(size_t i, const char* name, napi_typedarray_type type, const char* type_name,
                                  size_t length, const char* what) {
  Napi::Value v = i < info_.Length() ? info_[i] : info_.Env().Undefined();
  std::string expected = type_name;
  if (length != kAnyLength) {
    expected += " of length " + std::to_string(length);
    if (what && *what) expected += std::string(" (") + what + ")";
  }
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != type) {
    throw MakeError(info_.Env(), ErrorKind::kTypeError, "ERR_SPECD_INVALID_ARG",
                    std::string(call_) + ": " + name + ": expected " + expected + ", got " + Describe(v));
  }
  Napi::TypedArray t = v.As<Napi::TypedArray>();
  if (length != kAnyLength && t.ElementLength() != length) Fail(name, expected, Describe(v));
  return t;
}

Napi::Float32Array ArgReader::F32(size_t i, const char* name, size_t length, const char* what) {
  return Typed(i, name, napi_float32_array, "Float32Array", length, what).As<Napi::Float32Array>();
}
Napi::Uint16Array ArgReader::U16(size_t i, const char* name, size_t length, const char* what) {
  return Typed(i, name, napi_uint16_array, "Uint16Array", length, what).As<Napi::Uint16Array>();
}
Napi::Int32Array ArgReader::I32(size_t i, const char* name, size_t length, const char* what) {
  return Typed(i, name, napi_int32_array, "Int32Array", length, what).As<Napi::Int32Array>();
}

int64_t ArgReader::Int(size_t i, const char* name, int64_t min, int64_t max) {
  Napi::Value v = i < info_.Length() ? info_[i] : info_.Env().Undefined();
  const std::string expected = "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (!v.IsNumber()) Fail(name, expected, Describe(v));
  const double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || std::floor(d) != d || d < static_cast<double>(min) || d > static_cast<double>(max)) {
    Fail(name, expected, Describe(v));
  }
  return static_cast<int64_t>(d);
}

double ArgReader::Number(size_t i, const char* name) {
  Napi::Value v = i < info_.Length() ? info_[i] : info_.Env().Undefined();
  if (!v.IsNumber() || !std::isfinite(v.As<Napi::Number>().DoubleValue())) Fail(name, "a finite number", Describe(v));
  return v.As<Napi::Number>().DoubleValue();
}

std::string ArgReader::String(size_t i, const char* name) {
  Napi::Value v = i < info_.Length() ? info_[i] : info_.Env().Undefined();
  if (!v.IsString()) Fail(name, "a string", Describe(v));
  return v.As<Napi::String>().Utf8Value();
}

bool ArgReader::Bool(size_t i, const char* name) {
  Napi::Value v = i < info_.Length() ? info_[i] : info_.Env().Undefined();
  if (!v.IsBoolean()) Fail(name, "a boolean", Describe(v));
  return v.As<Napi::Boolean>().Value();
}

size_t CheckedProduct(const char* call, std::initializer_list<int64_t> dims) {
  unsigned __int128 p = 1;
  for (int64_t d : dims) {
    if (d < 0) throw KernelError(std::string(call) + ": negative dimension");
    p *= static_cast<unsigned __int128>(d);
    if (p > (static_cast<unsigned __int128>(1) << 48)) throw KernelError(std::string(call) + ": tensor too large");
  }
  return static_cast<size_t>(p);
}

namespace {

class KernelWorker : public Napi::AsyncWorker {
 public:
  KernelWorker(Napi::Env env, const char* call, std::function<void()> fn, std::vector<Napi::Object> keep)
      : Napi::AsyncWorker(env, call), deferred_(Napi::Promise::Deferred::New(env)), call_(call), fn_(std::move(fn)) {
    for (auto& o : keep) refs_.push_back(Napi::Persistent(o));
  }
  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    try {
      fn_();
    } catch (const std::exception& e) {
      SetError(call_ + ": " + e.what());
    }
  }
  void OnOK() override { deferred_.Resolve(Env().Undefined()); }
  void OnError(const Napi::Error& e) override {
    deferred_.Reject(MakeError(Env(), ErrorKind::kError, "ERR_SPECD_KERNEL", e.Message()).Value());
  }

 private:
  Napi::Promise::Deferred deferred_;
  std::string call_;
  std::function<void()> fn_;
  std::vector<Napi::ObjectReference> refs_;
};

}  // namespace

Napi::Promise QueueKernel(Napi::Env env, const char* call, std::function<void()> fn, std::vector<Napi::Object> keep) {
  auto* worker = new KernelWorker(env, call, std::move(fn), std::move(keep));  // deletes itself when settled
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

}  // namespace specd
