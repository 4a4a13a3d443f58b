import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  canResume,
  canSuspend,
  groupForPanel,
  isTransient,
  mergeEvent,
  stateChanged
} from '../state';
import type { ICheckpoint } from '../types';
import { CHECKPOINT, GPU, kernel } from './fixtures';

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

describe('mergeEvent', () => {
  it('takes progress from events while suspending', () => {
    const next = mergeEvent(kernel({ gpu: GPU }), {
      kernel_id: kernel().kernel_id,
      state: 'suspending',
      phase: 'dumping',
      bytes_done: 10,
      bytes_total: 100
    });
    assert.equal(next.state, 'suspending');
    assert.deepEqual(next.progress, {
      phase: 'dumping',
      bytes_done: 10,
      bytes_total: 100
    });
    assert.deepEqual(next.gpu, GPU);
  });
  it('drops progress and GPU when suspended', () => {
    const next = mergeEvent(
      kernel({
        state: 'suspending',
        gpu: GPU,
        progress: { phase: 'dumping', bytes_done: 1, bytes_total: 2 }
      }),
      { kernel_id: kernel().kernel_id, state: 'suspended', phase: 'done' }
    );
    assert.equal(next.state, 'suspended');
    assert.equal(next.progress, null);
    assert.equal(next.gpu, null);
  });
  it('keeps the error of a failed suspend', () => {
    const next = mergeEvent(kernel({ state: 'suspending' }), {
      kernel_id: kernel().kernel_id,
      state: 'running',
      phase: 'failed',
      error: 'criu dump failed'
    });
    assert.equal(next.state, 'running');
    assert.equal(next.error, 'criu dump failed');
  });
  it('clears an old error when a new operation starts', () => {
    const next = mergeEvent(kernel({ error: 'old' }), {
      kernel_id: kernel().kernel_id,
      state: 'suspending',
      phase: 'trimming'
    });
    assert.equal(next.error, null);
  });
  it('reads an empty error as no error', () => {
    const next = mergeEvent(kernel({ error: 'old', hint: 'do this' }), {
      kernel_id: kernel().kernel_id,
      state: 'suspended',
      phase: 'done',
      error: ''
    });
    assert.equal(next.error, null);
    assert.equal(next.hint, null);
  });
  it('drops the hint of an older error', () => {
    const next = mergeEvent(
      kernel({ state: 'suspending', error: null, hint: 'stale' }),
      {
        kernel_id: kernel().kernel_id,
        state: 'running',
        phase: 'failed',
        error: 'new'
      }
    );
    assert.equal(next.error, 'new');
    assert.equal(next.hint, null);
  });
  it('creates a state for an unknown kernel', () => {
    const next = mergeEvent(undefined, {
      kernel_id: 'k2',
      state: 'restoring',
      phase: 'restoring',
      bytes_done: 0,
      bytes_total: 50
    });
    assert.equal(next.kernel_id, 'k2');
    assert.equal(next.state, 'restoring');
    assert.equal(next.progress?.bytes_total, 50);
  });
  it('keeps the known total when a later event omits it', () => {
    const first = mergeEvent(kernel(), {
      kernel_id: kernel().kernel_id,
      state: 'suspending',
      phase: 'dumping',
      bytes_done: 1,
      bytes_total: 100
    });
    const second = mergeEvent(first, {
      kernel_id: kernel().kernel_id,
      state: 'suspending',
      phase: 'dumping',
      bytes_done: 50
    });
    assert.equal(second.progress?.bytes_total, 100);
    assert.equal(second.progress?.bytes_done, 50);
  });
});

describe('mergeEvent with the restore fields', () => {
  it('takes the notebook path, restore time, time on disk and losses', () => {
    const next = mergeEvent(
      kernel({ state: 'restoring', notebook_path: 'old.ipynb' }),
      {
        kernel_id: kernel().kernel_id,
        state: 'running',
        phase: 'done',
        notebook_path: 'renamed.ipynb',
        restored_at: 1796061600,
        suspended_for: 180,
        lost: [{ name: 'gen', type: 'generator' }],
        error: null,
        hint: null
      }
    );
    assert.equal(next.notebook_path, 'renamed.ipynb');
    assert.equal(next.restored_at, 1796061600);
    assert.equal(next.suspended_for, 180);
    assert.deepEqual(next.lost, [{ name: 'gen', type: 'generator' }]);
  });
  it("keeps the event's hint with its error", () => {
    const next = mergeEvent(kernel({ state: 'suspending' }), {
      kernel_id: kernel().kernel_id,
      state: 'running',
      phase: 'failed',
      error: 'boom',
      hint: 'do this'
    });
    assert.equal(next.hint, 'do this');
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
