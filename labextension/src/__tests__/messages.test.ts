import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  busyNotice,
  debuggerNotice,
  describeKernelState,
  doctorHeadline,
  engineLabel,
  formatLost,
  kernelLabel,
  kindLabel,
  plainError,
  reasonLabel,
  replaceQuestion,
  shutdownLines,
  shutdownQuestion,
  shutdownSummary,
  TOAST_MAX,
  transitionNotice,
  trashWarning
} from '../messages';
import { isDebuggerRefusal } from '../state';
import { CHECKPOINT, GPU, kernel, NOW } from './fixtures';

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

describe('kernel names', () => {
  it('labels kernels by notebook', () => {
    assert.equal(
      kernelLabel('5f1c0000-aaaa', 'dir/Train.ipynb'),
      'Train.ipynb'
    );
    assert.equal(kernelLabel('5f1c0000-aaaa', null), 'kernel 5f1c0000');
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
  it("says a failed restore's cause first and offers only what can work", () => {
    const suspended = kernel({ state: 'suspended', checkpoint: CHECKPOINT });
    const damaged = transitionNotice(
      kernel({ state: 'restoring' }),
      kernel({
        state: 'suspended',
        checkpoint: CHECKPOINT,
        error:
          'Checkpoint 590a9737-4c1e-4e55-9c2f-0e0d1f2a3b4c-20261130-181642-aaf3e3 is damaged: pages-1.img: checksum mismatch.',
        summary: 'The saved state is damaged',
        retryable: false
      }),
      label
    );
    assert.equal(
      damaged!.message,
      'The saved state is damaged. Train.ipynb was not restored.'
    );
    assert.deepEqual(damaged!.actions, ['details', 'start-fresh']);
    const port = transitionNotice(
      kernel({ state: 'restoring' }),
      {
        ...suspended,
        kind: 'gpu',
        error:
          "CRIU could not restore '590a9737': 11709: Error (criu/sk-inet.c:1): Can't bind inet socket",
        summary: 'Port 43463 is used by PID 22484',
        retryable: true
      },
      label,
      { gpus: 2 }
    );
    assert.equal(
      port!.message,
      'Port 43463 is used by PID 22484. Train.ipynb was not restored; its saved state is kept.'
    );
    assert.deepEqual(port!.actions, [
      'details',
      'retry-resume',
      'resume-other-gpu',
      'start-fresh'
    ]);
    // One GPU, or a CPU kernel: no GPU to choose.
    for (const [kind, gpus] of [
      ['gpu', 1],
      ['cpu', 2]
    ] as const) {
      const n = transitionNotice(
        kernel({ state: 'restoring' }),
        { ...suspended, kind, error: 'failed', retryable: true },
        label,
        { gpus }
      );
      assert.deepEqual(n!.actions, ['details', 'retry-resume', 'start-fresh']);
    }
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
  it('says why a kernel was suspended when the host memory budget was passed', () => {
    const before = kernel({ state: 'suspending', checkpoint: CHECKPOINT });
    const full = kernel({
      state: 'suspended',
      checkpoint: { ...CHECKPOINT, id: 'ckpt-3', reason: 'memory' }
    });
    assert.match(
      transitionNotice(before, full, label)!.message,
      /^Train\.ipynb was idle, so it was suspended to disk: host memory was needed by other kernels/
    );
    assert.equal(reasonLabel('memory'), 'host memory was needed');
    assert.equal(reasonLabel('gpu-memory'), 'GPU memory was needed');
    assert.match(
      transitionNotice(
        before,
        kernel({
          state: 'suspended',
          checkpoint: { ...CHECKPOINT, id: 'ckpt-4', reason: 'gpu-memory' }
        }),
        label
      )!.message,
      /^Train\.ipynb was idle, so it was suspended to disk: GPU memory was needed by other kernels/
    );
    assert.equal(reasonLabel('room'), 'made room for another kernel');
    assert.match(
      describeKernelState(full, NOW).title,
      /; suspended: host memory was needed\. Run a cell/
    );
    assert.doesNotMatch(
      describeKernelState(
        kernel({
          state: 'suspended',
          checkpoint: { ...CHECKPOINT, reason: 'manual' }
        }),
        NOW
      ).title,
      /suspended:/
    );
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
      'No GPU with 80 GiB free. Train.ipynb was not restored; its saved state is kept.'
    );
    assert.deepEqual(n!.actions, ['details', 'retry-resume', 'start-fresh']);
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
      24,
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
    assert.equal(
      doctorHeadline({ ok: false, checks: [bad, { ...bad, name: 'c' }] }),
      '2 checks fail'
    );
  });
  it('counts notes (no GPU, a tuning hint) as working, not failing', () => {
    // A CPU machine where suspend and restore work, as the server reports it.
    const checks = [
      { name: 'criu', ok: true, severity: 'ok' as const },
      {
        name: 'nvidia driver',
        ok: false,
        required: false,
        severity: 'note' as const
      },
      {
        name: 'freed memory',
        ok: false,
        required: false,
        severity: 'note' as const
      }
    ];
    assert.equal(
      doctorHeadline({ ok: true, checks }),
      'Everything works (2 notes)'
    );
    assert.equal(
      doctorHeadline({
        ok: false,
        checks: [
          ...checks,
          { name: 'criu check', ok: false, severity: 'fail' as const }
        ]
      }),
      '1 check fails'
    );
    // A server without severities: an optional check that does not hold is a note.
    assert.equal(
      doctorHeadline({
        ok: true,
        checks: [{ name: 'b', ok: false, required: false }]
      }),
      'Everything works (1 note)'
    );
  });
});

describe('shutting down several kernels', () => {
  const suspendedState = kernel({ state: 'suspended', checkpoint: CHECKPOINT });
  const lines = shutdownLines(
    [
      { kernelId: 'a', label: 'live.ipynb', state: kernel() },
      { kernelId: 'b', label: 'train.ipynb', state: suspendedState },
      { kernelId: 'c', label: 'kernel 12345678', state: undefined }
    ],
    24
  );

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
    const all = shutdownSummary(lines, [], 24);
    assert.equal(
      all.message,
      'Shut down 3 kernels. The saved state of train.ipynb is in the trash for 24 h.'
    );
    assert.equal(all.type, 'success');
    assert.equal(all.trashed, true);
    assert.equal(all.details, null);
    assert.equal(
      shutdownSummary(lines.slice(0, 1), [], 24).message,
      'Shut down live.ipynb.'
    );
    const twoTrashed = shutdownSummary(
      [lines[1], { ...lines[1], label: 'x' }],
      [],
      24
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
      ],
      24
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
