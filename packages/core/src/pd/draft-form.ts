/**
 * The form of a request's draft context in a prefill/decode transfer (`pd.draft_context`), chosen by the decode
 * instance per request (it derives the entries it expects, so it decides what P sends):
 * - `'kv'`: the drafter's draft KV pages (a sliding layer only its window's; manifest.ts `DraftContextForm`);
 * - `'features'`: the projected features of the rows D needs, `[rows, hidden]` f32, from which D rebuilds every
 *   draft layer's K/V (plugin/drafter-plugin.ts `DraftContextFeatures`): fewer bytes when the draft layers' K and
 *   V together are wider than one hidden row (DFlash on kimi-k3-tiny: 768 floats of K/V per row against 256),
 *   at the cost of the rebuild's GEMMs on D;
 * - `'auto'`: per request, `'features'` when the bytes it saves take longer to move than the rebuild takes to
 *   compute, both measured on this instance: the transfer rate as bytes / transfer wait of the requests so far
 *   (P's `sending` to the data's arrival, pd/waterfall.ts), the rebuild cost as ms per row of the rebuilds so
 *   far, each an exponential moving average. Until both were measured it picks `'features'` whenever that is
 *   fewer bytes (so that the rebuild gets measured); a form that is not fewer bytes is never picked.
 */

/** `pd.draft_context`. */
export type DraftContextMode = 'kv' | 'features' | 'auto';

/** Weight of a new observation in the moving averages. */
const EWMA = 0.25;

/** A decode instance's per-request choice between draft KV and features (module comment). */
export class DraftFormChooser {
  /** Transfer rate, bytes per ms (undefined until a transfer with a positive wait was observed). */
  private rate: number | undefined;
  /** Rebuild cost, ms per row (undefined until a rebuild of ≥ 1 row was observed). */
  private rowMs: number | undefined;

  constructor(readonly mode: DraftContextMode) {}

  /** What was measured so far (for logs and tests). */
  get measured(): { readonly bytesPerMs?: number; readonly rebuildMsPerRow?: number } {
    return {
      ...(this.rate === undefined ? {} : { bytesPerMs: this.rate }),
      ...(this.rowMs === undefined ? {} : { rebuildMsPerRow: this.rowMs }),
    };
  }

  /**
   * The form for a request whose draft context is `kvBytes` as draft KV, or `featureBytes` as features from which
   * `rebuildRows` rows are rebuilt.
   */
  choose(kvBytes: number, featureBytes: number, rebuildRows: number): 'kv' | 'features' {
    if (this.mode !== 'auto') return this.mode;
    if (!(featureBytes < kvBytes)) return 'kv';
    if (this.rate === undefined || this.rowMs === undefined) return 'features';
    return (kvBytes - featureBytes) / this.rate > rebuildRows * this.rowMs ? 'features' : 'kv';
  }

  /** A transfer of `bytes` took `ms` from P's `sending` to the arrival (ignored when not positive). */
  observeTransfer(bytes: number, ms: number): void {
    if (!(bytes > 0 && ms > 0)) return;
    const r = bytes / ms;
    this.rate = this.rate === undefined ? r : this.rate + EWMA * (r - this.rate);
  }

  /** A rebuild of `rows` rows took `ms` (ignored without rows). */
  observeRebuild(rows: number, ms: number): void {
    if (!(rows > 0 && ms >= 0)) return;
    const c = ms / rows;
    this.rowMs = this.rowMs === undefined ? c : this.rowMs + EWMA * (c - this.rowMs);
  }
}
