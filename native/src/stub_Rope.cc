#include "families.h"
namespace specd { void RegisterRope(Napi::Env, Napi::Object) {} }
