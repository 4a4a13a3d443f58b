import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  canResume,
  canSuspend,
  describeKernelState,
  isTransient,
  kernelLabel,
  mergeEvent,
  stateChanged,
  transitionNotice
} from '../state';
import type { IKernelState } from '../types';

const NOW = new Date('2026-11-30T18:10:00Z');

function kernel(overrides: Partial<IKernelState> = {}): IKernelState {
  return {
    kernel_id: '5f1c0000-aaaa-bbbb-cccc-000000000001',
    state: 'running',
    engine: null,
    checkpoint: null,
    gpu: null,
    progress: null,
    suspended_at: null,
    error: null,
    ...overrides
  };
}

const GPU = {
  index: 0,
  uuid: 'GPU-1234',
  name: 'NVIDIA H200',
  memory_used: 6170000000
};

const CHECKPOINT = {
  id: 'ckpt-1',
  size: 5 * 1024 ** 3,
  created: '2026-11-30T18:00:00Z',
  engine: 'criu',
  gpu_model: 'NVIDIA H200'
};

describe('describeKernelState', () => {
  it('shows the GPU of a running kernel', () => {
    const d = describeKernelState(kernel({ gpu: GPU }), NOW);
    assert.equal(d.label, 'GPU 0 · NVIDIA H200 · 5.7 GiB');
    assert.equal(d.kind, 'gpu');
    assert.match(d.title, /GPU 0 \(NVIDIA H200, GPU-1234\)/);
  });
  it('shows CPU for a kernel without GPU', () => {
    const d = describeKernelState(kernel(), NOW);
    assert.equal(d.label, 'CPU');
    assert.equal(d.kind, 'cpu');
  });
  it('flags a failed suspend on a running kernel', () => {
    const d = describeKernelState(
      kernel({ error: 'CRIU failed: no space' }),
      NOW
    );
    assert.equal(d.label, 'CPU · ⚠ suspend failed');
    assert.equal(d.kind, 'error');
    assert.match(d.title, /no space/);
  });
  it('shows suspend progress', () => {
    const d = describeKernelState(
      kernel({
        state: 'suspending',
        progress: {
          phase: 'dumping',
          bytes_done: 1024 ** 3,
          bytes_total: 4 * 1024 ** 3
        }
      }),
      NOW
    );
    assert.equal(d.label, 'Suspending… writing image 1.0 GiB / 4.0 GiB (25%)');
    assert.equal(d.kind, 'busy');
  });
  it('shows suspending without progress', () => {
    assert.equal(
      describeKernelState(kernel({ state: 'suspending' }), NOW).label,
      'Suspending…'
    );
  });
  it('shows a suspended kernel with size and age', () => {
    const d = describeKernelState(
      kernel({
        state: 'suspended',
        checkpoint: CHECKPOINT,
        engine: 'criu',
        suspended_at: '2026-11-30T18:05:00Z'
      }),
      NOW
    );
    assert.equal(d.label, 'Suspended · 5.0 GiB on disk · 5 min ago');
    assert.equal(d.kind, 'suspended');
    assert.match(d.title, /5\.0 GiB, criu/);
  });
  it('reads server times in seconds since the epoch', () => {
    const d = describeKernelState(
      kernel({
        state: 'suspended',
        checkpoint: { ...CHECKPOINT, created: 1796061600 },
        suspended_at: Date.parse('2026-11-30T18:05:00Z') / 1000
      }),
      NOW
    );
    assert.equal(d.label, 'Suspended · 5.0 GiB on disk · 5 min ago');
  });
  it('shows a suspended kernel whose checkpoint size is unknown', () => {
    const d = describeKernelState(kernel({ state: 'suspended' }), NOW);
    assert.equal(d.label, 'Suspended');
    assert.doesNotMatch(d.title, /\(\)/);
  });
  it('flags a failed restore', () => {
    const d = describeKernelState(
      kernel({
        state: 'suspended',
        checkpoint: CHECKPOINT,
        error: 'GPU model differs'
      }),
      NOW
    );
    assert.match(d.label, /⚠ restore failed$/);
    assert.equal(d.kind, 'error');
  });
  it('shows restoring', () => {
    const d = describeKernelState(kernel({ state: 'restoring' }), NOW);
    assert.equal(d.label, 'Restoring…');
    assert.equal(d.kind, 'busy');
  });
});

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
  it('labels kernels by notebook', () => {
    assert.equal(
      kernelLabel('5f1c0000-aaaa', 'dir/Train.ipynb'),
      'Train.ipynb'
    );
    assert.equal(kernelLabel('5f1c0000-aaaa', null), 'kernel 5f1c0000');
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

describe('transitionNotice', () => {
  const label = 'Train.ipynb';
  it('is silent on the first observation and without change', () => {
    assert.equal(
      transitionNotice(undefined, kernel({ state: 'suspended' }), label),
      null
    );
    assert.equal(transitionNotice(kernel(), kernel(), label), null);
    assert.equal(
      transitionNotice(kernel(), kernel({ state: 'suspending' }), label),
      null
    );
  });
  it('announces a finished suspend with size and engine', () => {
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({ state: 'suspended', checkpoint: CHECKPOINT }),
      label
    );
    assert.equal(n?.type, 'success');
    assert.match(
      n!.message,
      /Train\.ipynb was suspended to disk \(5\.0 GiB, criu\)/
    );
  });
  it('announces a finished restore and where', () => {
    const n = transitionNotice(
      kernel({ state: 'restoring' }),
      kernel({ state: 'running', gpu: GPU }),
      label
    );
    assert.equal(n?.type, 'success');
    assert.match(n!.message, /restored on GPU 0 \(NVIDIA H200\)/);
    const cpu = transitionNotice(
      kernel({ state: 'suspended' }),
      kernel(),
      label
    );
    assert.match(cpu!.message, /restored on the CPU/);
  });
  it('explains a failed suspend and offers what to do', () => {
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({ state: 'running', error: 'CRIU is not installed' }),
      label
    );
    assert.equal(n?.type, 'error');
    assert.match(
      n!.message,
      /^Suspend of Train\.ipynb failed; the kernel keeps running\. CRIU is not installed\. Retry/
    );
    assert.match(n!.message, /gpucr doctor/);
    assert.deepEqual(n!.actions, ['retry-suspend', 'doctor']);
  });
  it("uses the server's hint as what to do", () => {
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({
        state: 'running',
        error: 'CRIU cannot dump a kernel with an open TCP connection.',
        hint: 'Close the connection, or use the snapshot engine.'
      }),
      label
    );
    assert.match(
      n!.message,
      /open TCP connection\. Close the connection, or use the snapshot engine\.$/
    );
    assert.deepEqual(n!.actions, [
      'retry-suspend',
      'suspend-snapshot',
      'doctor'
    ]);
  });
  it('says how long an operation took', () => {
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({
        state: 'suspended',
        checkpoint: CHECKPOINT,
        timings: { total: 2.34 }
      }),
      label
    );
    assert.match(n!.message, /suspended to disk in 2\.3 s \(5\.0 GiB, criu\)/);
  });
  it('explains a failed restore and offers what to do', () => {
    const n = transitionNotice(
      kernel({ state: 'restoring' }),
      kernel({ state: 'suspended', error: 'no GPU with 80 GiB free' }),
      label
    );
    assert.equal(n?.type, 'error');
    assert.match(
      n!.message,
      /^Restore of Train\.ipynb failed; its checkpoint is kept\. no GPU with 80 GiB free\. Retry/
    );
    assert.deepEqual(n!.actions, ['retry-resume', 'resume-other-gpu']);
  });
  it('does not repeat the same error', () => {
    const failed = kernel({ error: 'boom' });
    assert.equal(transitionNotice(failed, { ...failed }, label), null);
  });
  it('warns when an operation ends without result', () => {
    assert.equal(
      transitionNotice(kernel({ state: 'suspending' }), kernel(), label)?.type,
      'warning'
    );
    assert.equal(
      transitionNotice(
        kernel({ state: 'restoring' }),
        kernel({ state: 'suspended' }),
        label
      )?.type,
      'warning'
    );
  });
  it('announces an idle suspend seen only by polling', () => {
    const n = transitionNotice(kernel(), kernel({ state: 'suspended' }), label);
    assert.equal(n?.type, 'success');
  });
});
