/**
 * Save points against the real server extension: the notebook toolbar's
 * "Save Point" button keeps the kernel's state, the kernel runs on; the side
 * panel lists the save point, and its "Go back" (after asking) returns the
 * kernel, under the same id, to the state it had then.
 */
import { expect, test } from '@jupyterlab/galata';

import { currentKernelId, newNotebook, serverState, shot } from './helpers';

function savePointButton(page: any) {
  return page
    .locator(
      '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar [data-jp-item-name="gpucr-save-point"] :is(button, jp-button)'
    )
    .first();
}

async function runFirstCell(page: any, code: string): Promise<string> {
  await page.notebook.setCell(0, 'code', code);
  await page.notebook.runCell(0, true);
  return ((await page.notebook.getCellTextOutput(0)) ?? []).join('').trim();
}

test('take a save point, change a variable, go back from the panel', async ({
  page
}) => {
  // Python 3 by name: the kernelspec an earlier spec declared may be the default one, and its
  // kernels are not the gpucr provisioner's (no save point)
  const kernelId = await newNotebook(page, 'risky.ipynb', 'x = 1\nprint(x)');

  await savePointButton(page).click();
  await expect(
    page.locator('.Toastify__toast').filter({ hasText: 'Save point of' })
  ).toBeVisible({ timeout: 120000 });
  expect((await serverState(page, kernelId)).state).toBe('running');
  expect(await runFirstCell(page, 'x = 2\nprint(x)')).toBe('2');

  await page.evaluate(() =>
    (window as any).jupyterapp.commands.execute('gpucr:open-panel')
  );
  const item = page
    .locator('#jp-gpucr-panel .jp-gpucr-SavePoint')
    .filter({ hasText: 'x = 1' });
  await expect(item).toBeVisible({ timeout: 30000 });
  await shot(page, 'panel-save-points');
  await item.getByRole('button', { name: 'Go back' }).click();
  const dialog = page.locator('.jp-Dialog');
  await expect(dialog).toContainText('Go back to the save point?');
  await dialog.getByRole('button', { name: 'Go back' }).click();
  await expect(
    page.locator('.Toastify__toast').filter({ hasText: 'is back at' })
  ).toBeVisible({ timeout: 120000 });

  expect(await currentKernelId(page)).toBe(kernelId);
  expect(await runFirstCell(page, 'print(x)')).toBe('1');
});
