import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  busyNotice,
  canResume,
  canSuspend,
  debuggerNotice,
  describeKernelState,
  doctorHeadline,
  engineLabel,
  formatLost,
  groupForPanel,
  isDebuggerRefusal,
  isTransient,
  kernelLabel,
  kindLabel,
  mergeEvent,
  plainError,
  PollOrder,
  replaceQuestion,
  shutdownLines,
  shutdownQuestion,
  shutdownSummary,
  stateChanged,
  TOAST_MAX,
  transitionNotice,
  trashWarning
} from '../state';
import type { ICheckpoint, IKernelState } from '../types';

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
    assert.equal(d.label, 'Suspending… writing image 1.0 GiB (25%)');
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
    assert.match(d.title, /5\.0 GiB, whole process, NVIDIA H200/);
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

describe('transitionNotice', () => {
  const label = 'Train.ipynb';
  const T0 = Date.parse('2026-11-30T18:00:00Z') / 1000;
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
  it('announces a finished suspend with size and engine in plain words', () => {
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({ state: 'suspended', checkpoint: CHECKPOINT }),
      label
    );
    assert.equal(n?.type, 'success');
    assert.match(
      n!.message,
      /Train\.ipynb was suspended to disk \(5\.0 GiB, whole process\)/
    );
    assert.doesNotMatch(n!.message, /criu/);
  });
  it('announces a restore from the REST fields: how long, where, what was lost', () => {
    const n = transitionNotice(
      kernel({ state: 'restoring', restored_at: null }),
      kernel({
        state: 'running',
        gpu: { ...GPU, index: 1 },
        restored_at: T0,
        suspended_for: 180,
        lost: [{ name: 'gen', type: 'generator', reason: 'cannot pickle' }]
      }),
      label
    );
    assert.equal(
      n!.message,
      'Train.ipynb was restored from disk after 3 min (onto GPU 1); not kept: gen (generator)'
    );
    assert.equal(n!.type, 'warning');
    assert.deepEqual(n!.actions, ['details']);
    const cpu = transitionNotice(
      kernel({ state: 'suspended', restored_at: T0 - 600 }),
      kernel({ restored_at: T0, suspended_for: 42 }),
      label
    );
    assert.equal(
      cpu!.message,
      'Train.ipynb was restored from disk after 42 s (onto the CPU).'
    );
    assert.equal(cpu!.type, 'success');
  });
  it('says the variables are gone after a restart of a suspended kernel', () => {
    const n = transitionNotice(
      kernel({ state: 'suspended', restored_at: T0 }),
      kernel({ restored_at: T0 }),
      label
    );
    assert.match(n!.message, /fresh kernel: its variables are gone/);
    assert.doesNotMatch(n!.message, /restored/);
  });
  it('never says "did not complete" after a restore that worked', () => {
    // A late event or poll says "suspended" after "restoring": no warning.
    assert.equal(
      transitionNotice(
        kernel({ state: 'restoring' }),
        kernel({ state: 'suspended' }),
        label
      ),
      null
    );
    assert.equal(
      transitionNotice(kernel({ state: 'suspending' }), kernel(), label),
      null
    );
  });
  it('explains a failed suspend briefly, details behind an action', () => {
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({
        state: 'running',
        error: 'CRIU cannot dump a kernel with an open TCP connection.',
        hint: 'Close the connection, or use the snapshot engine.'
      }),
      label
    );
    assert.equal(n?.type, 'error');
    assert.equal(
      n!.message,
      'Suspend of Train.ipynb failed; it keeps running. CRIU cannot dump a kernel with an open TCP connection.'
    );
    assert.deepEqual(n!.actions, [
      'details',
      'retry-suspend',
      'suspend-snapshot',
      'doctor'
    ]);
  });
  it('fits every message in a toast', () => {
    const long = 'x'.repeat(400);
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({ error: long }),
      'a-very-long-notebook-name-that-goes-on-and-on-and-on.ipynb'
    );
    assert.ok(n!.message.length <= TOAST_MAX);
    const lost = Array.from({ length: 30 }, (_, i) => ({
      name: `variable_${i}`,
      type: 'generator'
    }));
    const r = transitionNotice(
      kernel({ state: 'restoring' }),
      kernel({ restored_at: T0, suspended_for: 99999, lost }),
      label
    );
    assert.ok(r!.message.length <= TOAST_MAX, r!.message);
    assert.match(r!.message, /and \d+ more$/);
  });
  it('waits for the new checkpoint before announcing a suspend', () => {
    // The event says "suspended" first, with the checkpoint of the last suspend.
    const before = kernel({ state: 'suspending', checkpoint: CHECKPOINT });
    const fromEvent = { ...before, state: 'suspended' as const };
    assert.equal(transitionNotice(before, fromEvent, label), null);
    const full = kernel({
      state: 'suspended',
      checkpoint: { ...CHECKPOINT, id: 'ckpt-2', reason: 'idle' }
    });
    const n = transitionNotice(fromEvent, full, label);
    assert.equal(
      n?.message,
      'Train.ipynb was idle, so it was suspended to disk (5.0 GiB, whole process). Run a cell to bring it back.'
    );
    assert.equal(transitionNotice(full, { ...full }, label), null);
  });
  it('says nothing new when a failed restore leaves the kernel suspended', () => {
    assert.equal(
      transitionNotice(
        kernel({ state: 'restoring', checkpoint: null }),
        kernel({ state: 'suspended', checkpoint: CHECKPOINT }),
        label
      ),
      null
    );
  });
  it('says how long a suspend took', () => {
    const n = transitionNotice(
      kernel({ state: 'suspending' }),
      kernel({
        state: 'suspended',
        checkpoint: CHECKPOINT,
        timings: { total: 2.34 }
      }),
      label
    );
    assert.match(
      n!.message,
      /suspended to disk in 2\.3 s \(5\.0 GiB, whole process\)/
    );
  });
  it('explains a failed restore and offers what to do', () => {
    const n = transitionNotice(
      kernel({ state: 'restoring' }),
      kernel({ state: 'suspended', error: 'no GPU with 80 GiB free' }),
      label
    );
    assert.equal(n?.type, 'error');
    assert.equal(
      n!.message,
      'Restore of Train.ipynb failed; its saved state is kept. no GPU with 80 GiB free.'
    );
    assert.deepEqual(n!.actions, [
      'details',
      'retry-resume',
      'resume-other-gpu'
    ]);
  });
  it('does not repeat the same error', () => {
    const failed = kernel({ error: 'boom' });
    assert.equal(transitionNotice(failed, { ...failed }, label), null);
  });
  it('announces a pending suspend with Cancel, and its cancellation', () => {
    const pending = transitionNotice(
      kernel(),
      kernel({ state: 'suspend-pending' }),
      label
    );
    assert.equal(pending?.type, 'info');
    assert.deepEqual(pending!.actions, ['cancel-suspend']);
    const cancelled = transitionNotice(
      kernel({ state: 'suspend-pending' }),
      kernel(),
      label
    );
    assert.match(cancelled!.message, /cancelled/);
    const done = transitionNotice(
      kernel({ state: 'suspend-pending' }),
      kernel({ state: 'suspended', checkpoint: CHECKPOINT }),
      label
    );
    assert.equal(done?.type, 'success');
  });
  it('announces an idle suspend seen only by polling', () => {
    const n = transitionNotice(
      kernel(),
      kernel({
        state: 'suspended',
        checkpoint: { ...CHECKPOINT, reason: 'idle' }
      }),
      label
    );
    assert.equal(n?.type, 'success');
    assert.match(n!.message, /^Train\.ipynb was idle, so it was suspended/);
  });
});

describe('busy refusal', () => {
  it('is a short warning naming the notebook, with both ways out', () => {
    const n = busyNotice('Train.ipynb');
    assert.equal(n.type, 'warning');
    assert.equal(
      n.message,
      'Train.ipynb is running a cell, so it was not suspended.'
    );
    assert.deepEqual(n.actions, ['suspend-when-idle', 'interrupt-and-suspend']);
    assert.equal(n.autoClose, false);
    assert.ok(busyNotice('y'.repeat(300)).message.length <= TOAST_MAX);
  });
});

describe('words', () => {
  it('says what the engines keep in plain words', () => {
    assert.equal(engineLabel('criu'), 'whole process');
    assert.equal(engineLabel('snapshot'), 'saved variables');
    assert.equal(engineLabel(null), '');
  });
  it('says CPU for CPU kernels and the GPU model for GPU ones', () => {
    assert.equal(kindLabel('cpu', null), 'CPU');
    assert.equal(kindLabel(undefined, null), 'CPU');
    assert.equal(kindLabel('gpu', 'NVIDIA H200'), 'NVIDIA H200');
    assert.equal(kindLabel('gpu', null), 'GPU');
  });
  it('describes a suspended CPU kernel without GPU words', () => {
    const d = describeKernelState(
      kernel({
        state: 'suspended',
        kind: 'cpu',
        checkpoint: { ...CHECKPOINT, gpu_model: null },
        suspended_at: '2026-11-30T18:05:00Z'
      }),
      NOW
    );
    assert.match(d.title, /5\.0 GiB, whole process, CPU/);
    assert.doesNotMatch(d.title, /GPU|criu/);
  });
  it('describes a pending suspend', () => {
    const d = describeKernelState(kernel({ state: 'suspend-pending' }), NOW);
    assert.equal(d.label, 'Suspend after this cell');
    assert.equal(d.kind, 'busy');
  });
  it('lists what was lost, shortened', () => {
    assert.equal(formatLost([]), '');
    assert.equal(
      formatLost([
        { name: 'gen', type: 'generator' },
        { name: 'f', type: 'file' }
      ]),
      'gen (generator), f (file)'
    );
    assert.equal(
      formatLost(
        [
          { name: 'aaaaaaaaaa', type: 'generator' },
          { name: 'bbbbbbbbbb', type: 'generator' },
          { name: 'cccccccccc', type: 'generator' }
        ],
        30
      ),
      'aaaaaaaaaa (generator) and 2 more'
    );
  });
  it('warns what a restart or shutdown does to the saved state', () => {
    const saved = new Date(2026, 10, 30, 14, 2);
    const text = trashWarning(
      'train.ipynb',
      kernel({
        state: 'suspended',
        checkpoint: CHECKPOINT,
        suspended_at: saved.getTime() / 1000
      }),
      new Date(2026, 10, 30, 15, 0)
    );
    assert.equal(
      text,
      'The suspended state of train.ipynb (5.0 GiB, saved at 14:02) goes to the trash for 24 h; you can bring it back from the Suspended kernels panel.'
    );
  });
  it('puts server errors in plain words: the name instead of the kernel id, no HTTP status', () => {
    assert.equal(
      plainError(
        'Kernel 601e633f-1c2d-4e5f-8a9b-0c1d2e3f4a5b is being restored from this checkpoint',
        'Try again later.',
        'train.ipynb'
      ),
      'train.ipynb is being restored from this checkpoint. Try again later.'
    );
    assert.equal(plainError('Disk full.', null, 'x.ipynb'), 'Disk full.');
  });
  it('asks before a trashed state replaces the kernel a restart started', () => {
    const running = replaceQuestion('train.ipynb', kernel());
    assert.match(
      running,
      /^train\.ipynb was restarted after this state was saved, and a new kernel runs in it now\./
    );
    assert.match(running, /what it holds is lost/);
    assert.match(
      replaceQuestion('train.ipynb', kernel({ state: 'suspended' })),
      /its own saved state goes to the trash/
    );
  });
  it("recognizes a suspended kernel's refusal to start the debugger", () => {
    const reply = (command: string, success: boolean) => ({
      header: { msg_type: 'debug_reply' },
      content: { command, success }
    });
    assert.equal(isDebuggerRefusal(reply('initialize', false)), true);
    assert.equal(isDebuggerRefusal(reply('initialize', true)), false);
    assert.equal(isDebuggerRefusal(reply('debugInfo', false)), false);
    assert.equal(
      isDebuggerRefusal({
        header: { msg_type: 'execute_reply' },
        content: { command: 'initialize', success: false }
      }),
      false
    );
    const notice = debuggerNotice('train.ipynb');
    assert.equal(
      notice.message,
      'The debugger needs train.ipynb running: run a cell in it or resume it, then turn the debugger on again.'
    );
    assert.deepEqual(notice.actions, ['resume']);
    assert.equal(notice.autoClose, false);
  });
  it('heads the doctor report with what fails', () => {
    const ok = { name: 'a', ok: true };
    const bad = { name: 'b', ok: false };
    assert.equal(
      doctorHeadline({ ok: true, checks: [ok] }),
      'Everything works'
    );
    // The server's overall "ok" can be true with an optional check failing.
    assert.equal(
      doctorHeadline({ ok: true, checks: [ok, bad] }),
      '1 check fails'
    );
    assert.equal(
      doctorHeadline({ ok: false, checks: [bad, { ...bad, name: 'c' }] }),
      '2 checks fail'
    );
  });
});

describe('shutting down several kernels', () => {
  const suspendedState = kernel({ state: 'suspended', checkpoint: CHECKPOINT });
  const lines = shutdownLines([
    { kernelId: 'a', label: 'live.ipynb', state: kernel() },
    { kernelId: 'b', label: 'train.ipynb', state: suspendedState },
    { kernelId: 'c', label: 'kernel 12345678', state: undefined }
  ]);

  it('says what happens to each kernel', () => {
    assert.deepEqual(
      lines.map(l => [l.label, l.fate, l.trashed]),
      [
        ['live.ipynb', 'running: its variables are lost', false],
        [
          'train.ipynb',
          'suspended (5.0 GiB): its saved state goes to the trash for 24 h',
          true
        ],
        ['kernel 12345678', 'running: its variables are lost', false]
      ]
    );
    assert.equal(
      shutdownQuestion(lines),
      "Shut down these 3 kernels? A suspended kernel's saved state can be brought back from the trash in the Suspended kernels panel."
    );
    assert.equal(shutdownQuestion(lines.slice(0, 1)), 'Shut down this kernel?');
  });

  it('sums up in one notice', () => {
    const all = shutdownSummary(lines, []);
    assert.equal(
      all.message,
      'Shut down 3 kernels. The saved state of train.ipynb is in the trash for 24 h.'
    );
    assert.equal(all.type, 'success');
    assert.equal(all.trashed, true);
    assert.equal(all.details, null);
    assert.equal(
      shutdownSummary(lines.slice(0, 1), []).message,
      'Shut down live.ipynb.'
    );
    const twoTrashed = shutdownSummary(
      [lines[1], { ...lines[1], label: 'x' }],
      []
    );
    assert.match(
      twoTrashed.message,
      /The saved states of 2 suspended kernels are in the trash for 24 h\.$/
    );
  });

  it('names what could not be shut down, and why', () => {
    const some = shutdownSummary(
      [lines[0]],
      [
        { line: lines[1], error: 'Disk full' },
        { line: lines[2], error: 'Gone' }
      ]
    );
    assert.equal(some.type, 'warning');
    assert.equal(
      some.message,
      'Shut down 1 of 3 kernels. Could not shut down train.ipynb and 1 more; see Details.'
    );
    assert.equal(
      some.details,
      'train.ipynb: Disk full.\n\nkernel 12345678: Gone.'
    );
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

describe('PollOrder', () => {
  const K = 'kernel-a';

  it('drops a poll asked before an event it is answered after', () => {
    const order = new PollOrder();
    const asked = order.ask(); // GET asked while the kernel is suspended
    order.event(K); // the server's "restoring" event arrives first
    assert.equal(order.isStale(K, asked), true);
  });

  it('keeps a poll asked after the event, and polls of other kernels', () => {
    const order = new PollOrder();
    order.event(K);
    const asked = order.ask();
    assert.equal(order.isStale(K, asked), false);
    const early = new PollOrder();
    const before = early.ask();
    early.event('kernel-b');
    assert.equal(early.isStale(K, before), false);
  });
});
