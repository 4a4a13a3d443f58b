/**
 * The suspend UI against the real server extension and real CRIU (this
 * machine has no GPU: kernels run on the CPU):
 *
 * - the confirmation dialog, Cancel, and "Do not ask again" (a real setting,
 *   written to the server's user settings and reset afterwards);
 * - the suspend progress (phase, bytes, bar) in the status bar while a kernel
 *   holding 1.6 GB of numpy is written to disk;
 * - the side panel with a suspended kernel, Resume from the panel (both its
 *   buttons), variables intact;
 * - a suspend the server refuses (the kernel is busy running a cell: HTTP
 *   409): a short warning naming the notebook, gone once the cell ends, with
 *   "Suspend when this cell finishes" (a pending suspend in the status bar,
 *   then suspended) and, from the toolbar, "Interrupt and suspend".
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';
import * as fs from 'fs';

import {
  appendCell,
  currentKernelId,
  kernelPids,
  recordStatus,
  reportBrowserOnFailure,
  runCode,
  seenStatus,
  serverState,
  shot,
  suspendButton
} from './helpers';

reportBrowserOnFailure(test);

const PLUGIN_SETTINGS = '/lab/api/settings/jupyter-gpucr:plugin';

/** The gpucr plugin's user settings as the server stores them. */
async function storedSettings(page: Page): Promise<Record<string, unknown>> {
  const response = await page.request.get(PLUGIN_SETTINGS);
  expect(response.ok()).toBeTruthy();
  return (await response.json()).settings ?? {};
}

test.describe('suspend UI with the real server extension', () => {
  test.skip(
    !fs.existsSync('/proc/self/cmdline'),
    'needs /proc to check for the kernel process'
  );

  test.describe('confirmation setting', () => {
    // "Do not ask again" writes the real user setting on the server (galata
    // keeps settings in memory by default).
    test.use({ mockSettings: false });

    test.afterEach(async ({ request }) => {
      // Back to the default for the next tests, whatever happened.
      const reset = await request.put(PLUGIN_SETTINGS, {
        data: { raw: '{}' }
      });
      expect(reset.ok()).toBeTruthy();
      const settings = (await (await request.get(PLUGIN_SETTINGS)).json())
        .settings;
      expect(settings?.confirmSuspend).toBeUndefined();
    });

    test('confirm, progress while suspending, resume from the panel, do not ask again', async ({
      page
    }) => {
      const name = 'big.ipynb';
      await page.notebook.createNew(name);
      // 1.6 GB in the kernel: writing it to disk takes long enough to watch.
      await page.notebook.setCell(
        0,
        'code',
        'import numpy as np\nx = np.full(200_000_000, 7.0)  # 1.6 GB\ny = 42'
      );
      await page.notebook.run();
      const kernelId = await currentKernelId(page);
      const status = page.locator('.jp-gpucr-Status');
      await expect(status).toHaveAttribute('data-state', 'running');
      // No GPU here: the kernel runs on the CPU.
      await expect(status).toHaveText('CPU');
      await expect(status).toHaveAttribute(
        'title',
        /Kernel runs without a GPU/
      );
      await shot(page, 'statusbar-cpu', page.locator('#jp-main-statusbar'));
      expect((await storedSettings(page)).confirmSuspend).toBeUndefined();

      // The confirmation: Cancel leaves the kernel alone.
      const button = suspendButton(page);
      const dialog = page.locator('.jp-Dialog');
      await button.click();
      await expect(dialog).toContainText('Suspend kernel to disk?');
      await expect(dialog).toContainText(`The kernel of ${name}`);
      await expect(dialog.locator('.jp-Dialog-checkbox')).toContainText(
        'Do not ask again'
      );
      const askAgain = dialog.locator(
        '.jp-Dialog-checkbox input[type="checkbox"]'
      );
      await expect(askAgain).not.toBeChecked();
      await shot(page, 'confirm-dialog');
      await dialog.getByRole('button', { name: 'Cancel' }).click();
      await expect(dialog).toHaveCount(0);
      await expect(status).toHaveAttribute('data-state', 'running');
      expect((await serverState(page, kernelId)).state).toBe('running');

      // Confirm without ticking the box: progress in the status bar.
      await recordStatus(page);
      await button.click();
      await dialog.getByRole('button', { name: 'Suspend' }).click();
      await expect(status).toHaveAttribute('data-state', 'suspending');
      // For the screenshot, some bytes written (the server reports them every
      // 0.5 s while CRIU writes; a fast disk may be done before that).
      await expect(status)
        .toContainText(/writing image [^(]*\((?!0%)\d+%\)/, { timeout: 5000 })
        .catch(() => undefined);
      if ((await status.getAttribute('data-state')) === 'suspending') {
        await shot(
          page,
          'statusbar-suspending',
          page.locator('#jp-main-statusbar')
        );
      }
      await expect(status).toHaveAttribute('data-state', 'suspended', {
        timeout: 120000
      });
      await expect(status).toContainText(/^Suspended · 1\.\d GiB on disk/);
      // The status bar said what was being done while it was done (every text
      // it showed is recorded): the image being written, with its bytes when
      // the dump lasted past the server's first report (every 0.5 s).
      const phases = (await seenStatus(page))
        .filter(s => s.state === 'suspending')
        .map(s => s.label);
      expect(
        phases.some(label => /^Suspending… writing image/.test(label)),
        phases.join(' | ')
      ).toBe(true);
      // The notice waits for the new checkpoint: its size is the status bar's.
      await expect(
        page
          .locator('.Toastify__toast')
          .filter({ hasText: `${name} was suspended to disk` })
      ).toContainText(
        /\(1\.\d GiB, whole process\)\. Run a cell to bring it back\./
      );
      expect(
        (await seenStatus(page)).filter(s => / \/ /.test(s.label))
      ).toEqual([]);
      const seen = await seenStatus(page);
      const suspending = seen.filter(s => s.state === 'suspending');
      // The bytes written grew while the image was written.
      const percents = suspending
        .map(s => /writing image .*\((\d+)%\)/.exec(s.label))
        .filter(m => m !== null)
        .map(m => Number(m![1]));
      expect(percents.length).toBeGreaterThan(0);
      expect(percents).toEqual([...percents].sort((a, b) => a - b));
      expect(kernelPids(kernelId)).toEqual([]);
      const suspended = await serverState(page, kernelId);
      expect(suspended.state).toBe('suspended');
      expect(suspended.checkpoint.size).toBeGreaterThan(1.5e9);

      // The side panel: one row for the suspended kernel and its
      // checkpoint, in plain words; no GPU.
      await status.click();
      const panel = page.locator('#jp-gpucr-panel');
      await expect(panel).toBeVisible();
      const kernelItem = panel.locator(
        `.jp-gpucr-Kernel[data-kernel-id="${kernelId}"]`
      );
      await expect(kernelItem).toContainText(name);
      await expect(kernelItem).toContainText(/Suspended · 1\.\d GiB on disk/);
      await expect(kernelItem).toContainText('whole process · CPU · manual');
      await expect(kernelItem).not.toContainText(/criu|GPU/);
      await expect(
        panel.locator(
          `.jp-gpucr-Checkpoint[data-checkpoint-id="${suspended.checkpoint.id}"]`
        )
      ).toHaveCount(0);
      await expect(panel.locator('.jp-gpucr-Panel-gpus')).toContainText(
        'No GPU visible to the server'
      );
      await expect(
        panel.locator('.jp-gpucr-Panel-doctor summary')
      ).toContainText(
        /What works on this server: (Everything works|\d+ checks? fails?)/
      );
      await shot(page, 'panel-suspended');

      // Resume from the panel's suspended kernel.
      await recordStatus(page);
      await kernelItem.locator('button.jp-gpucr-resume').click();
      await expect(status).toHaveAttribute('data-state', 'running', {
        timeout: 120000
      });
      await expect(status).toHaveText('CPU');
      const states = (await seenStatus(page)).map(s => s.state);
      expect(states.filter((s, i) => s !== states[i - 1])).toEqual([
        'suspended',
        'restoring',
        'running'
      ]);
      await expect(
        page
          .locator('.Toastify__toast')
          .filter({ hasText: `${name} was restored from disk after` })
      ).toContainText('(onto the CPU).');
      await expect(kernelItem).toHaveCount(0);
      expect(kernelPids(kernelId).length).toBeGreaterThan(0);
      expect((await serverState(page, kernelId)).state).toBe('running');
      expect(await runCode(page, 'print(y, x[-1], x.size)')).toContain(
        '42 7.0 200000000'
      );

      // Smaller from here on: the next suspends need not write 1.6 GB.
      await runCode(page, 'del x\nimport gc; gc.collect(); print("freed")');

      // Tick "Do not ask again": the setting goes off on the server.
      await page.notebook.activate(name);
      await button.click();
      await expect(dialog).toContainText('Suspend kernel to disk?');
      await askAgain.check();
      await dialog.getByRole('button', { name: 'Suspend' }).click();
      await expect(status).toHaveAttribute('data-state', 'suspended', {
        timeout: 120000
      });
      await expect
        .poll(async () => (await storedSettings(page)).confirmSuspend)
        .toBe(false);
      // Resume from the Kernel menu this time.
      await page.menu.clickMenuItem('Kernel>Resume Kernel');
      await expect(status).toHaveAttribute('data-state', 'running', {
        timeout: 120000
      });
      // The variables are back.
      expect(await runCode(page, 'print(y)')).toContain('42');

      // The next suspend (keyboard shortcut, Ctrl Alt S) does not ask.
      await page.evaluate(() => {
        (window as any).__gpucrDialogs = 0;
        new MutationObserver(() => {
          if (document.querySelector('.jp-Dialog')) {
            (window as any).__gpucrDialogs += 1;
          }
        }).observe(document.body, { childList: true, subtree: true });
      });
      await page.notebook.selectCells(0);
      await page.keyboard.press('Control+Alt+s');
      await expect(status).toHaveAttribute('data-state', 'suspended', {
        timeout: 120000
      });
      expect(await page.evaluate(() => (window as any).__gpucrDialogs)).toBe(0);
      await expect(dialog).toHaveCount(0);
      expect((await serverState(page, kernelId)).state).toBe('suspended');

      // Running a cell brings it back; y is still there.
      expect(await runCode(page, 'print(y + 1)')).toContain('43');
    });
  });

  // Regression test: a criu suspend used to leave the server's execution_state
  // at "busy" (the idle after the server's own trim request was missed), so the
  // next suspend right after a resume was refused with 409.
  test('suspend again right after a resume from the panel', async ({
    page
  }) => {
    await page.notebook.createNew('again.ipynb');
    await page.notebook.setCell(0, 'code', 'w = 5');
    await page.notebook.run();
    const kernelId = await currentKernelId(page);
    const status = page.locator('.jp-gpucr-Status');
    const dialog = page.locator('.jp-Dialog');
    await expect(status).toHaveAttribute('data-state', 'running');
    await suspendButton(page).click();
    await dialog.getByRole('button', { name: 'Suspend' }).click();
    await expect(status).toHaveAttribute('data-state', 'suspended');
    await status.click();
    await page
      .locator(
        `#jp-gpucr-panel .jp-gpucr-Kernel[data-kernel-id="${kernelId}"] button.jp-gpucr-resume`
      )
      .click();
    await expect(status).toHaveAttribute('data-state', 'running');
    expect(
      (await (await page.request.get(`/api/kernels/${kernelId}`)).json())
        .execution_state
    ).toBe('idle');
    await suspendButton(page).click();
    await dialog.getByRole('button', { name: 'Suspend' }).click();
    await expect(status).toHaveAttribute('data-state', 'suspended');
    await expect(
      page.locator('.Toastify__toast').filter({ hasText: 'failed' })
    ).toHaveCount(0);
  });

  test.describe('a refused suspend', () => {
    // Galata proxies /api/kernels/* through a route that parses every answer
    // as JSON, which breaks "Interrupt Kernel" (204, empty): talk to the
    // server directly (sessions are still tracked and shut down).
    test.use({ kernels: null as any });

    test('a suspend refused while a cell runs says why and offers to suspend when it finishes', async ({
      page
    }) => {
      const name = 'busy.ipynb';
      await page.notebook.createNew(name);
      await page.notebook.setCell(0, 'code', 'z = 7');
      await page.notebook.run();
      const kernelId = await currentKernelId(page);
      const status = page.locator('.jp-gpucr-Status');
      await expect(status).toHaveAttribute('data-state', 'running');
      const responses: { status: number; body: Promise<any> }[] = [];
      page.on('response', response => {
        if (
          /\/api\/gpucr\/kernels\/[^/]+\/suspend(\?|$)/.test(response.url())
        ) {
          responses.push({
            status: response.status(),
            body: response.json().catch(() => null)
          });
        }
      });
      const kernelBusy = () =>
        page.waitForFunction(
          () =>
            (window as any).jupyterapp.shell.currentWidget.sessionContext
              .session.kernel.status === 'busy'
        );
      // A suspend asked for right now, as a script or another tab would:
      // JupyterLab's own command runs without asking first.
      const suspendNow = () =>
        page.evaluate(() =>
          (window as any).jupyterapp.commands.execute('gpucr:suspend', {
            when: 'now',
            confirm: false
          })
        );
      const refusal = page.locator('.Toastify__toast').filter({
        hasText: `${name} is running a cell, so it was not suspended.`
      });

      // 1. Refused: a short warning that names the notebook and goes away
      // once the cell has finished.
      const short = await appendCell(page, 'import time; time.sleep(6)');
      await page.notebook.runCell(short, { wait: false });
      await kernelBusy();
      await suspendNow();
      await expect(refusal).toBeVisible();
      await expect(refusal).toHaveClass(/Toastify__toast--warning/);
      expect(await refusal.textContent()).not.toContain(kernelId);
      await expect(
        refusal.getByRole('button', { name: 'Suspend when this cell finishes' })
      ).toBeVisible();
      await expect(
        refusal.getByRole('button', { name: 'Interrupt and suspend' })
      ).toBeVisible();
      await expect(refusal).toBeInViewport({ ratio: 1 });
      await shot(page, 'suspend-refused-busy');
      expect(responses.map(r => r.status)).toEqual([409]);
      const body = await responses[0].body;
      expect(body.error).toBe('KernelBusyError');
      expect(body.message).toMatch(/\.ipynb” is running a cell\.$/);
      expect(body.message).not.toContain(kernelId);
      expect(body.options).toEqual(['idle', 'interrupt']);
      expect((await serverState(page, kernelId)).state).toBe('running');
      await expect(refusal).toHaveCount(0, { timeout: 30000 });
      expect((await serverState(page, kernelId)).state).toBe('running');

      // 2. Refused again; "Suspend when this cell finishes": the status bar
      // shows the pending suspend with Cancel, and the kernel is suspended
      // once the cell is done.
      const long = await appendCell(
        page,
        'import time; time.sleep(10); print("slept")'
      );
      await page.notebook.runCell(long, { wait: false });
      await kernelBusy();
      await suspendNow();
      await refusal
        .getByRole('button', { name: 'Suspend when this cell finishes' })
        .click();
      await expect(status).toHaveAttribute('data-state', 'suspend-pending');
      await expect(status).toContainText('Suspend after this cell');
      await expect(
        status.getByRole('button', { name: 'Cancel' })
      ).toBeVisible();
      await expect(refusal).toHaveCount(0);
      expect((await serverState(page, kernelId)).state).toBe('suspend-pending');
      await shot(page, 'statusbar-pending', page.locator('#jp-main-statusbar'));
      await expect(status).toHaveAttribute('data-state', 'suspended', {
        timeout: 60000
      });
      // The pending notice and its Cancel are gone with what they were about,
      // from the toasts and from the notification center.
      await page.locator('.jp-Notification-Status').click();
      const center = page.locator('.jp-Notification-Center');
      await expect(center).toBeVisible();
      await expect(center).not.toContainText('will be suspended to disk');
      await page.locator('.jp-Notification-Status').click();
      expect(
        ((await page.notebook.getCellTextOutput(long)) ?? []).join('')
      ).toContain('slept');
      expect((await serverState(page, kernelId)).state).toBe('suspended');
      expect(kernelPids(kernelId)).toEqual([]);

      // 3. From the toolbar while a cell runs: JupyterLab knows the kernel is
      // busy and asks; "Interrupt and suspend".
      const endless = await appendCell(page, 'import time; time.sleep(300)');
      await page.notebook.runCell(endless, { wait: false });
      await expect(status).toHaveAttribute('data-state', 'running', {
        timeout: 60000
      });
      await kernelBusy();
      await suspendButton(page).click();
      const dialog = page.locator('.jp-Dialog');
      await expect(dialog).toContainText(`${name} is running a cell`);
      await shot(page, 'suspend-busy-dialog');
      await dialog
        .getByRole('button', { name: 'Interrupt and suspend' })
        .click();
      await expect(status).toHaveAttribute('data-state', 'suspended', {
        timeout: 60000
      });
      await expect
        .poll(async () =>
          ((await page.notebook.getCellTextOutput(endless)) ?? []).join('')
        )
        .toContain('KeyboardInterrupt');
      expect((await serverState(page, kernelId)).state).toBe('suspended');
      expect(kernelPids(kernelId)).toEqual([]);
      // The variables survived all of it.
      expect(await runCode(page, 'print(z)')).toContain('7');
    });
  });
});
