/**
 * Prompt encoding that does not stall the server: a text of up to `inlineChars` UTF-16 code units is encoded on
 * the calling thread (a few ms), a longer one in a worker thread holding the same tokenizer (built from
 * {@link Tokenizer.libraryInputs} with the same `@huggingface/tokenizers`), so that `/health` and the engine loop's
 * steps run while it is encoded (a 150,000-character prompt takes ~200 ms to encode on the development CPU). One
 * worker per encoder, started at the first long prompt; long prompts are encoded one after the other, in order.
 */

import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';

import { type Tokenizer, TokenizerError } from '../io/tokenizer.js';

/** What the worker thread runs (CommonJS, `eval`): builds the tokenizer, then answers `{id, text}` messages. */
const WORKER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { Tokenizer } = require(workerData.library);
const hf = new Tokenizer(workerData.tokenizerJson, workerData.tokenizerConfig);
parentPort.on('message', ({ id, text }) => {
  try {
    const { ids, tokens } = hf.encode(text, { add_special_tokens: false });
    const out = new Int32Array(ids.length);
    for (let i = 0; i < ids.length; i++) {
      if (typeof ids[i] !== 'number' || !Number.isInteger(ids[i])) {
        parentPort.postMessage({ id, missing: String(tokens[i]) });
        return;
      }
      out[i] = ids[i];
    }
    parentPort.postMessage({ id, ids: out }, [out.buffer]);
  } catch (err) {
    parentPort.postMessage({ id, error: String(err && err.message || err) });
  }
});
`;

interface Reply {
  readonly id: number;
  readonly ids?: Int32Array;
  readonly missing?: string;
  readonly error?: string;
}

interface Pending {
  resolve(ids: Int32Array): void;
  reject(err: Error): void;
}

/** Encodes prompt texts without special tokens, long ones off the event loop. */
export class PromptEncoder {
  private worker: Worker | undefined;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  /** Texts encoded by the worker thread so far (for tests and metrics). */
  encodedInWorker = 0;

  /** Texts waiting for or being encoded by the worker thread now. */
  get inWorker(): number {
    return this.pending.size;
  }

  /**
   * @param tokenizer the target's tokenizer.
   * @param inlineChars texts of at most this many UTF-16 code units are encoded on the calling thread (default
   *   16384, ~25 ms).
   */
  constructor(
    readonly tokenizer: Tokenizer,
    readonly inlineChars = 16384,
  ) {}

  /**
   * `tokenizer.encode(text, {addSpecialTokens: false})`, in the worker thread for a long text.
   * @returns `[numTokens]` i32 token ids.
   * @throws {TokenizerError} as `Tokenizer.encode` (a piece without an id), or naming the worker thread when it
   *   failed or exited.
   */
  encode(text: string): Promise<Int32Array> {
    if (text.length <= this.inlineChars) {
      try {
        return Promise.resolve(this.tokenizer.encode(text, { addSpecialTokens: false }));
      } catch (err) {
        return Promise.reject(err as Error);
      }
    }
    const worker = this.start();
    const id = this.nextId++;
    return new Promise<Int32Array>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      worker.ref();
      worker.postMessage({ id, text });
    });
  }

  /** Stops the worker thread (pending encodings fail). A later long text starts a new one. */
  async close(): Promise<void> {
    const w = this.worker;
    this.worker = undefined;
    if (w !== undefined) await w.terminate();
  }

  private start(): Worker {
    if (this.worker !== undefined) return this.worker;
    const { tokenizerJson, tokenizerConfig } = this.tokenizer.libraryInputs;
    const library = createRequire(import.meta.url).resolve('@huggingface/tokenizers');
    const w = new Worker(WORKER_SOURCE, { eval: true, workerData: { library, tokenizerJson, tokenizerConfig } });
    const source = this.tokenizer.source;
    w.on('message', (m: Reply) => {
      const p = this.pending.get(m.id);
      if (p === undefined) return;
      this.pending.delete(m.id);
      if (this.pending.size === 0) w.unref();
      if (m.ids !== undefined) {
        this.encodedInWorker++;
        p.resolve(m.ids);
      } else if (m.missing !== undefined)
        p.reject(new TokenizerError(source, `piece ${JSON.stringify(m.missing)} has no token id (no unk_token)`));
      else p.reject(new TokenizerError(source, `encode (worker thread): ${m.error ?? 'no answer'}`));
    });
    const fail = (why: string): void => {
      if (this.worker === w) this.worker = undefined;
      const all = [...this.pending.values()];
      this.pending.clear();
      for (const p of all) p.reject(new TokenizerError(source, `the prompt-encoding worker thread ${why}`));
    };
    w.on('error', (err) => fail(`failed: ${err.message}`));
    w.on('exit', (code) => fail(`exited (code ${code})`));
    w.unref();
    this.worker = w;
    return w;
  }
}
