// RemoteStage's exchange with a stage process whose transport fails: a stage that died is named with how it died,
// whatever error the transport raised first (ZeroMQ: a send to a killed stage can time out before the peer's close
// is seen); a transport error while the process still runs is rethrown as is. Runs against dist/.
import type { ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';

import { describe, expect, it } from 'vitest';

import { RemoteStage } from '../../dist/pipeline/remote-stage.js';
import { PipelineStageError } from '../../dist/pipeline/stage-process.js';
import { PeerGoneError, type Message, type SyncChannel } from '../../dist/pipeline/transport.js';

/** A child process as RemoteStage reads it: pid, exit code, signal (this process's pid: alive, never a zombie). */
function fakeChild(): ChildProcess & { signalCode: NodeJS.Signals | null } {
  return Object.assign(new EventEmitter(), { pid: process.pid, exitCode: null, signalCode: null }) as never;
}

/** A channel whose send runs `onSend` and throws `err`. */
function failingChannel(err: Error, onSend: () => void = () => {}): SyncChannel {
  return {
    send(_msg: Message): void {
      onSend();
      throw err;
    },
    receive(): Message {
      throw new Error('not reached');
    },
    close(): void {},
  } as SyncChannel;
}

const info = { layerStart: 2, layerEnd: 5 } as never;

/** A RemoteStage of index 1 in a stand-in pipeline (only its cache-op queues are read). */
function stageOf(child: ChildProcess, channel: SyncChannel): RemoteStage {
  const stage = new RemoteStage(1, info, child, channel, {} as never);
  stage.pipeline = { queues: [[], []] } as never;
  return stage;
}

describe('RemoteStage exchange', () => {
  it('names the stage and how it died when the transport fails with another error after the kill', () => {
    const child = fakeChild();
    const sendErr = new Error('zmq send: Operation was not possible or timed out');
    const stage = stageOf(
      child,
      failingChannel(sendErr, () => {
        child.signalCode = 'SIGKILL'; // killed while the request was on its way
      }),
    );
    let thrown: unknown;
    try {
      stage.usage();
    } catch (e) {
      thrown = e;
    }
    expect(thrown).toBeInstanceOf(PipelineStageError);
    expect((thrown as Error).message).toBe(`pipeline stage 1 (layers 2–4, pid ${process.pid}) was killed by SIGKILL`);
    expect((thrown as Error).cause).toBe(sendErr);
    // the death is kept: the next call fails the same way before any exchange
    expect(stage.failure()).toBe(thrown);
    expect(() => stage.usage()).toThrow(thrown as Error);
  });

  it('rethrows a transport error as is while the process still runs, and names a peer close whatever', () => {
    const sendErr = new Error('zmq send: Operation was not possible or timed out');
    const live = stageOf(fakeChild(), failingChannel(sendErr));
    expect(() => live.usage()).toThrow(sendErr);
    expect(live.failure()).toBeUndefined();
    const gone = stageOf(fakeChild(), failingChannel(new PeerGoneError('peer closed')));
    expect(() => gone.usage()).toThrow(/pipeline stage 1 \(layers 2–4, pid \d+\) closed its channel \(still running\)/);
    expect(gone.failure()).toBeInstanceOf(PipelineStageError);
  });
});
