/**
 * The pipeline's stage transports: a small, **synchronous** request/response channel between the
 * driver process and one stage process. {@link StageModel.forward} is synchronous (the engine's
 * step is), so the driver must block until the stage answers — see docs/ARCHITECTURE.md, "Pipeline
 * parallelism". Two implementations of {@link SyncChannel}:
 * - `ZmqChannel` (zmq-channel.ts, the default): a ZeroMQ PAIR socket, owned by a bridge worker
 *   thread because ZeroMQ's Node binding (v6) is promise-only;
 * - {@link FifoChannel} (here): a pair of named pipes (FIFOs) read and written with
 *   `fs.readSync` / `fs.writeSync` (Linux / macOS; `mkfifo` must exist).
 *
 * A message is a small JSON header plus raw tensor frames (no JSON for tensors):
 *   u32 LE header bytes · header (UTF-8 JSON, with `frames: [{dtype, length}]`) · frame bytes…
 * A frame is a Float32Array or an Int32Array. Over the FIFOs it arrives as a fresh, aligned copy;
 * over ZeroMQ the whole message is one ZeroMQ message ({@link encodeMessage}, header space-padded so
 * that frames are 4-byte aligned) and frames are views of the received buffer.
 *
 * End of file on a read (every writer gone) or EPIPE on a write (no reader) means the peer died:
 * {@link PeerGoneError}.
 */

import * as fs from 'node:fs';

/** A tensor frame of a message. */
export type Frame = Float32Array | Int32Array;

/** A message: header fields (JSON-serialisable) and frames. */
export interface Message {
  readonly header: Record<string, unknown>;
  readonly frames: readonly Frame[];
}

/** The peer closed its end (exited or crashed). */
export class PeerGoneError extends Error {
  override readonly name = 'PeerGoneError';
}

/** The transport's surface (what {@link RemoteStage} and the stage worker use). */
export interface SyncChannel {
  /** Sends one message (blocks until written). @throws {PeerGoneError} */
  send(msg: Message): void;
  /** Receives one message (blocks until it is complete). @throws {PeerGoneError} */
  receive(): Message;
  close(): void;
}

const sleepCell = new Int32Array(new SharedArrayBuffer(4));
/** Sleeps `ms` milliseconds without leaving the thread (Atomics.wait on a private cell). */
function sleepMs(ms: number): void {
  Atomics.wait(sleepCell, 0, 0, ms);
}

/** Backoff of a non-blocking poll: spin a little, then sleep 20 µs … `maxMs`. */
class Backoff {
  private tries = 0;
  constructor(private readonly maxMs: number) {}
  wait(): void {
    this.tries++;
    if (this.tries < 64) return;
    sleepMs(Math.min(this.maxMs, 0.02 * 2 ** Math.min(10, Math.floor((this.tries - 64) / 16))));
  }
  reset(): void {
    this.tries = 0;
  }
}

const DTYPES = { f32: Float32Array, i32: Int32Array } as const;

/**
 * One message as one buffer (the ZeroMQ transport's message): the wire format above, with the JSON
 * header space-padded so that every frame starts 4-byte aligned. The one copy of the frames.
 */
export function encodeMessage(msg: Message): ArrayBuffer {
  const frames = msg.frames.map((f) => ({ dtype: f instanceof Float32Array ? 'f32' : 'i32', length: f.length }));
  const json = Buffer.from(JSON.stringify({ ...msg.header, frames }), 'utf8');
  const headLen = json.length + ((4 - (json.length % 4)) % 4);
  const total = 4 + headLen + msg.frames.reduce((a, f) => a + f.byteLength, 0);
  const ab = new ArrayBuffer(total);
  const u8 = new Uint8Array(ab);
  new DataView(ab).setUint32(0, headLen, true);
  u8.set(json, 4);
  u8.fill(0x20, 4 + json.length, 4 + headLen);
  let at = 4 + headLen;
  for (const f of msg.frames) {
    u8.set(new Uint8Array(f.buffer, f.byteOffset, f.byteLength), at);
    at += f.byteLength;
  }
  return ab;
}

/**
 * Decodes one whole message ({@link encodeMessage}'s format); frames are views of `bytes` where they
 * are 4-byte aligned in memory, copies otherwise. @throws {Error} for a truncated message
 */
export function decodeMessage(bytes: Uint8Array<ArrayBuffer>): Message {
  if (bytes.byteLength < 4) throw new Error(`stage transport: truncated message (${bytes.byteLength} bytes)`);
  const n = new DataView(bytes.buffer, bytes.byteOffset, 4).getUint32(0, true);
  if (4 + n > bytes.byteLength)
    throw new Error(`stage transport: truncated message (${bytes.byteLength} bytes, header ends at ${4 + n})`);
  const header = JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset + 4, n).toString('utf8')) as Record<
    string,
    unknown
  > & { frames: { dtype: 'f32' | 'i32'; length: number }[] };
  let at = 4 + n;
  const frames: Frame[] = header.frames.map(({ dtype, length }) => {
    const T = DTYPES[dtype];
    const len = length * 4;
    if (at + len > bytes.byteLength)
      throw new Error(`stage transport: truncated message (${bytes.byteLength} bytes, frame ends at ${at + len})`);
    const off = bytes.byteOffset + at;
    const f = off % 4 === 0 ? new T(bytes.buffer, off, length) : new T(bytes.buffer.slice(off, off + len));
    at += len;
    return f;
  });
  return { header, frames };
}

/**
 * A FIFO pair as a {@link SyncChannel}. `readFd` / `writeFd` may be blocking or non-blocking
 * (EAGAIN is polled with a short backoff; `idleMaxMs` bounds the sleep while waiting for data).
 */
export class FifoChannel implements SyncChannel {
  private closed = false;
  constructor(
    private readonly readFd: number,
    private readonly writeFd: number,
    private readonly idleMaxMs = 1,
  ) {}

  send(msg: Message): void {
    const frames = msg.frames.map((f) => ({ dtype: f instanceof Float32Array ? 'f32' : 'i32', length: f.length }));
    const head = Buffer.from(JSON.stringify({ ...msg.header, frames }), 'utf8');
    const pre = Buffer.alloc(4);
    pre.writeUInt32LE(head.length, 0);
    this.writeAll(pre);
    this.writeAll(head);
    for (const f of msg.frames) this.writeAll(new Uint8Array(f.buffer, f.byteOffset, f.byteLength));
  }

  receive(): Message {
    const pre = this.readExactly(4, false);
    const n = pre.readUInt32LE(0);
    const header = JSON.parse(this.readExactly(n, true).toString('utf8')) as Record<string, unknown> & {
      frames: { dtype: 'f32' | 'i32'; length: number }[];
    };
    const frames: Frame[] = header.frames.map(({ dtype, length }) => {
      const T = DTYPES[dtype];
      const out = new T(length);
      this.readInto(new Uint8Array(out.buffer), true);
      return out;
    });
    return { header, frames };
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const fd of [this.readFd, this.writeFd]) {
      try {
        fs.closeSync(fd);
      } catch {
        /* already closed */
      }
    }
  }

  private writeAll(b: Uint8Array): void {
    const back = new Backoff(1);
    let off = 0;
    while (off < b.length) {
      try {
        off += fs.writeSync(this.writeFd, b, off, b.length - off);
        back.reset();
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'EAGAIN') back.wait();
        else if (code === 'EPIPE' || code === 'EBADF') throw new PeerGoneError(`peer closed the channel (${code})`);
        else throw err;
      }
    }
  }

  private readExactly(n: number, midMessage: boolean): Buffer {
    const b = Buffer.alloc(n);
    this.readInto(b, midMessage);
    return b;
  }

  private readInto(b: Uint8Array, midMessage: boolean): void {
    const back = new Backoff(midMessage ? 1 : this.idleMaxMs);
    let off = 0;
    while (off < b.length) {
      let got: number;
      try {
        got = fs.readSync(this.readFd, b, off, b.length - off, null);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'EAGAIN') {
          back.wait();
          continue;
        }
        if (code === 'EBADF') throw new PeerGoneError('channel closed');
        throw err;
      }
      if (got === 0) throw new PeerGoneError('peer closed the channel (end of file)');
      off += got;
      back.reset();
    }
  }
}
