// Module resolution hook (node:module register) for bench/decode.mjs's profile: every import of
// '@specd/native' except the timing shim's own resolves to bench/native-timing.mjs, which
// re-exports the addon facade with the kernel calls wrapped by timers. Bench-only; the packages
// are not modified.
const shim = new URL('./native-timing.mjs', import.meta.url).href;

export async function resolve(specifier, context, next) {
  if (specifier === '@specd/native' && context.parentURL !== shim) return { url: shim, shortCircuit: true };
  return next(specifier, context);
}
