/**
 * Checkpoint sanity at load: what a checkpoint may hold that the format check (safetensors.ts) lets
 * through but that would make the model silently wrong — non-finite weights, a tensor present but
 * never read, and the loaders' own checks (shapes, config values, vocabulary maps) that go through
 * {@link CheckpointSanity.problem}. Every finding names the file, tensor or field.
 *
 * The deployment config's `checkpoint_sanity` (`"refuse"`, the default, or `"warn"`) decides what a
 * *suspect value* does — a non-finite weight is refused, or reported and loaded anyway (a test that
 * wants a NaN row on purpose). Structural problems (a shape that disagrees with the config, a map
 * outside the vocabulary, an unbounded size) are refused in both modes; weak signals (a mask-token
 * embedding of near-zero norm, a tensor nobody reads) are warnings in both. docs/ARCHITECTURE.md,
 * "Checkpoint sanity", has the table.
 */

/** The deployment config's `checkpoint_sanity`: refuse a suspect checkpoint (default) or warn and load it. */
export type CheckpointSanityMode = 'refuse' | 'warn';

/** Every mode, for schemas and flag parsing. */
export const CHECKPOINT_SANITY_MODES: readonly CheckpointSanityMode[] = Object.freeze(['refuse', 'warn']);

/** A checkpoint refused at load. `subject` names the file, tensor or config field. */
export class CheckpointSanityError extends Error {
  override readonly name = 'CheckpointSanityError';
  constructor(
    /** What was wrong: `'non-finite'`, `'shape'`, `'config'`, `'size'`, `'vocabulary'`. */
    readonly check: string,
    /** The file, tensor or config field, as named in the message. */
    readonly subject: string,
    message: string,
  ) {
    super(message);
  }
}

/** Where the non-finite values of a tensor are. */
export interface NonFiniteReport {
  /** Non-finite elements (NaN, +Infinity, −Infinity). */
  readonly count: number;
  /** Flat index of the first one. */
  readonly first: number;
  /** Its value (NaN or ±Infinity). */
  readonly value: number;
}

/**
 * Finds the non-finite values of bf16 bits or f32 values `[n]`: the exponent bits all ones. One pass
 * over 32-bit words (two bf16 values or one f32 per word) OR-ing `(exponent + 1)`'s carry bit, so the clean
 * case costs one AND, one ADD and one OR per word (≈ 1 ns per bf16 value on one core, measured in
 * docs/ARCHITECTURE.md "Checkpoint sanity"); only a tensor that has one is scanned a second time to count.
 * @returns undefined when every value is finite.
 */
export function findNonFinite(data: Uint16Array | Float32Array): NonFiniteReport | undefined {
  const bf16 = data instanceof Uint16Array;
  const aligned = data.byteOffset % 4 === 0;
  let any: boolean;
  if (bf16 && aligned) {
    const words = new Uint32Array(data.buffer, data.byteOffset, data.length >>> 1);
    let acc = 0;
    const n = words.length;
    let i = 0;
    for (; i + 4 <= n; i += 4) {
      acc |=
        ((words[i]! & 0x7f807f80) + 0x00800080) |
        ((words[i + 1]! & 0x7f807f80) + 0x00800080) |
        ((words[i + 2]! & 0x7f807f80) + 0x00800080) |
        ((words[i + 3]! & 0x7f807f80) + 0x00800080);
    }
    for (; i < n; i++) acc |= (words[i]! & 0x7f807f80) + 0x00800080;
    any = (acc & 0x80008000) !== 0 || (data.length % 2 === 1 && (data[data.length - 1]! & 0x7f80) === 0x7f80);
  } else if (!bf16 && aligned) {
    const words = new Uint32Array(data.buffer, data.byteOffset, data.length);
    let acc = 0;
    for (let i = 0; i < words.length; i++) acc |= (words[i]! & 0x7f800000) + 0x00800000;
    any = (acc & 0x80000000) !== 0;
  } else {
    any = true; // unaligned views (never from the readers): take the counting pass
  }
  if (!any) return undefined;
  let count = 0;
  let first = -1;
  let value = 0;
  for (let i = 0; i < data.length; i++) {
    const finite = bf16 ? (data[i]! & 0x7f80) !== 0x7f80 : Number.isFinite(data[i]!);
    if (finite) continue;
    if (count++ === 0) {
      first = i;
      value = bf16 ? bf16Value(data[i]!) : data[i]!;
    }
  }
  return count === 0 ? undefined : { count, first, value };
}

function bf16Value(bits: number): number {
  return new Float32Array(new Uint32Array([bits << 16]).buffer)[0]!;
}

/** Options of {@link CheckpointSanity}. */
export interface CheckpointSanityOptions {
  /** Default `'refuse'`. */
  readonly mode?: CheckpointSanityMode;
  /** Where warnings go (default: a `warning: …` line on stderr). */
  readonly onWarning?: (message: string) => void;
}

/**
 * The sanity policy of one load: findings become a {@link CheckpointSanityError} or a warning. Shared by
 * the runtime (config, tokenizer, unread tensors), `WeightReader` (shapes, non-finite values) and the
 * plugins (their config values and vocabulary maps).
 */
export class CheckpointSanity {
  readonly mode: CheckpointSanityMode;
  /** Warnings issued so far, in order (also sent to `onWarning`). */
  readonly warnings: string[] = [];
  private readonly sink: (message: string) => void;

  constructor(options: CheckpointSanityOptions = {}) {
    this.mode = options.mode ?? 'refuse';
    this.sink = options.onWarning ?? ((m) => process.stderr.write(`warning: ${m}\n`));
  }

  /** A suspect value: refused in mode `'refuse'`, a warning (suffixed with how it was loaded) in mode `'warn'`. */
  suspect(check: string, subject: string, message: string): void {
    if (this.mode === 'refuse') {
      throw new CheckpointSanityError(
        check,
        subject,
        `${message} (refused; checkpoint_sanity: "warn" loads it anyway)`,
      );
    }
    this.warn(`${message} (loaded anyway: checkpoint_sanity is "warn")`);
  }

  /** A structural problem: refused in every mode. @throws {CheckpointSanityError} always. */
  refuse(check: string, subject: string, message: string): never {
    throw new CheckpointSanityError(check, subject, message);
  }

  /** A weak signal: a warning in every mode. */
  warn(message: string): void {
    this.warnings.push(message);
    this.sink(message);
  }

  /**
   * Scans `data` (a tensor, or the block of one just read) for non-finite values and reports them as
   * {@link suspect} naming the tensor, its file and the first bad element.
   * @param where the checkpoint file (or directory) holding it.
   * @param shape the tensor's shape, to name the first bad element's row.
   * @param offset flat index of `data[0]` in the tensor (a block read; default 0).
   */
  checkFinite(
    where: string,
    name: string,
    shape: readonly number[],
    data: Uint16Array | Float32Array,
    offset = 0,
  ): void {
    const found = findNonFinite(data);
    if (found === undefined) return;
    const at = offset + found.first;
    const rowLen = shape.length >= 2 ? shape.slice(1).reduce((a, b) => a * b, 1) : 0;
    const row = rowLen > 0 ? ` (row ${Math.floor(at / rowLen)})` : '';
    this.suspect(
      'non-finite',
      name,
      `${where}: tensor ${JSON.stringify(name)}: ${found.count} non-finite value${found.count === 1 ? '' : 's'} ` +
        `of ${data.length}${offset > 0 || data.length < shape.reduce((a, b) => a * b, 1) ? ' read' : ''}, ` +
        `the first ${found.value} at element ${at}${row}`,
    );
  }
}
