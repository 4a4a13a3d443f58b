import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { FAST_POLL_MS, MIN_POLL_MS, Poller } from '../poller';

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

/** A poller whose `fast()` the test sets, counting its ticks. */
function makePoller(options: Partial<Poller.IOptions> = {}) {
  const made = { fast: false, ticks: 0 };
  const poller = new Poller({
    tick: async () => {
      made.ticks++;
    },
    fast: () => made.fast,
    ...options
  });
  return { poller, made };
}

describe('Poller', () => {
  it('polls at once, then every interval', async () => {
    const { poller, made } = makePoller({ interval: 600 });
    try {
      await sleep(100);
      assert.equal(made.ticks, 1, 'the first poll at once');
      await sleep(700);
      assert.equal(made.ticks, 2);
    } finally {
      poller.dispose();
    }
  });

  it('polls every second while an operation runs, from now on', async () => {
    const { poller, made } = makePoller();
    try {
      await sleep(100);
      assert.equal(poller.currentInterval, 3000);
      const before = made.ticks;
      made.fast = true;
      poller.pace();
      assert.equal(poller.currentInterval, FAST_POLL_MS);
      await sleep(FAST_POLL_MS + 150);
      assert.equal(made.ticks, before + 1, 'not after the slower interval');
      made.fast = false;
      poller.pace();
      assert.equal(poller.currentInterval, 3000);
      await sleep(FAST_POLL_MS + 150); // the poll already due comes
      assert.equal(made.ticks, before + 2);
      await sleep(FAST_POLL_MS + 150);
      assert.equal(made.ticks, before + 2, 'then the slower interval');
    } finally {
      poller.dispose();
    }
  });

  it('takes a new interval, never below the shortest', () => {
    const { poller } = makePoller();
    try {
      poller.interval = 10_000;
      assert.equal(poller.currentInterval, 10_000);
      poller.interval = 1;
      assert.equal(poller.interval, MIN_POLL_MS);
    } finally {
      poller.dispose();
    }
  });

  it('advances one clock for every view, and stops when disposed', async () => {
    const { poller, made } = makePoller({ clockInterval: 50 });
    const start = poller.now;
    let ticked = 0;
    poller.ticked.connect(() => ticked++);
    await sleep(180);
    assert.ok(ticked >= 2, `the clock advanced ${ticked} times`);
    assert.ok(poller.now > start);
    poller.dispose();
    const [ticks, advanced] = [made.ticks, ticked];
    await sleep(150);
    assert.equal(made.ticks, ticks);
    assert.equal(ticked, advanced);
    assert.equal(poller.isDisposed, true);
  });
});
