import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { PageConfig } from '@jupyterlab/coreutils';

import {
  shutdownLines,
  shutdownSummary,
  trashedNotice,
  trashWarning
} from '../messages';
import { trashHours, TRASH_HOURS_OPTION } from '../serverconfig';
import { CHECKPOINT, kernel } from './fixtures';

describe("the server's trash_hours in what the UI says", () => {
  it("is the server's default when the page does not say", () => {
    assert.equal(trashHours(), 24);
  });

  it('reaches every sentence about the trash', () => {
    // What the server extension writes into the page for c.GPUCR.trash_hours = 2.
    PageConfig.setOption(TRASH_HOURS_OPTION, '2');
    const hours = trashHours();
    assert.equal(hours, 2);
    const state = kernel({ state: 'suspended', checkpoint: CHECKPOINT });
    assert.match(
      trashWarning('train.ipynb', state, hours),
      /goes to the trash for 2 h; you can bring it back/
    );
    const lines = shutdownLines(
      [{ kernelId: 'b', label: 'train.ipynb', state }],
      hours
    );
    assert.equal(
      lines[0].fate,
      'suspended (5.0 GiB): its saved state goes to the trash for 2 h'
    );
    assert.equal(
      shutdownSummary(lines, [], hours).message,
      'Shut down train.ipynb. The saved state of train.ipynb is in the trash for 2 h.'
    );
    assert.equal(
      trashedNotice('train.ipynb', hours).message,
      'train.ipynb was shut down; its saved state is in the trash for 2 h.'
    );
  });

  it('takes fractions and zero, and ignores what is not a number of hours', () => {
    PageConfig.setOption(TRASH_HOURS_OPTION, '1.5');
    assert.equal(trashHours(), 1.5);
    PageConfig.setOption(TRASH_HOURS_OPTION, '0');
    assert.equal(trashHours(), 0);
    PageConfig.setOption(TRASH_HOURS_OPTION, 'soon');
    assert.equal(trashHours(), 24);
  });
});
