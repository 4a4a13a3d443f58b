/**
 * Suspended kernels as JupyterLab shows them, against the real server
 * extension and real CRIU (this machine has no GPU: kernels run on the CPU):
 *
 * - two suspended notebooks stay suspended (server state and no process in
 *   the server's /proc) through tab switches, the debugger panel, a page
 *   reload and a new browser; JupyterLab's toolbar kernel indicator and the
 *   Running sidebar say "suspended"; running a cell in one restores that one
 *   only, and nothing of gpucr lands in the cell's output;
 * - Kernel > Shut Down of a suspended kernel asks, the saved state goes to
 *   the trash, the panel's Restore brings it back with its variables;
 * - JupyterLab's own Kernels section (the item's shut-down button, Shut Down
 *   All, the context menu) asks the same before a suspended kernel goes;
 * - Kernel > Restart of a suspended kernel asks, then a notification says
 *   the variables are gone;
 * - a restore of a damaged checkpoint fails saying the cause first in plain
 *   words, offers no Retry (it would fail again) and no GPU choice (no GPU
 *   here) but Start fresh; Details keeps the notice (toast and bell).
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import {
  closeSessionsAndEmptyTrash,
  currentKernelId,
  expectSuspended,
  kernelPids,
  newNotebook,
  openNotebook,
  outputTexts,
  reportBrowserOnFailure,
  runCellAndWait,
  runCode,
  serverState,
  shot,
  suspendButton,
  suspendByRest,
  waitForLab
} from './helpers';

reportBrowserOnFailure(test);

/** Wait until the UI shows the current notebook's kernel as suspended. */
async function statusSuspended(page: Page): Promise<void> {
  await expect(page.locator('.jp-gpucr-Status')).toHaveAttribute(
    'data-state',
    'suspended',
    { timeout: 120000 }
  );
}

/** The notebook toolbar's kernel indicator of the current notebook. */
function toolbarIndicator(page: Page) {
  return page
    .locator('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-gpucr-KernelIndicator')
    .first();
}

/** JupyterLab's own kernel status in the status bar ("Python 3 (ipykernel) | Idle"). */
function kernelStatusItem(page: Page) {
  return page.locator('#jp-main-statusbar .jp-StatusBar-TextItem', {
    hasText: 'Python 3'
  });
}

/** A suspended kernel was shut down: the notification says so, the kernel is gone, the trash has it. */
async function expectTrashed(
  page: Page,
  name: string,
  kernelId: string
): Promise<void> {
  await expect(
    page
      .locator('.Toastify__toast')
      .filter({ hasText: `${name} was shut down` })
  ).toContainText('its saved state is in the trash for 24 h');
  await expect
    .poll(async () =>
      (await page.request.get(`/api/kernels/${kernelId}`)).status()
    )
    .toBe(404);
  const trash = await (await page.request.get('/api/gpucr/trash')).json();
  expect(trash.map((t: any) => [t.kernel_id, t.reason])).toContainEqual([
    kernelId,
    'shutdown'
  ]);
}

/** The names of the notebooks of the server's sessions of a kernel. */
async function sessionsOf(page: Page, kernelId: string): Promise<string[]> {
  const sessions = await (await page.request.get('/api/sessions')).json();
  return sessions
    .filter((s: any) => s.kernel?.id === kernelId)
    .map((s: any) => s.path.split('/').pop());
}

test.describe('suspended kernels in JupyterLab', () => {
  test.skip(
    !fs.existsSync('/proc/self/cmdline'),
    'needs /proc to check for the kernel process'
  );
  // Galata proxies /api/kernels and /api/sessions through routes that parse
  // every answer as JSON, which breaks shut down (204, empty): talk to the
  // server directly, and clean up here.
  test.use({ kernels: null as any, sessions: null as any });

  test.afterEach(async ({ request }) => {
    await closeSessionsAndEmptyTrash(request);
  });

  test('two suspended notebooks stay suspended until a cell runs in one', async ({
    page,
    browser,
    baseURL
  }) => {
    const one = await newNotebook(page, 'one.ipynb', 'a = 1');
    const two = await newNotebook(page, 'two.ipynb', 'b = 2');
    const [pathOne, pathTwo] = [
      (await serverState(page, one)).notebook_path,
      (await serverState(page, two)).notebook_path
    ];
    expect(pathOne).toMatch(/one\.ipynb$/);

    // Suspend two with the toolbar button, one through the REST API.
    await suspendButton(page).click();
    await page
      .locator('.jp-Dialog')
      .getByRole('button', { name: 'Suspend' })
      .click();
    await statusSuspended(page);
    await suspendByRest(page, one);
    const both = async () => {
      await expectSuspended(page, one);
      await expectSuspended(page, two);
    };
    await both();

    // JupyterLab's kernel indicator in the toolbar, and its status bar item.
    await expect(toolbarIndicator(page)).toHaveAttribute(
      'data-gpucr-state',
      'suspended'
    );
    await expect(
      toolbarIndicator(page).locator('.jp-gpucr-KernelIndicator-badge')
    ).toHaveAttribute('title', /^Kernel status: Suspended to disk/);
    await expect(kernelStatusItem(page)).toHaveText(
      'Python 3 (ipykernel) | Suspended to disk'
    );
    await shot(
      page,
      'kernel-status-suspended',
      page.locator('#jp-main-statusbar')
    );

    // Tabs back and forth.
    for (const name of ['one.ipynb', 'two.ipynb', 'one.ipynb']) {
      await page.notebook.activate(name);
      await statusSuspended(page);
      await expect(toolbarIndicator(page)).toHaveAttribute(
        'data-gpucr-state',
        'suspended'
      );
      await expect(kernelStatusItem(page)).toContainText('Suspended to disk');
    }
    await both();

    // The Running sidebar: a section of suspended kernels, and a mark on
    // them in JupyterLab's Kernels section.
    await page.sidebar.openTab('jp-running-sessions');
    const section = page.getByRole('region', {
      name: 'Suspended Kernels Section'
    });
    for (const name of ['one.ipynb', 'two.ipynb']) {
      const item = section.locator('.jp-gpucr-RunningItem', { hasText: name });
      await expect(item).toBeVisible();
      await expect(item).toContainText(/\d+(\.\d)? MiB · (just now|\d+ s ago)/);
      await expect(
        item.locator('.jp-RunningSessions-itemLabel')
      ).toHaveAttribute(
        'title',
        /Kernel is suspended to disk, no process runs/
      );
    }
    const mark = await page.evaluate(id => {
      const label = document.querySelector(
        `.jp-RunningSessions-item.jp-mod-kernel[data-context="${id}"] > .jp-RunningSessions-itemLabel`
      );
      return label ? getComputedStyle(label, '::before').content : null;
    }, one);
    // Before the kernel's name: the sidebar's width cuts the name, not the mark.
    expect(mark).toMatch(/^"Suspended \(\d+(\.\d)? MiB\) · "$/);
    await shot(page, 'running-sidebar-suspended');

    // The debugger panel asks the kernel what it can debug.
    await page.getByRole('tab', { name: 'Debugger' }).click();
    await expect(
      page.getByRole('region', { name: 'Debugger section' })
    ).toBeVisible();
    await page.waitForTimeout(2000);
    await both();

    // Reload the page.
    await page.evaluate(() => location.reload());
    await waitForLab(page);
    await openNotebook(page, pathTwo);
    await statusSuspended(page);
    await openNotebook(page, pathOne);
    await statusSuspended(page);
    await both();

    // Close the browser page, open a new browser context.
    await page.close();
    const context = await browser.newContext({ baseURL });
    const fresh = await context.newPage();
    await fresh.goto('/lab');
    await waitForLab(fresh);
    expect(await openNotebook(fresh, pathTwo)).toBe(two);
    expect(await openNotebook(fresh, pathOne)).toBe(one);
    await statusSuspended(fresh);
    await both();

    // Run a cell in one: that one comes back, two stays on disk.
    expect(await runCode(fresh, 'print(a + 1)')).toContain('2');
    expect((await serverState(fresh, one)).state).toBe('running');
    expect(kernelPids(one).length).toBeGreaterThan(0);
    await expectSuspended(fresh, two);
    const restored = fresh.locator('.Toastify__toast').filter({
      hasText: /one\.ipynb was restored from disk after \d+ (s|min)/
    });
    await expect(restored).toContainText('(onto the CPU)');
    await expect(restored).toBeInViewport({ ratio: 1 });
    const outputs = (await outputTexts(fresh)).join('\n');
    expect(outputs).not.toMatch(/gpucr|restored from disk/i);
    await shot(fresh, 'restored-one-of-two');
    await context.close();
  });

  test('Kernel > Shut Down of a suspended kernel asks, the trash keeps it, Restore brings it back', async ({
    page
  }) => {
    const name = 'shut.ipynb';
    const kernelId = await newNotebook(page, name, 'v = "kept"');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);

    // Kernel > Shut Down All Kernels… says it too (Cancel here).
    await page.menu.open('Kernel');
    await expect(
      page.locator('.lm-Menu-itemLabel', { hasText: 'Shut Down All Kernels…' })
    ).toHaveCount(1);
    await page.menu.clickMenuItem('Kernel>Shut Down All Kernels…');
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('Shut Down All?');
    await expect(dialog).toContainText(
      new RegExp(
        `${name.replace('.', '\\.')} · suspended \\(\\d+(\\.\\d)? MiB\\): its saved state goes to the trash for 24 h`
      )
    );
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await expectSuspended(page, kernelId);

    await page.menu.clickMenuItem('Kernel>Shut Down Kernel');
    await expect(dialog).toContainText('Shut down the suspended kernel?');
    await expect(dialog).toContainText(
      new RegExp(
        `The suspended state of ${name.replace('.', '\\.')} \\(\\d+(\\.\\d)? MiB, saved at \\d\\d:\\d\\d\\) ` +
          'goes to the trash for 24 h; you can bring it back from the Suspended kernels panel\\.'
      )
    );
    await shot(page, 'shutdown-suspended-dialog');
    // Cancel changes nothing.
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await expectSuspended(page, kernelId);

    await page.menu.clickMenuItem('Kernel>Shut Down Kernel');
    await dialog.getByRole('button', { name: 'Shut Down' }).click();
    await expectTrashed(page, name, kernelId);

    // The panel's trash: Restore.
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('gpucr:open-panel')
    );
    const panel = page.locator('#jp-gpucr-panel');
    const item = panel.locator(`.jp-gpucr-Trash[data-kernel-id="${kernelId}"]`);
    await expect(item).toContainText(name);
    await expect(item).toContainText(/shut down/);
    await shot(page, 'panel-trash');
    await item.getByRole('button', { name: 'Restore' }).click();
    await expect(item).toHaveCount(0);
    await expect(
      panel.locator(`.jp-gpucr-Kernel[data-kernel-id="${kernelId}"]`)
    ).toContainText('Suspended');
    await expectSuspended(page, kernelId);
    // Back from the trash is no fresh suspend: one notice says it is back, in
    // place of the kernel's earlier ones (the bell keeps one per kernel).
    const toasts = page.locator('.Toastify__toast');
    await expect(
      toasts.filter({ hasText: `${name} is back, suspended` })
    ).toHaveCount(1);
    await page.waitForTimeout(2000); // the list, polls and events settle
    await expect(
      toasts.filter({ hasText: `${name} was suspended to disk` })
    ).toHaveCount(0);
    await expect(
      toasts.filter({ hasText: `${name} was shut down` })
    ).toHaveCount(0);

    // The notebook has its kernel back, in one session; a cell prints the old variable.
    await page.notebook.activate(name);
    await expect.poll(() => currentKernelId(page)).toBe(kernelId);
    expect(await sessionsOf(page, kernelId)).toEqual([name]);
    expect(await runCode(page, 'print(v)')).toContain('kept');
    expect(await sessionsOf(page, kernelId)).toEqual([name]);
  });

  test("JupyterLab's own Kernels section asks before shutting down a suspended kernel", async ({
    page
  }) => {
    const name = 'own.ipynb';
    const kernelId = await newNotebook(page, name, 'w = 7');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);
    const dialog = page.locator('.jp-Dialog');
    const ours = new RegExp(
      `The suspended state of ${name.replace('.', '\\.')} \\(\\d+(\\.\\d)? MiB, saved at \\d\\d:\\d\\d\\) goes to the trash`
    );

    // The item's shut-down button: our question; Cancel keeps everything.
    await page.sidebar.openTab('jp-running-sessions');
    const section = page.getByRole('region', { name: 'Kernels Section' });
    const item = section
      .locator(`.jp-RunningSessions-item[data-context="${kernelId}"]`)
      .first();
    await item.hover();
    await item.locator('.jp-RunningSessions-itemShutdown').first().click();
    await expect(dialog).toContainText('Shut down the suspended kernel?');
    await expect(dialog).toContainText(ours);
    await shot(page, 'running-kernels-shutdown-dialog');
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await expect(dialog).toHaveCount(0);
    await expectSuspended(page, kernelId);

    // The section's Shut Down All: one question, which says what happens.
    await page
      .getByRole('toolbar', { name: 'Kernels toolbar' })
      .getByRole('button', { name: 'Shut Down All', exact: true })
      .click();
    await expect(dialog).toContainText(`${name} · suspended (`);
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await expect(dialog).toHaveCount(0);
    await expectSuspended(page, kernelId);

    // The context menu's Shut Down Kernel, accepted: the saved state goes to the trash.
    void page.evaluate(
      id =>
        (window as any).jupyterapp.commands.execute(
          'running:kernel-shut-down',
          {
            id
          }
        ),
      kernelId
    );
    await expect(dialog).toContainText(ours);
    await dialog.getByRole('button', { name: 'Shut Down' }).click();
    await expectTrashed(page, name, kernelId);
  });

  test('shutting down several kernels asks once, saying what happens to each, then tells what happened', async ({
    page
  }) => {
    const running = await newNotebook(page, 'live.ipynb', 'l = 1');
    const one = await newNotebook(page, 'sleep-one.ipynb', 's1 = 1');
    const two = await newNotebook(page, 'sleep-two.ipynb', 's2 = 2');
    await suspendByRest(page, one);
    await suspendByRest(page, two);
    await statusSuspended(page);
    const dialog = page.locator('.jp-Dialog');
    const line = (kernelId: string) =>
      dialog.locator(`li[data-kernel-id="${kernelId}"]`);
    const toasts = page.locator('.Toastify__toast');

    // JupyterLab's Kernels section: one question listing all three.
    await page.sidebar.openTab('jp-running-sessions');
    await page
      .getByRole('toolbar', { name: 'Kernels toolbar' })
      .getByRole('button', { name: 'Shut Down All', exact: true })
      .click();
    await expect(line(running)).toHaveText(
      'live.ipynb · running: its variables are lost'
    );
    await expect(line(one)).toContainText(
      /^sleep-one\.ipynb · suspended \(.+\): its saved state goes to the trash for 24 h$/
    );
    await expect(line(two)).toContainText('sleep-two.ipynb · suspended (');
    await expect(dialog).toContainText(
      'Shut down these 3 kernels? A suspended kernel'
    );
    await shot(page, 'shutdown-all-dialog');
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await expect(dialog).toHaveCount(0);
    await expectSuspended(page, one);

    // Shut Down All Suspended: the two suspended ones, one question, one notice.
    await page
      .getByRole('toolbar', { name: 'Suspended Kernels toolbar' })
      .getByRole('button', { name: 'Shut Down All Suspended' })
      .click();
    await expect(dialog.locator('li')).toHaveCount(2);
    await expect(line(running)).toHaveCount(0);
    await dialog
      .getByRole('button', { name: 'Shut Down All Suspended' })
      .click();
    const summary = toasts.filter({ hasText: 'Shut down 2 kernels.' });
    await expect(summary).toContainText(
      'The saved states of 2 suspended kernels are in the trash for 24 h.'
    );
    await expect(dialog).toHaveCount(0);
    await expect(toasts.filter({ hasText: 'was shut down' })).toHaveCount(0);
    const trash = await (await page.request.get('/api/gpucr/trash')).json();
    expect(trash.map((t: any) => t.kernel_id).sort()).toEqual(
      [one, two].sort()
    );
    expect(await sessionsOf(page, running)).toEqual(['live.ipynb']);
    expect(await sessionsOf(page, one)).toEqual([]);

    // Kernel > Shut Down All Kernels…: the one left, running.
    await page.menu.clickMenuItem('Kernel>Shut Down All Kernels…');
    await expect(dialog.locator('li')).toHaveText([
      'live.ipynb · running: its variables are lost'
    ]);
    await dialog.getByRole('button', { name: 'Shut Down All' }).click();
    await expect(
      toasts.filter({ hasText: 'Shut down live.ipynb.' })
    ).toHaveCount(1);
    await expect(dialog).toHaveCount(0);
    await expect
      .poll(async () => (await page.request.get('/api/kernels')).json())
      .toEqual([]);
  });

  test('turning the debugger on for a suspended kernel says to run a cell or resume it first', async ({
    page
  }) => {
    const name = 'debug-me.ipynb';
    const kernelId = await newNotebook(page, name, 'd = 4');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);
    const bug = page
      .locator('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-DebuggerBugButton')
      .first();
    await bug.click();
    const notice = page.locator('.Toastify__toast').filter({
      hasText: `The debugger needs ${name} running`
    });
    await expect(notice).toContainText(
      'run a cell in it or resume it, then turn the debugger on again.'
    );
    await expectSuspended(page, kernelId); // asking for the debugger restores nothing
    await shot(page, 'debugger-suspended-notice');
    // Resume from the notice: it goes once it no longer applies.
    await notice.getByRole('button', { name: 'Resume' }).click();
    await expect(page.locator('.jp-gpucr-Status')).toHaveAttribute(
      'data-state',
      'running',
      { timeout: 120000 }
    );
    await expect(notice).toHaveCount(0);
    await bug.click();
    await expect(bug).toHaveAttribute('aria-pressed', 'true');
    expect(await runCode(page, 'print(d)')).toContain('4');
  });

  test('Kernel > Restart of a suspended kernel asks, then says the variables are gone', async ({
    page
  }) => {
    const name = 'restart.ipynb';
    const kernelId = await newNotebook(page, name, 'r = 5');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);

    await page.menu.clickMenuItem('Kernel>Restart Kernel…');
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('Restart the suspended kernel?');
    await expect(dialog).toContainText(`The suspended state of ${name} (`);
    await expect(dialog).toContainText(
      'goes to the trash for 24 h; you can bring it back from the Suspended kernels panel. The restarted kernel starts empty'
    );
    await dialog.getByRole('button', { name: 'Restart' }).click();
    await expect(
      page.locator('.Toastify__toast').filter({
        hasText: `${name} restarted as a fresh kernel`
      })
    ).toContainText('its variables are gone');
    await expect(
      page.locator('.Toastify__toast').filter({ hasText: 'restored' })
    ).toHaveCount(0);
    expect(await runCode(page, "print('r' in dir())")).toContain('False');
    // A running kernel's restart is JupyterLab's, as before.
    await page.menu.clickMenuItem('Kernel>Restart Kernel…');
    await expect(dialog).toContainText('Restart Kernel?');
    await dialog
      .getByRole('button', { name: 'Confirm Kernel Restart' })
      .click();
    await expect(dialog).toHaveCount(0);
    expect(await runCode(page, 'print("fresh")')).toContain('fresh');
    const trash = await (await page.request.get('/api/gpucr/trash')).json();
    expect(trash.map((t: any) => [t.kernel_id, t.reason])).toContainEqual([
      kernelId,
      'restart'
    ]);
  });

  test('Restore from the trash after a restart offers to shut the new kernel down, in plain words', async ({
    page
  }) => {
    const name = 'again.ipynb';
    const kernelId = await newNotebook(page, name, 'a = 11');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);
    await page.menu.clickMenuItem('Kernel>Restart Kernel…');
    const dialog = page.locator('.jp-Dialog');
    await dialog.getByRole('button', { name: 'Restart' }).click();
    expect(await runCode(page, 'print("new", 2)')).toContain('new 2');

    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('gpucr:open-panel')
    );
    const panel = page.locator('#jp-gpucr-panel');
    const item = panel.locator(`.jp-gpucr-Trash[data-kernel-id="${kernelId}"]`);
    await expect(item).toContainText('restarted');
    await item.getByRole('button', { name: 'Restore' }).click();
    await expect(dialog).toContainText(
      `${name} was restarted after this state was saved, and a new kernel runs in it now.`
    );
    await shot(page, 'trash-restore-after-restart');
    await dialog
      .getByRole('button', {
        name: 'Shut down the new kernel and restore the saved one'
      })
      .click();
    await expect(
      page.locator('.Toastify__toast').filter({ hasText: `${name} is back` })
    ).toContainText('suspended');
    await expect(item).toHaveCount(0);
    await expectSuspended(page, kernelId);
    // No warning, no id, no HTTP status anywhere in the notifications.
    const toasts = await page.locator('.Toastify__toast').allTextContents();
    expect(toasts.join(' ')).not.toMatch(/HTTP|[0-9a-f]{8}-[0-9a-f]{4}/);
    // The notebook keeps its one session; its next cell brings the saved kernel back.
    expect(await sessionsOf(page, kernelId)).toEqual([name]);
    expect(await runCode(page, 'print(a)')).toContain('11');
    expect(await sessionsOf(page, kernelId)).toEqual([name]);
  });

  test('a failed restore from the trash says why in plain words, and its warning goes when the item does', async ({
    page
  }) => {
    const name = 'gone.ipynb';
    const kernelId = await newNotebook(page, name, 'g = 1');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);
    await page.menu.clickMenuItem('Kernel>Shut Down Kernel');
    await page
      .locator('.jp-Dialog')
      .getByRole('button', { name: 'Shut Down' })
      .click();
    await expectTrashed(page, name, kernelId);
    // The panel lists the item, then closes (its lists stop refreshing).
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('gpucr:open-panel')
    );
    const panel = page.locator('#jp-gpucr-panel');
    const item = panel.locator(`.jp-gpucr-Trash[data-kernel-id="${kernelId}"]`);
    await expect(item).toHaveCount(1);
    const trashId = await item.getAttribute('data-trash-id');
    await page.sidebar.close('right');
    // Another client deletes it meanwhile; Restore here fails.
    await page.request.delete(`/api/gpucr/trash/${trashId}`);
    await page.evaluate(
      id =>
        (window as any).jupyterapp.commands.execute(
          'gpucr:restore-from-trash',
          { trashId: id }
        ),
      trashId
    );
    const warning = page
      .locator('.Toastify__toast')
      .filter({ hasText: `Could not restore ${name}` });
    await expect(warning).toHaveCount(1);
    expect(await warning.textContent()).not.toMatch(/HTTP|\(\d{3}\)/);
    // The panel refreshes: the item is gone, and so is the warning.
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('gpucr:open-panel')
    );
    await expect(item).toHaveCount(0);
    await expect(warning).toHaveCount(0);
  });

  test('a failed restore says the cause first, keeps its notice after Details, and offers a fresh start', async ({
    page
  }) => {
    const name = 'damaged.ipynb';
    const kernelId = await newNotebook(page, name, 'd = 7');
    await suspendByRest(page, kernelId);
    await statusSuspended(page);
    // Damage the saved state: flip a byte of its largest memory image.
    const checkpoints = await (
      await page.request.get('/api/gpucr/checkpoints')
    ).json();
    const images = path.join(
      checkpoints.find((c: any) => c.kernel_id === kernelId).path,
      'images'
    );
    const pages = fs
      .readdirSync(images)
      .filter(f => /^pages-.*\.img$/.test(f))
      .map(f => path.join(images, f))
      .sort((a, b) => fs.statSync(b).size - fs.statSync(a).size)[0];
    const data = fs.readFileSync(pages);
    data[data.length >> 1] ^= 0xff;
    fs.writeFileSync(pages, data);

    await page.evaluate(
      id =>
        (window as any).jupyterapp.commands.execute('gpucr:resume', {
          kernelId: id
        }),
      kernelId
    );
    const notice = page
      .locator('.Toastify__toast')
      .filter({ hasText: `${name} was not restored` });
    await expect(notice).toHaveCount(1, { timeout: 120000 });
    const message = notice.locator('.jp-toast-message');
    // The cause first, in plain words; no checkpoint id, no CRIU text.
    await expect(message).toHaveText(
      `The saved state is damaged. ${name} was not restored.`
    );
    await shot(page, 'restore-failed-damaged', notice);
    // Retry would fail the same way; there is no GPU to choose here.
    const buttons = notice.locator('.jp-toast-button');
    await expect(buttons).toHaveText(['Details', 'Start fresh']);

    // Details tells the rest (the id, what was wrong) and closing it keeps the notice.
    await notice.getByRole('button', { name: 'Details' }).click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('The saved state is damaged.');
    await expect(dialog).toContainText(/Checkpoint \S+ is damaged/);
    await dialog.getByRole('button', { name: 'Close' }).click();
    await expect(dialog).toHaveCount(0);
    await expect(notice).toHaveCount(1);
    // The bell's list keeps it too (opening the list hides the toasts).
    await page.locator('.jp-Notification-Status').click();
    const listed = page
      .locator('.jp-Notification-Center .jp-Notification-List-Item')
      .filter({ hasText: `${name} was not restored` });
    await expect(listed).toHaveCount(1);

    // Start fresh: an empty kernel under the same id, the saved state in the trash.
    await listed.getByRole('button', { name: 'Start fresh' }).click();
    await expect(
      page
        .locator('.jp-Notification-Center .jp-Notification-List-Item')
        .filter({ hasText: `${name} restarted as a fresh kernel` })
    ).toContainText('The saved state is in the trash.');
    await expect(listed).toHaveCount(0);
    await page.locator('.jp-Notification-Status').click();
    expect(await runCode(page, "print('d' in dir())")).toContain('False');
    expect(await currentKernelId(page)).toBe(kernelId);
    const trash = await (await page.request.get('/api/gpucr/trash')).json();
    expect(trash.map((t: any) => [t.kernel_id, t.reason])).toContainEqual([
      kernelId,
      'restart'
    ]);
  });
});
