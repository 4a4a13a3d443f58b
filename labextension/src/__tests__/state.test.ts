import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  canResume,
  canSuspend,
  fullState,
  groupForPanel,
  isTransient,
  stateChanged,
  stateFromEvent
} from '../state';
import type { ICheckpoint } from '../types';
import { CHECKPOINT, event, GPU, kernel } from './fixtures';

describe('state predicates', () => {
  it('knows what can be done', () => {
    assert.equal(canSuspend(kernel()), true);
    assert.equal(canSuspend(kernel({ state: 'suspended' })), false);
    assert.equal(canSuspend(undefined), false);
    assert.equal(canResume(kernel({ state: 'suspended' })), true);
    assert.equal(canResume(kernel({ state: 'restoring' })), false);
    assert.equal(isTransient('suspending'), true);
    assert.equal(isTransient('restoring'), true);
    assert.equal(isTransient('running'), false);
    assert.equal(isTransient(undefined), false);
  });
  it('compares states by value', () => {
    assert.equal(stateChanged(kernel(), kernel()), false);
    assert.equal(stateChanged(kernel(), kernel({ state: 'suspended' })), true);
    assert.equal(stateChanged(undefined, kernel()), true);
    assert.equal(stateChanged(undefined, undefined), false);
  });
});

describe('stateFromEvent', () => {
  it('is the whole state the event carries, as a poll would give it', () => {
    const suspended = kernel({
      state: 'suspended',
      kind: 'gpu',
      engine: 'criu',
      checkpoint: CHECKPOINT,
      suspended_at: 1796061600,
      notebook_path: 'train.ipynb',
      progress: { phase: 'done', bytes_done: 10, bytes_total: 10 }
    });
    const next = stateFromEvent(
      kernel({ gpu: GPU, notebook_path: 'train.ipynb' }),
      { ...event(suspended), schema_id: 'x', timestamp: 'y' } as never
    );
    assert.deepEqual(next, fullState(suspended.kernel_id, suspended));
    assert.equal(next.gpu, null, 'the GPU is free once suspended');
  });
  it('gives a state for a kernel not known before', () => {
    const next = stateFromEvent(
      undefined,
      event({
        kernel_id: 'k2',
        state: 'restoring',
        phase: 'restoring',
        progress: { phase: 'restoring', bytes_done: 0, bytes_total: 50 }
      })
    );
    assert.equal(next.kernel_id, 'k2');
    assert.equal(next.state, 'restoring');
    assert.equal(next.progress?.bytes_total, 50);
  });
  it('takes the restore fields and the GPU of a restored kernel', () => {
    const next = stateFromEvent(
      kernel({ state: 'restoring', notebook_path: 'old.ipynb' }),
      event({
        notebook_path: 'renamed.ipynb',
        gpu: GPU,
        kind: 'gpu',
        restored_at: 1796061600,
        suspended_for: 180,
        lost: [{ name: 'gen', type: 'generator' }]
      })
    );
    assert.equal(next.notebook_path, 'renamed.ipynb');
    assert.deepEqual(next.gpu, GPU);
    assert.equal(next.restored_at, 1796061600);
    assert.equal(next.suspended_for, 180);
    assert.deepEqual(next.lost, [{ name: 'gen', type: 'generator' }]);
  });
  it('keeps the notebook path the event has none of', () => {
    const next = stateFromEvent(
      kernel({ notebook_path: 'a.ipynb' }),
      event({ state: 'suspending', phase: 'trimming' })
    );
    assert.equal(next.notebook_path, 'a.ipynb');
  });
  it("keeps the engine GET said a running kernel's suspend would use", () => {
    const before = kernel({ engine: 'criu', engine_reason: 'provisioner' });
    const pending = stateFromEvent(
      before,
      event({ state: 'suspend-pending', phase: 'pending' })
    );
    assert.equal(pending.engine, null, 'not running: the event says');
    const cancelled = stateFromEvent(before, event({ phase: 'cancelled' }));
    assert.equal(cancelled.engine, 'criu');
    assert.equal(cancelled.engine_reason, 'provisioner');
    const failed = stateFromEvent(
      before,
      event({ engine: 'snapshot', engine_reason: 'asked', error: 'boom' })
    );
    assert.equal(failed.engine, 'snapshot', 'the engine that failed');
  });
  it("takes the event's error, hint and summary, and reads an empty error as none", () => {
    const failed = stateFromEvent(
      kernel({ state: 'suspending' }),
      event({
        phase: 'failed',
        error: 'criu dump failed',
        hint: 'do this',
        summary: 'CRIU failed',
        retryable: true
      })
    );
    assert.equal(failed.error, 'criu dump failed');
    assert.equal(failed.hint, 'do this');
    assert.equal(failed.summary, 'CRIU failed');
    assert.equal(failed.retryable, true);
    const next = stateFromEvent(
      failed,
      event({ state: 'suspending', phase: 'trimming', error: '', hint: '' })
    );
    assert.equal(next.error, null);
    assert.equal(next.hint, null);
  });
});

describe('groupForPanel', () => {
  const ckpt = (id: string, kernelId: string | null): ICheckpoint => ({
    id,
    name: id,
    kernel_id: kernelId,
    created: 1796061600,
    size: 10,
    engine: 'criu',
    gpu_model: null,
    reason: 'manual',
    notebook_path: 'a.ipynb'
  });
  it('gives one row per suspended kernel with its checkpoint, the rest apart', () => {
    const a = kernel({
      kernel_id: 'a',
      state: 'suspended',
      checkpoint: { ...CHECKPOINT, id: 'ca' }
    });
    const b = kernel({ kernel_id: 'b' });
    const c = kernel({ kernel_id: 'c', state: 'suspend-pending' });
    const groups = groupForPanel(
      [a, b, c],
      [ckpt('ca', 'a'), ckpt('old', 'b'), ckpt('orphan', null)]
    );
    assert.deepEqual(
      groups.kernels.map(r => [r.state.kernel_id, r.checkpoint?.id ?? null]),
      [
        ['a', 'ca'],
        ['c', null]
      ]
    );
    assert.deepEqual(
      groups.checkpoints.map(c => c.id),
      ['old', 'orphan']
    );
  });
});
