/**
 * The stage processes of a pipeline as processes: forking one (stage-worker.js), the registry of
 * those alive so none outlives the driver, and how a dead one is described in errors.
 */

import { fork, spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as nodePath from 'node:path';
import { fileURLToPath } from 'node:url';

/** A pipeline stage failed: it died (exit code / signal in the message) or its forward threw. */
export class PipelineStageError extends Error {
  override readonly name = 'PipelineStageError';
}

// --- child bookkeeping: no orphans -------------------------------------------------------------

const live = new Set<ChildProcess>();
let hooked = false;

function killAll(): void {
  for (const c of live) {
    try {
      c.kill('SIGKILL');
    } catch {
      /* gone */
    }
  }
  live.clear();
}

/**
 * Stage processes die with the driver: on its `exit` they are SIGKILLed here. No SIGINT / SIGTERM
 * handler is installed — one would replace the signal's default action, and a synchronous
 * `generate` loop would only run it after the whole generation (tested). The driver dies by the
 * signal, and each stage exits when its channel to the driver closes (ZeroMQ: the IPC channel's
 * `disconnect`; FIFOs: end of file); `specd serve` handles the signals itself and disposes the model.
 */
function track(c: ChildProcess): void {
  live.add(c);
  c.once('exit', () => live.delete(c));
  if (hooked) return;
  hooked = true;
  process.on('exit', killAll);
}

/** Pids of the stage processes alive (spawned by this process and not yet exited). */
export function liveStagePids(): number[] {
  return [...live].flatMap((c) => (c.pid === undefined ? [] : [c.pid]));
}

/**
 * `exited with code N` / `was killed by SIGKILL` for a dead child, reading /proc when the event loop
 * could not reap it yet.
 */
export function exitDescription(child: ChildProcess): string {
  const pid = child.pid;
  const deadline = Date.now() + 2000;
  const cell = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    if (child.exitCode !== null) return `exited with code ${child.exitCode}`;
    if (child.signalCode !== null) return `was killed by ${child.signalCode}`;
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (fields[0] === 'Z') {
        const status = Number(fields[49]); // field 52: exit status as waitpid(2) reports it
        if ((status & 0x7f) === 0) return `exited with code ${(status >> 8) & 0xff}`;
        const sig = Object.entries(os.constants.signals).find(([, n]) => n === (status & 0x7f))?.[0];
        return `was killed by ${sig ?? `signal ${status & 0x7f}`}`;
      }
    } catch {
      return 'exited (exit code unknown)';
    }
    if (Date.now() > deadline) return 'closed its channel (still running)';
    Atomics.wait(cell, 0, 0, 5);
  }
}

/** Drops `c` from the registry (a stage killed or disposed by its owner). */
export function untrack(c: ChildProcess): void {
  live.delete(c);
}

/** The compiled stage-worker entry (next to this file in dist/). */
export const STAGE_WORKER_SCRIPT = nodePath.join(nodePath.dirname(fileURLToPath(import.meta.url)), 'stage-worker.js');

/**
 * Forks a stage process (stage-worker.js), tracked so that it dies with this process.
 * @param exec a command prefix that starts it elsewhere (e.g. `['ip', 'netns', 'exec', 'ns1']`: another network
 *   namespace); the prefix must exec node in place (the process stays this one's child, its IPC channel inherited).
 */
export function forkStage(args: string[], exec?: readonly string[]): ChildProcess {
  const options = { stdio: ['ignore', 2, 2, 'ipc'] as ('ignore' | number | 'ipc')[], serialization: 'json' as const };
  const [cmd, ...prefix] = exec ?? [];
  const child =
    cmd === undefined
      ? fork(STAGE_WORKER_SCRIPT, args, options)
      : spawn(cmd, [...prefix, process.execPath, STAGE_WORKER_SCRIPT, ...args], options);
  track(child);
  return child;
}
