/**
 * Restore while the user types, against the real server extension and real
 * CRIU: typing into a code cell of a notebook whose kernel is suspended
 * starts the restore in the background (the cell is not run), the status bar
 * says so, and the cell then runs and answers from the kernel's state. With
 * the setting off, typing leaves the kernel on disk until the cell runs. A
 * Tab completion asked while the kernel is on disk shows its list once the
 * kernel is back, without a second Tab.
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';

import {
  appendCell,
  closeSessionsAndEmptyTrash,
  newNotebook,
  outputTexts,
  recordStatus,
  reportBrowserOnFailure,
  runCellAndWait,
  seenStatus,
  serverState,
  suspendByRest
} from './helpers';

reportBrowserOnFailure(test);

async function statusSuspended(page: Page): Promise<void> {
  await expect(page.locator('.jp-gpucr-Status')).toHaveAttribute(
    'data-state',
    'suspended',
    { timeout: 120000 }
  );
}

/** Put the cursor at the end of cell `index`'s editor and type `text`, as a user does. */
async function typeInto(
  page: Page,
  index: number,
  text: string
): Promise<void> {
  const editor = page
    .locator('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .cm-content')
    .nth(index);
  await editor.click();
  await page.keyboard.press('End');
  await page.keyboard.type(text, { delay: 30 });
}

async function setRestoreAhead(page: Page, on: boolean): Promise<void> {
  await page.evaluate(async value => {
    const registry = await (window as any).galata.getPlugin(
      '@jupyterlab/apputils-extension:settings'
    );
    await registry.set('jupyter-gpucr:plugin', 'restoreAhead', value);
  }, on);
}

test.describe('restore while the user types', () => {
  test.use({ kernels: null as any, sessions: null as any });

  test.afterEach(async ({ request }) => {
    await closeSessionsAndEmptyTrash(request);
  });

  test('typing into a cell restores the suspended kernel ahead of the run', async ({
    page
  }) => {
    const kernelId = await newNotebook(page, 'ahead.ipynb', 'x = 42');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);
    await recordStatus(page);

    await typeInto(page, 0, '\nprint(x)');
    await expect
      .poll(async () => (await serverState(page, kernelId)).state, {
        timeout: 120000
      })
      .toBe('running');
    // Nothing ran: the cell has no new output; the status bar said why it restored.
    expect((await outputTexts(page))[0]).toBe('[]');
    const seen = await seenStatus(page);
    expect(seen.some(s => s.label.includes('Restoring (you are typing)'))).toBe(
      true
    );

    expect(await runCellAndWait(page, 0)).toBe('42\n');
  });

  test('with the setting off, typing leaves the kernel on disk until the cell runs', async ({
    page
  }) => {
    await setRestoreAhead(page, false);
    try {
      const kernelId = await newNotebook(page, 'ahead-off.ipynb', 'y = 7');
      await suspendByRest(page, kernelId);
      await statusSuspended(page);
      await typeInto(page, 0, '\nprint(y)');
      await page.waitForTimeout(3000);
      expect((await serverState(page, kernelId)).state).toBe('suspended');
      expect(await runCellAndWait(page, 0)).toBe('7\n');
    } finally {
      await setRestoreAhead(page, true);
    }
  });

  test('a Tab completion asked while the kernel is on disk shows its list once the kernel is back', async ({
    page
  }) => {
    await setRestoreAhead(page, false); // the Tab itself restores the kernel
    try {
      const kernelId = await newNotebook(
        page,
        'complete.ipynb',
        // about 480 MB: its restore takes longer than the completer's one second
        'import numpy as np\nbig = np.random.default_rng(0).random(60_000_000)\nxylophone_a = 1\nxylophone_b = 2'
      );
      await suspendByRest(page, kernelId);
      await statusSuspended(page);
      const index = await appendCell(page, '');
      await typeInto(page, index, 'xylo');
      await page.keyboard.press('Tab');
      const completer = page.locator('.jp-Completer');
      await expect(completer).toBeVisible({ timeout: 120000 });
      await expect(completer).toContainText('xylophone_a');
      await expect(completer).toContainText('xylophone_b');
      expect((await serverState(page, kernelId)).state).toBe('running');
      await page.keyboard.press('Escape');
    } finally {
      await setRestoreAhead(page, true);
    }
  });
});
