/**
 * Save points against the real server extension: the notebook toolbar's
 * "Save Point" button keeps the kernel's state, the kernel runs on; the side
 * panel lists the save point, and its "Go back" (after asking) returns the
 * kernel, under the same id, to the state it had then. A code cell's
 * "Save Point, then Run" takes a save point named after the cell and runs the
 * cell; when the save point is refused, the cell does not run, until "Run
 * anyway".
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';

import {
  appendCell,
  closeSessionsAndEmptyTrash,
  currentKernelId,
  newNotebook,
  runCode,
  reportBrowserOnFailure,
  serverState,
  shot
} from './helpers';

reportBrowserOnFailure(test);
test.afterEach(async ({ request }) => {
  await closeSessionsAndEmptyTrash(request);
});

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

  await expect(savePointButton(page)).toBeEnabled();
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

/** Right-click cell `index` of the current notebook and choose "Save Point, then Run". */
async function saveThenRunFromMenu(page: Page, index: number): Promise<void> {
  await page
    .locator('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook .jp-Cell')
    .nth(index)
    .locator('.jp-InputPrompt')
    .click({ button: 'right' });
  const item = page.locator('.lm-Menu-item', {
    hasText: 'Save Point, then Run'
  });
  await expect(item).toBeVisible();
  await shot(page, 'cell-save-then-run-menu');
  await item.click();
}

/** The execution count of cell `index` of the current notebook (null: not run). */
function executionCount(page: Page, index: number): Promise<number | null> {
  return page.evaluate(
    i =>
      (window as any).jupyterapp.shell.currentWidget.content.model.cells.get(i)
        .executionCount,
    index
  );
}

test('"Save Point, then Run" keeps the state before the cell, then runs it', async ({
  page
}) => {
  const kernelId = await newNotebook(page, 'before-cell.ipynb', 'x = 1');
  const cell = await appendCell(page, 'x = 2');

  await saveThenRunFromMenu(page, cell);
  await expect(
    page.locator('.Toastify__toast').filter({ hasText: 'Save point of' })
  ).toBeVisible({ timeout: 120000 });
  await expect.poll(() => executionCount(page, cell)).not.toBeNull();
  await expect(
    page.locator(
      '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-cell-toolbar [data-jp-item-name="gpucr-save-then-run"]'
    )
  ).toBeVisible();
  const listed = await (
    await page.request.get(`/api/gpucr/kernels/${kernelId}/savepoints`)
  ).json();
  const savePoint = listed.find(
    (sp: any) => sp.name === 'before cell 2: x = 2'
  );
  expect(savePoint, JSON.stringify(listed)).toBeTruthy();
  expect((await runCode(page, 'print(x)')).trim()).toBe('2');

  const back = await page.request.post(
    `/api/gpucr/kernels/${kernelId}/savepoints/${savePoint.id}/restore`,
    { data: {} }
  );
  expect(back.status(), await back.text()).toBe(200);
  expect(await currentKernelId(page)).toBe(kernelId);
  expect((await runCode(page, 'print(x)')).trim()).toBe('1');
});

test('"Save Point, then Run" refused while a cell runs: the cell waits for "Run anyway"', async ({
  page
}) => {
  const kernelId = await newNotebook(page, 'busy-cell.ipynb', 'y = 1');
  const sleeper = await appendCell(page, 'import time\ntime.sleep(8)');
  const cell = await appendCell(page, 'y = 5');
  await page.evaluate(i => {
    const app = (window as any).jupyterapp;
    app.shell.currentWidget.content.activeCellIndex = i;
    void app.commands.execute('notebook:run-cell');
  }, sleeper);
  await page.waitForFunction(
    () =>
      (window as any).jupyterapp.shell.currentWidget.sessionContext.session
        .kernel.status === 'busy'
  );

  await saveThenRunFromMenu(page, cell);
  const refusal = page
    .locator('.Toastify__toast')
    .filter({ hasText: 'Cell 3 did not run' });
  await expect(refusal).toContainText('running a cell', { timeout: 60000 });
  await shot(page, 'cell-save-then-run-refused', refusal);
  expect(await executionCount(page, cell)).toBeNull();
  const listed = await (
    await page.request.get(`/api/gpucr/kernels/${kernelId}/savepoints`)
  ).json();
  expect(listed).toEqual([]);

  await refusal.getByRole('button', { name: 'Run anyway' }).click();
  await expect
    .poll(() => executionCount(page, cell), { timeout: 60000 })
    .not.toBeNull();
  expect((await runCode(page, 'print(y)')).trim()).toBe('5');
});

test('"Save Point, then Run" is disabled without a kernel, and its tooltip says why', async ({
  page
}) => {
  await newNotebook(page, 'no-kernel.ipynb', 'z = 1');
  const button = page
    .locator(
      '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-cell-toolbar [data-jp-item-name="gpucr-save-then-run"] :is(button, jp-button)'
    )
    .first();
  // jp-button says so in aria-disabled, which Playwright's toBeDisabled does not read there
  await expect(button).not.toHaveAttribute('aria-disabled', 'true');
  await page.evaluate(() =>
    (window as any).jupyterapp.shell.currentWidget.sessionContext.shutdown()
  );
  await expect(button).toHaveAttribute('aria-disabled', 'true');
  await expect(button).toHaveAttribute('title', /The notebook has no kernel/);
});
