/**
 * Scratch buffers of a stage's forward (kimi-k3's stage, the Llama stage, the drafters' dense blocks): the
 * intermediates that never leave it (projections, norms, the mixer's and ffn's outputs before the residual add)
 * are written into buffers the stage keeps from one forward to the next instead of fresh arrays each call (a
 * decode or verify step makes hundreds of small arrays; their allocation, zero-fill and collection cost about as
 * much as the small kernels themselves on a tiny model).
 */

/**
 * `(name, n)` → a Float32Array of exactly `n` elements, NOT zeroed (the caller overwrites every element). The same
 * name returns the same memory on every call, so a buffer is dead once its name is asked for again; use one name
 * per live intermediate. Never return one to a caller that keeps it.
 */
export type Scratch = (name: string, n: number) => Float32Array;

/** A {@link Scratch} that allocates a fresh zeroed array each call (the behaviour without a stage's scratch). */
export const freshScratch: Scratch = (_name, n) => new Float32Array(n);

/** Buffers of more elements are not kept (a long prefill chunk of a large model: allocated per call instead). */
const MAX_KEPT = 1 << 22;

/**
 * A {@link Scratch} keeping one buffer per name, grown to the largest size asked for (up to {@link MAX_KEPT}
 * elements, 16 MiB: a 512-token prefill chunk of SmolLM2 keeps ~17 MiB in all; larger requests get a fresh array).
 */
export function keptScratch(): Scratch {
  const bufs = new Map<string, Float32Array>();
  const views = new Map<string, Float32Array>();
  return (name, n) => {
    if (n > MAX_KEPT) return new Float32Array(n);
    const view = views.get(name);
    if (view !== undefined && view.length === n) return view;
    let buf = bufs.get(name);
    if (buf === undefined || buf.length < n) {
      buf = new Float32Array(n);
      bufs.set(name, buf);
    }
    const v = buf.length === n ? buf : buf.subarray(0, n);
    views.set(name, v);
    return v;
  };
}
