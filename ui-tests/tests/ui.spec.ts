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
 *   409) and its notification, which says why and what to do; interrupting
 *   the cell and Retry then suspends; deleting the checkpoint a kernel is
 *   suspended from shuts that kernel down.
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';
import * as fs from 'fs';

import {
  currentKernelId,
  kernelPids,
  recordStatus,
  seenStatus,
  serverState,
  shot,
  suspendButton
} from './helpers';

const PLUGIN_SETTINGS = '/lab/api/settings/jupyter-gpucr:plugin';

/** The gpucr plugin's user settings as the server stores them. */
async function storedSettings(page: Page): Promise<Record<string, unknown>> {
  const response = await page.request.get(PLUGIN_SETTINGS);
  expect(response.ok()).toBeTruthy();
  return (await response.json()).settings ?? {};
}

/**
 * Append a code cell to the current notebook and return its index. The
 * source goes into the notebook's model directly: typing it (galata's
 * addCell) costs seconds per cell on a small machine.
 */
async function appendCell(page: Page, code: string): Promise<number> {
  return page.evaluate(source => {
    const model = (window as any).jupyterapp.shell.currentWidget.content.model;
    model.sharedModel.addCell({ cell_type: 'code', source });
    return model.cells.length - 1;
  }, code);
}

/** Run a code cell appended to the notebook and return its text output. */
async function runCode(page: Page, code: string): Promise<string> {
  const index = await appendCell(page, code);
  await page.notebook.runCell(index);
  let text = '';
  await expect
    .poll(
      async () =>
        (text = ((await page.notebook.getCellTextOutput(index)) ?? []).join(
          ''
        )),
      { timeout: 120000 }
    )
    .not.toBe('');
  return text;
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
      await expect(status).toContainText(
        /Suspending… writing image .* \/ .* \(\d+%\)/,
        { timeout: 60000 }
      );
      await expect(status.locator('.jp-gpucr-Status-bar')).toBeVisible();
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
      // (Size, engine and time are in it when the POST's answer arrives
      // before the server's "suspended" event; not when the event comes first.)
      await expect(
        page
          .locator('.Toastify__toast')
          .filter({ hasText: `${name} was suspended to disk` })
      ).toContainText('Its memory is free.');
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

      // The side panel: the suspended kernel, its checkpoint, no GPU.
      await status.click();
      const panel = page.locator('#jp-gpucr-panel');
      await expect(panel).toBeVisible();
      const kernelItem = panel.locator(
        `.jp-gpucr-Kernel[data-kernel-id="${kernelId}"]`
      );
      await expect(kernelItem).toContainText(name);
      await expect(kernelItem).toContainText(/Suspended · 1\.\d GiB on disk/);
      await expect(kernelItem).toContainText('criu');
      const checkpointItem = panel.locator(
        `.jp-gpucr-Checkpoint[data-checkpoint-id="${suspended.checkpoint.id}"]`
      );
      await expect(checkpointItem).toContainText(name);
      await expect(checkpointItem).toContainText('kernel suspended');
      await expect(checkpointItem).toContainText(
        /1\.\d GiB · criu · CPU only · manual/
      );
      await expect(panel.locator('.jp-gpucr-Panel-gpus')).toContainText(
        'No GPU visible to the server'
      );
      await expect(
        panel.locator('.jp-gpucr-Panel-doctor summary')
      ).toContainText('What works here');
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
          .filter({ hasText: `${name} was restored on the CPU` })
      ).toContainText('Its variables are back.');
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
      const second = await serverState(page, kernelId);
      // Resume from the panel's checkpoint entry this time.
      await panel
        .locator(
          `.jp-gpucr-Checkpoint[data-checkpoint-id="${second.checkpoint.id}"] button.jp-gpucr-resume`
        )
        .click();
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

    test('a suspend refused while a cell runs says why and what to do', async ({
      page
    }) => {
      const name = 'busy.ipynb';
      await page.notebook.createNew(name);
      await page.notebook.setCell(0, 'code', 'z = 7');
      await page.notebook.run();
      const kernelId = await currentKernelId(page);
      const status = page.locator('.jp-gpucr-Status');
      await expect(status).toHaveAttribute('data-state', 'running');

      // Keep the kernel busy.
      const sleeping = await appendCell(page, 'import time; time.sleep(30)');
      await page.notebook.runCell(sleeping, { wait: false });
      await page.waitForFunction(
        () =>
          (window as any).jupyterapp.shell.currentWidget.sessionContext.session
            .kernel.status === 'busy'
      );

      // Suspend from the Kernel menu: the server answers 409.
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
      await page.menu.clickMenuItem('Kernel>Suspend Kernel to Disk');
      const dialog = page.locator('.jp-Dialog');
      await dialog.getByRole('button', { name: 'Suspend' }).click();

      const toast = page
        .locator('.Toastify__toast')
        .filter({ hasText: `Suspend of ${name} failed` });
      await expect(toast).toBeVisible();
      // Why, and what to do (the toast shows the first 140 characters; the
      // notification list and the status bar's tooltip have all of it).
      await expect(toast).toContainText(
        `Suspend of ${name} failed; the kernel keeps running. ` +
          `Kernel ${kernelId} is busy running code. Wait for the cell`
      );
      await expect(status).toContainText('⚠ suspend failed');
      await expect(status).toHaveAttribute(
        'title',
        new RegExp(
          `The last suspend failed: Kernel ${kernelId} is busy running code\\.\\n` +
            'Wait for the cell to finish or interrupt it, then suspend\\.'
        )
      );
      await expect(toast.getByRole('button', { name: 'Retry' })).toBeVisible();
      await expect(
        toast.getByRole('button', { name: 'Diagnose' })
      ).toBeVisible();
      await expect(
        toast.getByRole('button', { name: 'Try snapshot' })
      ).toHaveCount(0);
      await shot(page, 'suspend-failed');
      expect(responses.map(r => r.status)).toEqual([409]);
      const refused = await responses[0].body;
      expect(refused.message).toBe(`Kernel ${kernelId} is busy running code.`);
      expect(refused.hint).toBe(
        'Wait for the cell to finish or interrupt it, then suspend.'
      );

      // Nothing happened to the kernel: it still runs the cell.
      expect((await serverState(page, kernelId)).state).toBe('running');
      expect(kernelPids(kernelId).length).toBeGreaterThan(0);

      // Do what it says: interrupt the cell, then Retry.
      await page.menu.clickMenuItem('Kernel>Interrupt Kernel');
      await expect
        .poll(async () =>
          ((await page.notebook.getCellTextOutput(sleeping)) ?? []).join('')
        )
        .toContain('KeyboardInterrupt');
      await page.waitForFunction(
        () =>
          (window as any).jupyterapp.shell.currentWidget.sessionContext.session
            .kernel.status === 'idle'
      );
      const retry = page
        .locator('.Toastify__toast')
        .filter({ hasText: `Suspend of ${name} failed` })
        .getByRole('button', { name: 'Retry' });
      if (await retry.count()) {
        await retry.click();
      } else {
        // The toast went away: the same button is in the notification list.
        await page.locator('.jp-Notification-Status').click();
        await page
          .locator('.jp-Notification-Center')
          .getByRole('button', { name: 'Retry' })
          .first()
          .click();
      }
      await expect(dialog).toHaveCount(0);
      await expect(status).toHaveAttribute('data-state', 'suspended', {
        timeout: 120000
      });
      expect(responses.map(r => r.status)).toEqual([409, 200]);
      const state = await serverState(page, kernelId);
      expect(state.state).toBe('suspended');
      expect(kernelPids(kernelId)).toEqual([]);

      // Delete the checkpoint the kernel is suspended from: the UI warns that
      // the kernel's state is lost, and the server shuts the kernel down.
      await status.click();
      const panel = page.locator('#jp-gpucr-panel');
      const item = panel.locator(
        `.jp-gpucr-Checkpoint[data-checkpoint-id="${state.checkpoint.id}"]`
      );
      await expect(item).toContainText('kernel suspended');
      await item.locator('button.jp-gpucr-delete').click();
      await expect(dialog).toContainText('Delete checkpoint?');
      await expect(dialog).toContainText(
        "is suspended from this checkpoint: deleting it loses the kernel's state for good"
      );
      await dialog.getByRole('button', { name: 'Delete' }).click();
      await expect(item).toHaveCount(0);
      await expect(
        panel.locator(`.jp-gpucr-Kernel[data-kernel-id="${kernelId}"]`)
      ).toHaveCount(0);
      await expect(
        page.locator('.Toastify__toast').filter({ hasText: 'deleted.' })
      ).toContainText(
        new RegExp(`Checkpoint of \\S*${name} \\(.*\\) deleted\\.`)
      );
      const checkpoints = await (
        await page.request.get('/api/gpucr/checkpoints')
      ).json();
      expect(checkpoints.map((c: any) => c.id)).not.toContain(
        state.checkpoint.id
      );
      expect(
        (await page.request.get(`/api/kernels/${kernelId}`)).status()
      ).toBe(404);
    });
  });
});
