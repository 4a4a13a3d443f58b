/**
 * End to end against the real server extension: a notebook's kernel is
 * suspended with the toolbar button, its process is gone, running a cell
 * brings it back with its variables (and nothing of gpucr in the cell's
 * output), and its checkpoint, kept on disk after the restore, is deleted
 * from the side panel. The server's events carry the kernel's whole state:
 * the page never asks for this kernel's state alone meanwhile.
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';

import {
  currentKernelId,
  kernelPids,
  recordStatus,
  reportBrowserOnFailure,
  seenStatus,
  shot,
  suspendButton
} from './helpers';

reportBrowserOnFailure(test);

test.describe('gpucr with the real server extension', () => {
  test.skip(
    !fs.existsSync('/proc/self/cmdline'),
    'needs /proc to check for the kernel process'
  );

  test('suspend, transparent restore on run, delete the checkpoint', async ({
    page
  }) => {
    const name = 'suspend-me.ipynb';
    await page.notebook.createNew(name);
    await page.notebook.setCell(0, 'code', 'x = 42');
    await page.notebook.run();
    const kernelId = await currentKernelId(page);
    const askedAlone: string[] = [];
    page.on('request', request => {
      const path = new URL(request.url()).pathname;
      if (path.endsWith(`/api/gpucr/kernels/${kernelId}`)) {
        askedAlone.push(`${request.method()} ${path}`);
      }
    });

    const status = page.locator('.jp-gpucr-Status');
    await expect(status).toHaveAttribute('data-state', 'running');
    // No GPU here: the kernel runs on the CPU (on a GPU box: "GPU 0 · …").
    await expect(status).toContainText(/CPU|GPU \d/);
    const before = kernelPids(kernelId);
    expect(before.length).toBeGreaterThan(0);

    // Suspend with the toolbar button, confirm once.
    const button = suspendButton(page);
    await expect(button).toBeVisible();
    await button.click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('Suspend kernel to disk?');
    await dialog.getByRole('button', { name: 'Suspend' }).click();

    await expect(status).toHaveAttribute('data-state', 'suspended', {
      timeout: 120000
    });
    await expect(status).toContainText(/Suspended · .* on disk/);
    await expect(
      page
        .locator('.Toastify__toast')
        .filter({ hasText: 'was suspended to disk' })
    ).toBeVisible();
    await shot(page, 'real-suspended');

    // The server says so, and the kernel's processes are gone.
    const response = await page.request.get(`/api/gpucr/kernels/${kernelId}`);
    expect(response.ok()).toBeTruthy();
    const state = await response.json();
    expect(state.state).toBe('suspended');
    expect(state.checkpoint?.id).toBeTruthy();
    const checkpointId: string = state.checkpoint.id;
    expect(kernelPids(kernelId)).toEqual([]);
    for (const pid of before) {
      expect(fs.existsSync(`/proc/${pid}`)).toBe(false);
    }

    // The side panel lists the suspended kernel, with its checkpoint in the
    // same row.
    await status.click();
    const panel = page.locator('#jp-gpucr-panel');
    await expect(panel).toBeVisible();
    await expect(
      panel.locator(`.jp-gpucr-Kernel[data-kernel-id="${kernelId}"]`)
    ).toContainText(name);
    const item = panel.locator(
      `.jp-gpucr-Checkpoint[data-checkpoint-id="${checkpointId}"]`
    );
    await expect(item).toHaveCount(0);
    await shot(page, 'real-panel-suspended');

    // Running a cell restores the kernel transparently, variables intact;
    // meanwhile the status bar says "Restoring…" (record every state it shows).
    await recordStatus(page);
    await page.notebook.addCell('code', 'print(x)');
    const printCell = (await page.notebook.getCellCount()) - 1;
    await page.notebook.runCell(printCell);
    await expect
      .poll(
        async () =>
          (await page.notebook.getCellTextOutput(printCell))?.join(''),
        {
          timeout: 120000
        }
      )
      .toContain('42');
    // The cell prints what it prints, nothing else: the restore is told by
    // JupyterLab (notification, status bar), never in a cell's output.
    expect((await page.notebook.getCellTextOutput(printCell))?.join('')).toBe(
      '42\n'
    );
    await expect(status).toHaveAttribute('data-state', 'running', {
      timeout: 60000
    });
    expect(kernelPids(kernelId).length).toBeGreaterThan(0);
    const restored = await (
      await page.request.get(`/api/gpucr/kernels/${kernelId}`)
    ).json();
    expect(restored.state).toBe('running');
    const states = (await seenStatus(page)).map(s => s.state);
    expect(states.filter((s, i) => s !== states[i - 1])).toEqual([
      'suspended',
      'restoring',
      'running'
    ]);
    // Suspended, restoring, running: each from an event, none fetched after it.
    expect(askedAlone).toEqual([]);
    await shot(page, 'real-restored');

    // The checkpoint stays on disk after the restore, listed apart from the
    // kernels; delete it.
    await expect(item).toContainText(name);
    await item.locator('button.jp-gpucr-delete').click();
    await expect(dialog).toContainText('Delete checkpoint for good?');
    await dialog.getByRole('button', { name: 'Delete' }).click();
    await expect(item).toHaveCount(0);
    const checkpoints = await (
      await page.request.get('/api/gpucr/checkpoints')
    ).json();
    expect(checkpoints.map((c: any) => c.id)).not.toContain(checkpointId);

    // The kernel still runs and still has x.
    await page.notebook.activate(name);
    await page.notebook.addCell('code', 'print(x + 1)');
    const lastCell = (await page.notebook.getCellCount()) - 1;
    await page.notebook.runCell(lastCell);
    await expect
      .poll(async () =>
        (await page.notebook.getCellTextOutput(lastCell))?.join('')
      )
      .toContain('43');
  });
});
