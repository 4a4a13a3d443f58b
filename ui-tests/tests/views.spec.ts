/**
 * The views say the same thing, in the user's words (against the real
 * server extension and real CRIU):
 *
 * - a CPU kernel's suspend shows no GPU step and no estimated total that the
 *   final size would contradict; an idle suspend says it was idle;
 * - the status bar, the side panel and the Running sidebar give a suspended
 *   kernel the same age, and all of them keep it current;
 * - the trash shows whole notebook names; nothing says "gpucr panel";
 * - a page load warns about no duplicated menu entry.
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';

import {
  closeSessionsAndEmptyTrash,
  expectSuspended,
  newNotebook,
  recordStatus,
  reportBrowserOnFailure,
  seenStatus,
  shot,
  suspendByRest
} from './helpers';

reportBrowserOnFailure(test);

const IDLE_KERNEL = {
  name: 'python3-idle',
  // (galata waits for a status bar without the word "idle" in it)
  display_name: 'Python 3 (suspended after 5 s unused)'
};

/** Open JupyterLab in `page` and the notebook at `path`, until it shows its kernel. */
async function openLab(page: Page, path: string): Promise<void> {
  await page.goto('/lab');
  await page.waitForSelector('#jupyterlab-splash', { state: 'detached' });
  await page.evaluate(p => {
    const app = (window as any).jupyterapp;
    return app.restored.then(() =>
      app.commands.execute('docmanager:open', { path: p })
    );
  }, path);
  // The status bar shows the notebook's kernel once it is current, with it.
  await expect(page.locator('.jp-gpucr-Status')).toBeVisible();
}

test.describe('what the views say', () => {
  test.use({ kernels: null as any, sessions: null as any });

  test.afterEach(async ({ request }) => {
    await closeSessionsAndEmptyTrash(request);
  });

  test('an idle CPU kernel is suspended: no GPU step, no estimated total, and the notice says it was idle', async ({
    page
  }) => {
    const name = 'unused.ipynb';
    const kernelId = await newNotebook(
      page,
      name,
      // Enough memory that the image takes a moment to write.
      'import os\nblob = os.urandom(150 * 1024 * 1024)',
      IDLE_KERNEL
    );
    await recordStatus(page);
    const notice = page
      .locator('.Toastify__toast')
      .filter({ hasText: `${name} was idle, so it was suspended to disk (` });
    await expect(notice).toContainText('Run a cell to bring it back.', {
      timeout: 90000
    });
    await expectSuspended(page, kernelId);
    const seen = await seenStatus(page);
    const suspending = seen.filter(s => s.state === 'suspending');
    expect(suspending.length).toBeGreaterThan(0);
    for (const { label } of suspending) {
      expect(label).not.toMatch(/GPU/);
      expect(label).not.toMatch(/ \/ /); // no estimated total
    }
    // The notice and the status bar give the same size.
    const size = (await notice.textContent())!.match(/\(([\d.]+ [KMG]iB)/)![1];
    await expect(page.locator('.jp-gpucr-Status')).toContainText(
      `Suspended · ${size} on disk`
    );
  });

  test('the status bar, the side panel and the Running sidebar give the same age and keep it current', async ({
    page,
    browser,
    baseURL
  }) => {
    const name = 'aging.ipynb';
    const kernelId = await newNotebook(page, name, 'a = 1');
    await suspendByRest(page, kernelId);
    const path = await page.evaluate(
      () => (window as any).jupyterapp.shell.currentWidget.context.path
    );
    // A second browser whose clock the test moves on.
    const context = await browser.newContext({ baseURL });
    const other = await context.newPage();
    const warnings: string[] = [];
    other.on('console', m => {
      if (m.type() === 'warning') {
        warnings.push(m.text());
      }
    });
    await other.clock.install();
    await openLab(other, path);
    // A page load warns about no duplicated menu entry, and the Kernel menu
    // has one Shut Down All Kernels….
    expect(warnings.filter(w => /is duplicated/.test(w))).toEqual([]);
    await other.locator('.lm-MenuBar-itemLabel', { hasText: 'Kernel' }).click();
    await expect(
      other.locator('.lm-Menu-itemLabel', { hasText: 'Shut Down All Kernels…' })
    ).toHaveCount(1);
    await other.keyboard.press('Escape');
    await other.evaluate(() =>
      (window as any).jupyterapp.commands.execute('gpucr:open-panel')
    );
    await other
      .locator('.jp-SideBar.jp-mod-left [data-id="jp-running-sessions"]')
      .click();
    const status = other.locator('.jp-gpucr-Status');
    const row = other.locator(
      `#jp-gpucr-panel .jp-gpucr-Kernel[data-kernel-id="${kernelId}"]`
    );
    const running = other.locator('.jp-gpucr-RunningItem');
    await expect(status).toContainText('just now');
    await expect(row).toContainText('just now');
    await expect(running).toContainText('just now');

    await other.clock.fastForward('03:10');
    await expect(status).toContainText('Suspended · ');
    await expect(status).toContainText('3 min ago');
    await expect(row).toContainText('3 min ago');
    await expect(running).toContainText('3 min ago');
    await other.clock.fastForward(60 * 60 * 1000);
    await expect(status).toContainText('1 h 3 min ago');
    await expect(row).toContainText('1 h 3 min ago');
    await expect(running).toContainText('1 h 3 min ago');
    await shot(other, 'ages-agree');
    await context.close();
  });

  test('the trash shows whole names, and nothing says "gpucr panel"', async ({
    page
  }) => {
    const names = [
      'experiment-with-a-rather-long-name-version-one.ipynb',
      'experiment-with-a-rather-long-name-version-two.ipynb'
    ];
    for (const name of names) {
      await suspendByRest(page, await newNotebook(page, name, 'n = 1'));
    }
    await page.menu.clickMenuItem('Kernel>Shut Down All Kernels…');
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).not.toContainText('gpucr');
    await dialog.getByRole('button', { name: 'Shut Down All' }).click();
    const toast = page
      .locator('.Toastify__toast')
      .filter({ hasText: 'Shut down 2 kernels.' });
    await expect(toast).toBeVisible();
    await expect(
      toast.getByRole('button', { name: 'Open Suspended kernels' })
    ).toBeVisible();
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('gpucr:open-panel')
    );
    const titles = page.locator(
      '#jp-gpucr-panel .jp-gpucr-Trash .jp-gpucr-Item-title'
    );
    await expect(titles).toHaveCount(2);
    expect((await titles.allTextContents()).sort()).toEqual(names);
    for (const title of await titles.all()) {
      // Nothing cut: the whole name is shown.
      expect(
        await title.evaluate(e => e.scrollWidth <= e.clientWidth + 1)
      ).toBe(true);
    }
    await shot(page, 'trash-names', page.locator('#jp-gpucr-panel'));
    await expect(
      page.locator('#jp-gpucr-panel .jp-gpucr-Panel-trash')
    ).not.toContainText('gpucr');
    await expect(toast).not.toContainText('gpucr');
  });
});
