/**
 * Waiting for room before a restore and uploading after a suspend are moves
 * in progress, as suspending and restoring are: the view polls every second
 * through them, the room they wait for is shown from polls and events alike,
 * and an uploading kernel is on disk.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { shutdownLines } from '../messages';
import { isTransient, stateFromEvent } from '../state';
import { KernelStore } from '../store';
import type { IRoomWait } from '../types';
import { CHECKPOINT, event, kernel } from './fixtures';

const K = kernel().kernel_id;

const ROOM: IRoomWait = {
  where: 'on GPU 0',
  need: 8 * 1024 ** 3,
  suspending: ['5f1c0000-aaaa-bbbb-cccc-000000000002'],
  message: 'waiting for room on GPU 0: suspending 1 idle kernel'
};

describe('waiting for room and uploading', () => {
  it('are moves in progress, as suspending and restoring are', () => {
    assert.equal(isTransient('waiting-for-room'), true);
    assert.equal(isTransient('uploading'), true);
    assert.equal(isTransient('suspended'), false);
    assert.equal(isTransient('suspend-pending'), false);
  });

  it('make the view poll fast until the kernel is back or on disk', () => {
    const store = new KernelStore();
    store.applyPolled(
      K,
      kernel({ state: 'waiting-for-room', room: ROOM }),
      store.ask()
    );
    assert.equal(store.anyTransient, true);
    store.applyPolled(K, kernel({ state: 'running' }), store.ask());
    assert.equal(store.anyTransient, false);
    store.applyPolled(
      K,
      kernel({ state: 'uploading', checkpoint: CHECKPOINT }),
      store.ask()
    );
    assert.equal(store.anyTransient, true);
    store.applyPolled(
      K,
      kernel({ state: 'suspended', checkpoint: CHECKPOINT }),
      store.ask()
    );
    assert.equal(store.anyTransient, false);
  });

  it("show a poll's room message while this browser's resume is in flight", () => {
    const store = new KernelStore();
    store.applyPolled(
      K,
      kernel({ state: 'suspended', checkpoint: CHECKPOINT }),
      store.ask()
    );
    store.begin(K, 'resume');
    store.applyPolled(
      K,
      kernel({ state: 'waiting-for-room', room: ROOM }),
      store.ask()
    );
    assert.equal(store.get(K)?.state, 'waiting-for-room');
    assert.equal(store.get(K)?.room?.message, ROOM.message);
  });

  it('show the room message of an event', () => {
    const next = stateFromEvent(
      kernel({ state: 'suspended' }),
      event({
        state: 'waiting-for-room',
        phase: 'waiting-for-room',
        room: ROOM
      })
    );
    assert.equal(next.room?.message, ROOM.message);
  });

  it('say a restore was asked for ahead of use, from its event, until it runs', () => {
    const restoring = stateFromEvent(
      kernel({ state: 'suspended' }),
      event({ state: 'restoring', phase: 'restoring', ahead: true })
    );
    assert.equal(restoring.ahead, true);
    const running = stateFromEvent(
      restoring,
      event({ state: 'running', ahead: false })
    );
    assert.equal(running.ahead, false);
  });

  it("keep an upload's progress from its events", () => {
    const progress = {
      phase: 'uploading',
      bytes_done: 1024,
      bytes_total: 4096
    };
    const next = stateFromEvent(
      kernel({ state: 'uploading' }),
      event({
        state: 'uploading',
        phase: 'uploading',
        bytes_done: 1024,
        bytes_total: 4096,
        progress
      })
    );
    assert.deepEqual(next.progress, progress);
  });

  it('send an uploading kernel to the trash on shutdown, as the server does', () => {
    const [line] = shutdownLines(
      [
        {
          kernelId: K,
          label: 'a.ipynb',
          state: kernel({ state: 'uploading', checkpoint: CHECKPOINT })
        }
      ],
      24
    );
    assert.equal(line.trashed, true);
    assert.match(
      line.fate,
      /^uploading \(5\.0 GiB\): its saved state goes to the trash for 24 h$/
    );
  });
});
