#include "families.h"
namespace specd { void RegisterSampling(Napi::Env, Napi::Object) {} }
