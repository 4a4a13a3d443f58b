/**
 * The first cell of a brand-new notebook runs even when the user runs it
 * while the kernel is still starting: Launcher > Python 3, click into the
 * first cell, type, Shift+Enter at once, ten times in a row.
 *
 * Without gpucr's cell executor about a third of these are lost here (stock
 * JupyterLab loses some too): Shift+Enter before the request that creates
 * the notebook's session has returned finds no kernel, and JupyterLab clears
 * the cell without a word.
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';

import { reportBrowserOnFailure, shot } from './helpers';

reportBrowserOnFailure(test);

const TRIES = Number(process.env.GPUCR_FIRST_CELL_TRIES ?? 10);

/** Open a launcher, click its Python 3 notebook card; the new notebook's path. */
async function newNotebookFromLauncher(page: Page): Promise<string> {
  const launcher: string = await page.evaluate(async () => {
    const widget = await (window as any).jupyterapp.commands.execute(
      'launcher:create'
    );
    return widget.id;
  });
  await page
    .locator(`[id="${launcher}"] .jp-LauncherCard[data-category="Notebook"]`)
    .filter({ hasText: 'Python 3 (ipykernel)' })
    .click();
  await page.waitForFunction(
    () =>
      !!(window as any).jupyterapp.shell.currentWidget?.context?.path?.endsWith(
        '.ipynb'
      )
  );
  return page.evaluate(
    () => (window as any).jupyterapp.shell.currentWidget.context.path
  );
}

test.describe('the first cell of a new notebook', () => {
  test.use({ kernels: null as any, sessions: null as any });

  test.afterEach(async ({ request }) => {
    for (const session of await (await request.get('/api/sessions')).json()) {
      await request.delete(`/api/sessions/${session.id}`);
    }
  });

  test('runs when Shift+Enter comes while the kernel starts, 10 times in a row', async ({
    page,
    request
  }) => {
    test.setTimeout(60000 + TRIES * 60000);
    // What the notebook had when Shift+Enter went down (for the report).
    await page.evaluate(() => {
      document.addEventListener(
        'keydown',
        event => {
          if (event.key === 'Enter' && event.shiftKey) {
            const ctx = (window as any).jupyterapp.shell.currentWidget
              ?.sessionContext;
            (window as any).__gpucrAtRun = ctx?.session?.kernel
              ? 'a kernel'
              : `no kernel yet (${ctx?.kernelDisplayStatus})`;
          }
        },
        true
      );
    });
    const results: string[] = [];
    for (let i = 0; i < TRIES; i++) {
      const path = await newNotebookFromLauncher(page);
      const cell = page
        .locator('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')
        .first();
      await cell.locator('.cm-content').click();
      await page.keyboard.type(`print("first ${i}")`);
      await page.keyboard.press('Shift+Enter');
      let ran = true;
      try {
        await expect(cell.locator('.jp-OutputArea-output')).toHaveText(
          `first ${i}`,
          { timeout: 45000 }
        );
        await expect(cell.locator('.jp-InputPrompt')).toHaveText('[1]:');
      } catch {
        ran = false;
        await shot(page, `first-cell-lost-${i}`);
      }
      const atRun = await page.evaluate(() => (window as any).__gpucrAtRun);
      results.push(`${i}: ${ran ? 'ran' : 'LOST'}, ${atRun} at Shift+Enter`);
      // Close it and shut its kernel down: every try starts from the same load.
      await page.evaluate(async () => {
        const widget = (window as any).jupyterapp.shell.currentWidget;
        await widget.context.save();
        await widget.sessionContext.shutdown();
        widget.dispose();
      });
      await request.delete(`/api/contents/${encodeURIComponent(path)}`);
    }
    console.log(`first cell of a new notebook:\n${results.join('\n')}`);
    expect(results.filter(r => r.includes('LOST'))).toEqual([]);
  });
});
