import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import {
  IKernelTransition,
  KernelStore,
  PollOrder,
  RESTORE_GRACE_MS
} from '../store';
import { formatSince } from '../format';
import { transitionOf } from '../state';
import type { IKernelState, IKernelStateEvent } from '../types';
import { CHECKPOINT, GPU, kernel } from './fixtures';

const K = kernel().kernel_id;

/** A store with a clock the test moves, and the list of changes it emitted. */
function makeStore(): {
  store: KernelStore;
  changes: IKernelTransition[];
  advance: (ms: number) => void;
} {
  let now = 1_000_000;
  const store = new KernelStore(() => now);
  const changes: IKernelTransition[] = [];
  store.changed.connect((_, change) => changes.push(change));
  return { store, changes, advance: ms => (now += ms) };
}

function event(
  state: IKernelStateEvent['state'],
  fields: Partial<IKernelStateEvent> = {}
): IKernelStateEvent {
  return { kernel_id: K, state, phase: '', ...fields };
}

/** A store that knows kernel K in `state`, from a poll. */
function storeWith(state: IKernelState) {
  const made = makeStore();
  made.store.applyPolled(K, state, made.store.ask());
  made.changes.length = 0;
  return made;
}

const suspended = kernel({
  state: 'suspended',
  checkpoint: CHECKPOINT,
  suspended_at: 1796061600
});

describe('KernelStore: a poll against an event', () => {
  it('never lets a poll asked before an event override it', () => {
    const { store } = storeWith(suspended);
    const asked = store.ask(); // GET sent while the kernel is suspended
    store.applyEvent(event('restoring')); // the event overtakes its answer
    store.applyPolled(K, suspended, asked);
    assert.equal(store.get(K)?.state, 'restoring');
  });

  it('applies a poll asked after the event', () => {
    const { store } = storeWith(suspended);
    store.applyEvent(event('restoring'));
    store.applyPolled(K, kernel({ gpu: GPU }), store.ask());
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(store.get(K)?.gpu?.name, 'NVIDIA H200');
  });

  it("applies an older poll of another kernel: events order their own kernel's polls only", () => {
    const { store } = storeWith(suspended);
    const asked = store.ask();
    store.applyEvent(event('restoring'));
    store.applyPolled('other', kernel({ kernel_id: 'other' }), asked);
    assert.equal(store.get('other')?.state, 'running');
  });

  it('never lets a 404 asked before an event remove the kernel', () => {
    const { store } = makeStore();
    const asked = store.ask();
    store.applyEvent(event('running')); // a kernel that just started
    store.applyGone(K, asked);
    assert.equal(store.get(K)?.state, 'running');
    store.applyGone(K, store.ask());
    assert.equal(store.get(K), undefined);
  });

  it('never lets a list asked before an event override or remove the kernel', () => {
    const { store } = storeWith(kernel());
    const asked = store.ask();
    store.applyEvent(event('suspending'));
    store.applyList([kernel()], asked);
    assert.equal(store.get(K)?.state, 'suspending');
    store.applyList([], asked);
    assert.equal(store.get(K)?.state, 'suspending');
    store.applyList([], store.ask());
    assert.equal(store.get(K), undefined, 'a newer list without it: gone');
  });
});

describe("KernelStore: this browser's operation", () => {
  it('shows the operation at once, and one operation at a time per kernel', () => {
    const { store } = storeWith(kernel({ error: 'the last one failed' }));
    const previous = store.begin(K, 'suspend', 'suspending');
    assert.equal(previous?.state, 'running');
    assert.equal(store.get(K)?.state, 'suspending');
    assert.equal(
      store.get(K)?.error,
      null,
      'a new operation clears the old error'
    );
    assert.equal(store.isBusy(K), true);
    assert.throws(
      () => store.begin(K, 'resume', 'restoring'),
      /An operation on this kernel is already in progress\./
    );
    store.end(K);
    assert.equal(store.isBusy(K), false);
  });

  it('shows nothing for a suspend when idle until the server answers', () => {
    const { store, changes } = storeWith(kernel());
    store.begin(K, 'suspend', null);
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(changes.length, 0);
    store.end(K);
    store.applyReply(
      K,
      kernel({ state: 'suspend-pending', pending_since: 1796061600 })
    );
    assert.equal(store.get(K)?.state, 'suspend-pending');
  });

  it('drops a poll that raced the POST, but shows its progress', () => {
    const { store } = storeWith(kernel());
    store.begin(K, 'suspend', 'suspending');
    store.applyPolled(K, kernel(), store.ask()); // asked before the server marked it
    assert.equal(store.get(K)?.state, 'suspending');
    const progress = { phase: 'writing', bytes_done: 1, bytes_total: 4 };
    store.applyPolled(
      K,
      kernel({ state: 'suspending', progress }),
      store.ask()
    );
    assert.deepEqual(store.get(K)?.progress, progress);
  });

  it('applies events while the POST is in flight', () => {
    const { store } = storeWith(kernel({ gpu: GPU }));
    store.begin(K, 'suspend', 'suspending');
    store.applyEvent(
      event('suspending', { phase: 'writing', bytes_done: 1, bytes_total: 4 })
    );
    assert.equal(store.get(K)?.progress?.bytes_done, 1);
    store.applyEvent(event('suspended'));
    assert.equal(store.get(K)?.state, 'suspended');
  });

  it('applies the POST reply over an event that arrived first', () => {
    const { store } = storeWith(kernel({ gpu: GPU }));
    store.begin(K, 'suspend', 'suspending');
    store.applyEvent(event('suspended')); // no size, no checkpoint yet
    assert.equal(store.get(K)?.checkpoint, null);
    store.end(K);
    const current = store.applyReply(K, suspended);
    assert.equal(current.checkpoint?.id, 'ckpt-1');
    assert.equal(store.get(K)?.checkpoint?.size, CHECKPOINT.size);
  });

  it('applies the POST reply even when an event said otherwise before it', () => {
    const { store } = storeWith(suspended);
    store.begin(K, 'resume', 'restoring');
    store.applyEvent(event('suspended', { error: 'No GPU free' }));
    store.end(K);
    store.applyReply(K, kernel({ gpu: GPU, restored_at: 1796061700 }));
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(store.get(K)?.error, null);
  });

  it('merges an event that comes after the reply into the full state', () => {
    const { store } = storeWith(kernel());
    store.begin(K, 'suspend', 'suspending');
    store.end(K);
    store.applyReply(K, suspended);
    store.applyEvent(event('suspended'));
    assert.equal(store.get(K)?.checkpoint?.id, 'ckpt-1');
  });

  it('lets polls count again once the POST is answered', () => {
    const { store } = storeWith(kernel());
    store.begin(K, 'suspend', 'suspending');
    store.end(K);
    store.applyReply(K, suspended);
    store.applyPolled(K, kernel(), store.ask()); // restored meanwhile by a cell run
    assert.equal(store.get(K)?.state, 'running');
  });

  it('keeps a kernel whose operation is in flight when a list lacks it, not when a 404 says it is gone', () => {
    const { store } = makeStore();
    store.begin(K, 'suspend', 'suspending'); // a kernel no poll has seen yet
    store.applyList([], store.ask());
    assert.equal(store.get(K)?.state, 'suspending');
    store.applyGone(K, store.ask());
    assert.equal(store.get(K), undefined);
  });

  it('puts the state from before back when the server refused to start', () => {
    const before = kernel({ gpu: GPU });
    const { store } = storeWith(before);
    const previous = store.begin(K, 'suspend', 'suspending');
    store.end(K);
    store.putBack(K, previous);
    assert.deepEqual(store.get(K), previous);
    assert.equal(store.get(K)?.state, 'running');
  });

  it("puts a failure's message and hint into the state the server has now", () => {
    const { store } = storeWith(kernel());
    store.begin(K, 'suspend', 'suspending');
    store.end(K);
    store.applyFailure(
      K,
      kernel({ gpu: GPU }),
      'running',
      'CRIU failed',
      'Try the snapshot engine.'
    );
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(store.get(K)?.gpu?.index, 0);
    assert.equal(store.get(K)?.error, 'CRIU failed');
    assert.equal(store.get(K)?.hint, 'Try the snapshot engine.');
  });

  it("keeps the server's own error and hint over the failure's", () => {
    const { store } = storeWith(suspended);
    store.begin(K, 'resume', 'restoring');
    store.end(K);
    store.applyFailure(
      K,
      { ...suspended, error: 'No GPU with 80 GiB free', hint: 'Free a GPU.' },
      'suspended',
      'HTTP 500',
      'Internal error'
    );
    assert.equal(store.get(K)?.error, 'No GPU with 80 GiB free');
    assert.equal(store.get(K)?.hint, 'Free a GPU.');
  });

  it('falls back to the state the kernel stays in when the server cannot be asked', () => {
    const { store } = storeWith(suspended);
    store.begin(K, 'resume', 'restoring');
    store.end(K);
    store.applyFailure(K, undefined, 'suspended', 'Network error', null);
    assert.equal(store.get(K)?.state, 'suspended');
    assert.equal(store.get(K)?.checkpoint?.id, 'ckpt-1');
    assert.equal(store.get(K)?.error, 'Network error');
    assert.equal(store.get(K)?.hint, null);
  });

  it('adds no error to a kernel that started another operation meanwhile', () => {
    const { store } = storeWith(suspended);
    store.begin(K, 'resume', 'restoring');
    store.end(K);
    store.applyFailure(
      K,
      { ...suspended, state: 'restoring' },
      'suspended',
      'Timed out',
      null
    );
    assert.equal(store.get(K)?.state, 'restoring');
    assert.equal(store.get(K)?.error, null);
  });
});

describe('KernelStore: a cell run in a suspended kernel', () => {
  it('shows restoring, and keeps it against polls that still say suspended, for the grace only', () => {
    const { store, advance } = storeWith(suspended);
    store.markRestoring(K);
    assert.equal(store.get(K)?.state, 'restoring');
    store.applyPolled(K, suspended, store.ask());
    assert.equal(store.get(K)?.state, 'restoring');
    advance(RESTORE_GRACE_MS + 1);
    store.applyPolled(K, suspended, store.ask());
    assert.equal(store.get(K)?.state, 'suspended');
  });

  it('applies a poll saying the restore failed at once', () => {
    const { store } = storeWith(suspended);
    store.markRestoring(K);
    store.applyPolled(
      K,
      { ...suspended, error: 'Restore failed' },
      store.ask()
    );
    assert.equal(store.get(K)?.state, 'suspended');
    assert.equal(store.get(K)?.error, 'Restore failed');
  });

  it('ends the guess with any other poll answer', () => {
    const { store } = storeWith(suspended);
    store.markRestoring(K);
    store.applyPolled(K, kernel(), store.ask());
    assert.equal(store.get(K)?.state, 'running');
    store.applyPolled(K, suspended, store.ask()); // suspended again (idle culler)
    assert.equal(store.get(K)?.state, 'suspended');
  });

  it('ends the guess with an event: the server speaks for itself', () => {
    const { store } = storeWith(suspended);
    store.markRestoring(K);
    store.applyEvent(event('restoring', { phase: 'reading' }));
    store.applyPolled(K, suspended, store.ask());
    assert.equal(store.get(K)?.state, 'suspended');
  });

  it('guesses only for a suspended kernel', () => {
    const { store, changes } = storeWith(kernel());
    store.markRestoring(K);
    store.markRestoring('unknown');
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(changes.length, 0);
  });
});

describe('KernelStore: changes', () => {
  it('tells a change once, with the state before and after', () => {
    const { store, changes } = makeStore();
    store.applyPolled(K, kernel(), store.ask());
    store.applyPolled(K, kernel(), store.ask());
    store.applyEvent(event('suspending'));
    assert.deepEqual(
      changes.map(c => [c.previous?.state, c.current?.state]),
      [
        [undefined, 'running'],
        ['running', 'suspending']
      ]
    );
    assert.equal(store.anyTransient, true);
  });
});

describe('PollOrder', () => {
  const A = 'kernel-a';

  it('drops a poll asked before an event it is answered after', () => {
    const order = new PollOrder();
    const asked = order.ask(); // GET asked while the kernel is suspended
    order.event(A); // the server's "restoring" event arrives first
    assert.equal(order.isStale(A, asked), true);
  });

  it('keeps a poll asked after the event, and polls of other kernels', () => {
    const order = new PollOrder();
    order.event(A);
    const asked = order.ask();
    assert.equal(order.isStale(A, asked), false);
    const early = new PollOrder();
    const before = early.ask();
    early.event('kernel-b');
    assert.equal(early.isStale(A, before), false);
  });
});

describe('KernelStore: a kernel brought back from the trash', () => {
  const TRASHED = { ...CHECKPOINT, created: 1796061000 };
  const back = kernel({
    state: 'suspended',
    checkpoint: TRASHED,
    suspended_at: 1796061590 // the server's time, later than the checkpoint
  });

  for (const order of ['event first', 'reply first']) {
    it(`is no fresh suspend and is dated by its checkpoint (${order})`, () => {
      const { store, changes } = makeStore();
      store.expectFromTrash(K);
      if (order === 'event first') {
        store.applyEvent(event('suspended', { phase: 'done' }));
        store.applyReply(K, back);
      } else {
        store.applyReply(K, back);
        store.applyEvent(event('suspended', { phase: 'done' }));
      }
      store.applyPolled(K, back, store.ask());
      const told = changes.map(c =>
        c.current ? transitionOf(c.previous, c.current) : null
      );
      // transitionOf alone would say 'suspended' when the checkpoint becomes
      // known after the event: the change carries fromTrash for the notifier.
      for (const change of changes) {
        if (change.current?.checkpoint) {
          assert.equal(change.fromTrash, true);
        }
      }
      assert.ok(told.length >= 1);
      assert.equal(store.get(K)?.suspended_at, 1796061000);
      assert.equal(
        formatSince(store.get(K)?.suspended_at, new Date(1796061000e3 + 600e3)),
        '10 min ago'
      );
    });
  }

  it('tells a later restore, restore failure or new suspend as usual', () => {
    const { store, changes } = makeStore();
    store.expectFromTrash(K);
    store.applyReply(K, back);
    store.applyEvent(
      event('suspended', { error: 'the saved state is damaged' })
    );
    assert.equal(
      changes.at(-1)?.fromTrash,
      true,
      'still in its old checkpoint'
    );
    assert.equal(
      transitionOf(changes.at(-1)?.previous, changes.at(-1)!.current!),
      'restore-failed'
    );
    store.applyEvent(event('restoring'));
    store.applyEvent(event('running', { restored_at: 1796062000, error: '' }));
    store.applyPolled(K, kernel(), store.ask());
    store.applyEvent(event('suspended'));
    store.applyPolled(
      K,
      kernel({
        state: 'suspended',
        checkpoint: { ...CHECKPOINT, id: 'ckpt-2' },
        suspended_at: 1796063000
      }),
      store.ask()
    );
    const last = changes.at(-1)!;
    assert.equal(last.fromTrash, undefined);
    assert.equal(transitionOf(last.previous, last.current!), 'suspended');
    assert.equal(store.get(K)?.suspended_at, 1796063000, "the server's time");
  });

  it('waits for its checkpoint through a poll of the kernel a restart started', () => {
    const { store, changes } = storeWith(kernel());
    store.expectFromTrash(K);
    store.applyPolled(K, kernel(), store.ask());
    store.applyGone(K, store.ask()); // the restarted kernel is shut down
    store.applyEvent(event('suspended'));
    store.applyPolled(K, back, store.ask());
    assert.equal(changes.at(-1)?.fromTrash, true);
    assert.equal(store.get(K)?.suspended_at, 1796061000);
  });

  it('forgets a failed trash restore', () => {
    const { store, changes } = storeWith(kernel());
    store.expectFromTrash(K);
    store.cancelFromTrash(K);
    store.applyPolled(K, back, store.ask());
    assert.equal(changes.at(-1)?.fromTrash, undefined);
    assert.equal(store.get(K)?.suspended_at, 1796061590);
  });
});
