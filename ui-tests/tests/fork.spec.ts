/**
 * "Fork Kernel" against the real server extension: the notebook's toolbar
 * button makes a copy of the kernel and opens `NAME-fork-1.ipynb` on it; the
 * copy has the source's variables and goes its own way, the source runs on
 * unchanged, and a second fork takes the next free name.
 */
import { expect, test } from '@jupyterlab/galata';

import {
  currentKernelId,
  reportBrowserOnFailure,
  serverState,
  shot
} from './helpers';

reportBrowserOnFailure(test);

/** The "Fork Kernel" button of the current notebook's toolbar. */
function forkButton(page: any) {
  return page
    .locator(
      '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar [data-jp-item-name="gpucr-fork"] :is(button, jp-button)'
    )
    .first();
}

/** Run `code` in the current notebook's first cell and return its output. */
async function runFirstCell(page: any, code: string): Promise<string> {
  await page.notebook.setCell(0, 'code', code);
  await page.notebook.runCell(0, true);
  return ((await page.notebook.getCellTextOutput(0)) ?? []).join('').trim();
}

test('fork a kernel: a copy of the notebook runs on a copy of the kernel', async ({
  page
}) => {
  await page.notebook.createNew('source.ipynb');
  await page.notebook.setCell(0, 'code', 'x = 42');
  await page.notebook.run();
  const sourceId = await currentKernelId(page);

  await forkButton(page).click();
  await expect(
    page.getByRole('tab', { name: 'source-fork-1.ipynb' })
  ).toBeVisible({
    timeout: 120000
  });
  await expect(
    page
      .locator('.Toastify__toast')
      .filter({ hasText: 'source-fork-1.ipynb runs on the copy' })
  ).toBeVisible();
  const forkId = await currentKernelId(page);
  expect(forkId).not.toBe(sourceId);
  expect((await serverState(page, forkId)).state).toBe('running');
  await shot(page, 'fork-opened');

  // The copy holds the source's variables and goes its own way.
  expect(await runFirstCell(page, 'print(x)\nx = 0')).toBe('42');
  await page.notebook.activate('source.ipynb');
  expect(await currentKernelId(page)).toBe(sourceId);
  expect(await runFirstCell(page, 'print(x)')).toBe('42');

  // A second fork of the source takes the next free name.
  await forkButton(page).click();
  await expect(
    page.getByRole('tab', { name: 'source-fork-2.ipynb' })
  ).toBeVisible({
    timeout: 120000
  });
  expect(await runFirstCell(page, 'print(x)')).toBe('42');
});
