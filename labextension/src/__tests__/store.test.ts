import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { IKernelTransition, KernelStore, PollOrder } from '../store';
import { formatSince } from '../format';
import { fullState, transitionOf } from '../state';
import type { IKernelState, IKernelStateEvent } from '../types';
import { CHECKPOINT, event as stateEvent, GPU, kernel } from './fixtures';

const K = kernel().kernel_id;

/** A store, and the list of changes it emitted. */
function makeStore(): {
  store: KernelStore;
  changes: IKernelTransition[];
} {
  const store = new KernelStore();
  const changes: IKernelTransition[] = [];
  store.changed.connect((_, change) => changes.push(change));
  return { store, changes };
}

/** An event saying kernel K is in `state` (the rest of its state in `fields`). */
function event(
  state: IKernelStateEvent['state'],
  fields: Partial<IKernelStateEvent> = {}
): IKernelStateEvent {
  return stateEvent({ state, phase: '', ...fields });
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

describe('KernelStore: an event is the whole state', () => {
  it('gives a kernel no poll has seen its whole state: nothing to fetch', () => {
    const { store, changes } = makeStore();
    const suspendedWhole = kernel({
      state: 'suspended',
      kind: 'gpu',
      engine: 'criu',
      checkpoint: CHECKPOINT,
      suspended_at: 1796061600,
      notebook_path: 'train.ipynb'
    });
    store.applyEvent(stateEvent(suspendedWhole));
    assert.deepEqual(store.get(K), fullState(K, suspendedWhole));
    assert.equal(changes.length, 1);
    store.applyPolled(K, suspendedWhole, store.ask());
    assert.equal(changes.length, 1, 'a poll after it says the same');
  });

  it('tells a finished suspend from its event alone', () => {
    const { store, changes } = storeWith(kernel({ gpu: GPU }));
    store.applyEvent(event('suspending', { phase: 'trimming', gpu: GPU }));
    store.applyEvent(event('suspended', { checkpoint: CHECKPOINT }));
    const last = changes.at(-1)!;
    assert.equal(transitionOf(last.previous, last.current!), 'suspended');
    assert.equal(store.get(K)?.checkpoint?.size, CHECKPOINT.size);
  });

  it("keeps what only GET fills in: the notebook path, a running kernel's engine", () => {
    const running = kernel({
      notebook_path: 'a.ipynb',
      engine: 'criu',
      engine_reason: 'x'
    });
    const { store, changes } = storeWith(running);
    store.applyEvent(event('running', { phase: 'cancelled' }));
    assert.equal(changes.length, 0, 'no change: it says what the poll said');
    store.applyEvent(event('suspend-pending', { phase: 'pending' }));
    assert.equal(store.get(K)?.notebook_path, 'a.ipynb');
    assert.equal(store.get(K)?.engine, null, 'as GET says while pending');
  });
});

describe("KernelStore: this browser's operation", () => {
  it('shows nothing until the server says it, and one operation at a time per kernel', () => {
    const { store, changes } = storeWith(
      kernel({ error: 'the last one failed' })
    );
    store.begin(K, 'suspend');
    assert.equal(changes.length, 0);
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(store.isBusy(K), true);
    assert.throws(
      () => store.begin(K, 'resume'),
      /An operation on this kernel is already in progress\./
    );
    store.applyEvent(event('suspending', { phase: 'trimming' }));
    assert.equal(store.get(K)?.state, 'suspending');
    assert.equal(store.get(K)?.error, null, 'the server cleared the old error');
    store.end(K);
    assert.equal(store.isBusy(K), false);
  });

  it('applies events while the POST is in flight', () => {
    const { store } = storeWith(kernel({ gpu: GPU }));
    store.begin(K, 'suspend');
    store.applyEvent(
      event('suspending', {
        phase: 'dumping',
        bytes_done: 1,
        bytes_total: 4,
        progress: { phase: 'dumping', bytes_done: 1, bytes_total: 4 }
      })
    );
    assert.equal(store.get(K)?.progress?.bytes_done, 1);
    store.applyEvent(event('suspended', { checkpoint: CHECKPOINT }));
    assert.equal(store.get(K)?.state, 'suspended');
  });

  it('applies the POST reply after the events', () => {
    const { store } = storeWith(kernel({ gpu: GPU }));
    store.begin(K, 'suspend');
    store.applyEvent(event('suspended', { checkpoint: CHECKPOINT }));
    store.end(K);
    const current = store.applyReply(K, suspended);
    assert.equal(current.checkpoint?.id, 'ckpt-1');
    assert.equal(store.get(K)?.suspended_at, suspended.suspended_at);
  });

  it('applies the POST reply even when an event said otherwise before it', () => {
    const { store } = storeWith(suspended);
    store.begin(K, 'resume');
    store.applyEvent(event('suspended', { error: 'No GPU free' }));
    store.end(K);
    store.applyReply(K, kernel({ gpu: GPU, restored_at: 1796061700 }));
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(store.get(K)?.error, null);
  });

  it('drops a poll asked before the POST reply, not one asked after it', () => {
    const { store } = storeWith(kernel());
    store.begin(K, 'suspend');
    const asked = store.ask(); // GET sent while the suspend runs
    store.end(K);
    store.applyReply(K, suspended);
    store.applyPolled(K, kernel({ state: 'suspending' }), asked);
    store.applyList([], asked);
    assert.equal(store.get(K)?.state, 'suspended');
    store.applyPolled(K, kernel(), store.ask()); // restored meanwhile by a cell run
    assert.equal(store.get(K)?.state, 'running');
  });

  it("puts a failure's message and hint into the state the server says after it", () => {
    const { store } = storeWith(kernel());
    store.begin(K, 'suspend');
    store.applyEvent(event('suspending', { phase: 'trimming' }));
    store.end(K);
    store.applyFailure(K, 'CRIU failed', 'Try the snapshot engine.');
    assert.equal(
      store.get(K)?.state,
      'suspending',
      'not over until it says so'
    );
    assert.equal(store.get(K)?.error, null);
    store.applyPolled(K, kernel({ gpu: GPU }), store.ask());
    assert.equal(store.get(K)?.state, 'running');
    assert.equal(store.get(K)?.gpu?.index, 0);
    assert.equal(store.get(K)?.error, 'CRIU failed');
    assert.equal(store.get(K)?.hint, 'Try the snapshot engine.');
    store.applyPolled(K, kernel({ gpu: GPU }), store.ask());
    assert.equal(store.get(K)?.error, null, 'once only');
  });

  it('puts the message into the state known when the server already said it is over', () => {
    const { store, changes } = storeWith(suspended);
    store.begin(K, 'resume');
    store.end(K);
    store.applyFailure(K, 'Network error', null);
    assert.equal(store.get(K)?.state, 'suspended');
    assert.equal(store.get(K)?.checkpoint?.id, 'ckpt-1');
    assert.equal(store.get(K)?.error, 'Network error');
    assert.equal(store.get(K)?.hint, null);
    const last = changes.at(-1)!;
    assert.equal(transitionOf(last.previous, last.current!), 'restore-failed');
  });

  it("keeps the server's own error and hint over the failure's", () => {
    const { store } = storeWith(suspended);
    store.begin(K, 'resume');
    store.applyEvent(event('restoring', { checkpoint: CHECKPOINT }));
    store.end(K);
    store.applyFailure(K, 'HTTP 500', 'Internal error');
    store.applyEvent(
      event('suspended', {
        checkpoint: CHECKPOINT,
        error: 'No GPU with 80 GiB free',
        hint: 'Free a GPU.'
      })
    );
    assert.equal(store.get(K)?.error, 'No GPU with 80 GiB free');
    assert.equal(store.get(K)?.hint, 'Free a GPU.');
  });

  it('forgets the failure of a kernel that is gone', () => {
    const { store } = storeWith(kernel({ state: 'suspending' }));
    store.applyFailure(K, 'Timed out', null);
    store.applyGone(K, store.ask());
    store.applyPolled(K, kernel(), store.ask());
    assert.equal(store.get(K)?.error, null);
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
    order.told(A); // the server's "restoring" event arrives first
    assert.equal(order.isStale(A, asked), true);
  });

  it('keeps a poll asked after the event, and polls of other kernels', () => {
    const order = new PollOrder();
    order.told(A);
    const asked = order.ask();
    assert.equal(order.isStale(A, asked), false);
    const early = new PollOrder();
    const before = early.ask();
    early.told('kernel-b');
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
        store.applyEvent(stateEvent(back));
        store.applyReply(K, back);
      } else {
        store.applyReply(K, back);
        store.applyEvent(stateEvent(back));
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
      stateEvent({ ...back, error: 'the saved state is damaged' })
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
    store.applyEvent(event('restoring', { checkpoint: TRASHED }));
    store.applyEvent(event('running', { restored_at: 1796062000, error: '' }));
    store.applyPolled(K, kernel(), store.ask());
    const again = kernel({
      state: 'suspended',
      checkpoint: { ...CHECKPOINT, id: 'ckpt-2' },
      suspended_at: 1796063000
    });
    store.applyEvent(stateEvent(again));
    store.applyPolled(K, again, store.ask());
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
    store.applyEvent(stateEvent(back));
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
