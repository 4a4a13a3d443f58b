import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { readSettings } from '../settings';

describe('readSettings', () => {
  it('reads the defaults when nothing is set', () => {
    assert.deepEqual(
      readSettings(() => undefined),
      {
        confirmSuspend: true,
        restoreAhead: true,
        pollInterval: 3000,
        showStatusBar: true
      }
    );
  });

  it('reads what is set, the poll interval in milliseconds', () => {
    const set: Record<string, unknown> = {
      confirmSuspend: false,
      restoreAhead: false,
      pollInterval: 10,
      showStatusBar: false
    };
    assert.deepEqual(
      readSettings(key => set[key]),
      {
        confirmSuspend: false,
        restoreAhead: false,
        pollInterval: 10_000,
        showStatusBar: false
      }
    );
  });

  it('falls back to 3 s for a poll interval that is no positive number', () => {
    for (const bad of [0, -1, 'soon', NaN]) {
      assert.equal(
        readSettings(key => (key === 'pollInterval' ? bad : undefined))
          .pollInterval,
        3000
      );
    }
  });
});
