import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Signal } from '@lumino/signaling';

import { kernelOnItsWay, untilKernel } from '../kernelwait';

/** A session context the way JupyterLab's looks while a new notebook starts its kernel. */
class FakeContext {
  isDisposed = false;
  hasNoKernel = false;
  kernelDisplayStatus = 'initializing';
  session: { kernel: unknown } | null = null;
  kernelChanged = new Signal<this, unknown>(this);
  sessionChanged = new Signal<this, unknown>(this);
  statusChanged = new Signal<this, unknown>(this);
  disposed = new Signal<this, void>(this);

  /** The session request returned: JupyterLab's _handleNewSession. */
  arrive(): void {
    this.session = { kernel: {} };
    this.kernelDisplayStatus = 'connecting';
    this.sessionChanged.emit(null);
    this.kernelChanged.emit(null);
  }
}

const settled = async (p: Promise<unknown>): Promise<boolean> => {
  let done = false;
  void p.then(() => (done = true));
  await new Promise(resolve => setTimeout(resolve, 0));
  return done;
};

describe('kernelOnItsWay', () => {
  it('is true while a pending kernel has no session yet', () => {
    assert.equal(kernelOnItsWay(new FakeContext()), true);
  });

  it('is false once the session has its kernel', () => {
    const ctx = new FakeContext();
    ctx.arrive();
    assert.equal(kernelOnItsWay(ctx), false);
  });

  it('is false when no kernel is pending (JupyterLab then starts one or asks)', () => {
    const ctx = new FakeContext();
    ctx.hasNoKernel = true;
    assert.equal(kernelOnItsWay(ctx), false);
  });

  it('is false for a disposed context', () => {
    const ctx = new FakeContext();
    ctx.isDisposed = true;
    assert.equal(kernelOnItsWay(ctx), false);
  });
});

describe('untilKernel', () => {
  it('resolves at once when the kernel is there', async () => {
    const ctx = new FakeContext();
    ctx.arrive();
    assert.equal(await settled(untilKernel(ctx)), true);
  });

  it('waits for the session, then resolves every waiter in the order they came', async () => {
    const ctx = new FakeContext();
    const order: number[] = [];
    const waits = [1, 2, 3].map(n =>
      untilKernel(ctx).then(() => order.push(n))
    );
    ctx.kernelChanged.emit(null); // _changeKernel's early emission: still no kernel
    assert.equal(await settled(Promise.all(waits)), false);
    ctx.arrive();
    await Promise.all(waits);
    assert.deepEqual(order, [1, 2, 3]);
  });

  it('gives up waiting when the start fails (no kernel pending any more)', async () => {
    const ctx = new FakeContext();
    const wait = untilKernel(ctx);
    ctx.hasNoKernel = true;
    ctx.kernelDisplayStatus = 'unknown';
    ctx.kernelChanged.emit(null);
    assert.equal(await settled(wait), true);
  });

  it('gives up waiting when the notebook is closed', async () => {
    const ctx = new FakeContext();
    const wait = untilKernel(ctx);
    ctx.isDisposed = true;
    ctx.disposed.emit();
    assert.equal(await settled(wait), true);
  });

  it('waits afresh for the next kernel after one arrived', async () => {
    const ctx = new FakeContext();
    const first = untilKernel(ctx);
    ctx.arrive();
    await first;
    ctx.session = null;
    ctx.kernelDisplayStatus = 'initializing';
    const second = untilKernel(ctx);
    assert.notEqual(second, first);
    assert.equal(await settled(second), false);
    ctx.arrive();
    assert.equal(await settled(second), true);
  });
});
