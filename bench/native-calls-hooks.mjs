// Module resolution hook (node:module register) for bench/decode-calls.mjs: every import of '@specd/native'
// except the shim's own resolves to bench/native-calls.mjs (calls counted and timed). Bench-only.
const shim = new URL('./native-calls.mjs', import.meta.url).href;

export async function resolve(specifier, context, next) {
  if (specifier === '@specd/native' && context.parentURL !== shim) return { url: shim, shortCircuit: true };
  return next(specifier, context);
}
