/**
 * UI states against a fake gpucr API (tests/fake-api.ts): a kernel on an
 * NVIDIA H200, suspend progress, the suspended state, a failed suspend and
 * its notification, the side panel. Runs with or without the real server
 * extension (the browser's requests to /api/gpucr/ never reach the server).
 */
import { expect, galata, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { FakeGpucr } from './fake-api';

const SHOTS = path.resolve(__dirname, '..', 'test-results', 'screenshots');

async function shot(page: Page, name: string, locator?: any): Promise<void> {
  fs.mkdirSync(SHOTS, { recursive: true });
  const file = path.join(SHOTS, `${name}.png`);
  if (locator) {
    await locator.screenshot({ path: file });
  } else {
    await page.screenshot({ path: file });
  }
}

async function currentKernelId(page: Page): Promise<string> {
  await page.waitForFunction(
    () =>
      !!(window as any).jupyterapp.shell.currentWidget?.sessionContext?.session
        ?.kernel?.id
  );
  return page.evaluate(
    () =>
      (window as any).jupyterapp.shell.currentWidget.sessionContext.session
        .kernel.id
  );
}

test.describe('gpucr UI (fake API)', () => {
  test('GPU status, suspend with progress, side panel', async ({
    page,
    tmpPath
  }) => {
    const name = 'train.ipynb';
    // Fake first, so that the first poll already sees it.
    let fake: FakeGpucr | null = null;
    await page.route(/\/api\/gpucr\//, route =>
      fake
        ? route.fallback()
        : route.fulfill({ status: 404, body: '{"message":"not yet"}' })
    );
    await page.notebook.createNew(name);
    const kernelId = await currentKernelId(page);
    fake = new FakeGpucr(kernelId, `${tmpPath}/${name}`);
    await fake.install(page);

    await page.notebook.setCell(
      0,
      'code',
      'import torch\nx = torch.randn(8192, 8192, device="cuda")'
    );
    const status = page.locator('.jp-gpucr-Status');
    await expect(status).toHaveAttribute('data-state', 'running', {
      timeout: 15000
    });
    await expect(status).toContainText('GPU 0 · NVIDIA H200 · 5.7 GiB');
    await shot(page, 'statusbar-gpu', page.locator('#jp-main-statusbar'));

    // Toolbar button -> confirmation dialog -> suspend.
    const button = page.locator(
      '.jp-NotebookPanel-toolbar [data-jp-item-name="gpucr-suspend"] button, .jp-NotebookPanel-toolbar [data-jp-item-name="gpucr-suspend"] jp-button'
    );
    await expect(button.first()).toBeVisible();
    await button.first().click();
    const dialog = page.locator('.jp-Dialog');
    await expect(dialog).toContainText('Suspend kernel to disk?');
    await shot(page, 'confirm-dialog');
    await dialog.getByRole('button', { name: 'Suspend' }).click();

    await expect(status).toHaveAttribute('data-state', 'suspending');
    await expect(status).toContainText('Suspending…');
    await expect(status).toContainText(/writing image/, { timeout: 5000 });
    await shot(
      page,
      'statusbar-suspending',
      page.locator('#jp-main-statusbar')
    );

    await expect(status).toHaveAttribute('data-state', 'suspended', {
      timeout: 15000
    });
    await expect(status).toContainText('Suspended · 5.2 GiB on disk');
    const toast = page.locator('.Toastify__toast').filter({
      hasText: 'was suspended to disk'
    });
    await expect(toast).toBeVisible();
    await shot(page, 'suspended-notification');

    // The side panel lists the suspended kernel, its checkpoint and the GPU.
    await status.click();
    const panel = page.locator('#jp-gpucr-panel');
    await expect(panel).toBeVisible();
    await expect(panel.locator('.jp-gpucr-Kernel')).toHaveCount(1);
    await expect(panel.locator('.jp-gpucr-Checkpoint')).toHaveCount(1);
    await expect(panel.locator('.jp-gpucr-Checkpoint')).toContainText(name);
    await expect(panel.locator('.jp-gpucr-Gpu')).toContainText('NVIDIA H200');
    await expect(panel.locator('.jp-gpucr-Gpu')).toContainText('free of');
    await shot(page, 'panel-suspended');

    // Resume from the panel.
    await panel.locator('.jp-gpucr-Kernel button.jp-gpucr-resume').click();
    await expect(status).toHaveAttribute('data-state', 'restoring');
    await expect(status).toHaveAttribute('data-state', 'running', {
      timeout: 15000
    });
    await expect(
      page
        .locator('.Toastify__toast')
        .filter({ hasText: 'was restored on GPU 0' })
    ).toBeVisible();

    // The second suspend does not ask again once "do not ask again" is set.
    await button.first().click();
    await dialog.locator('input[type="checkbox"]').check();
    await dialog.getByRole('button', { name: 'Suspend' }).click();
    await expect(status).toHaveAttribute('data-state', 'suspended', {
      timeout: 15000
    });
    await panel.locator('.jp-gpucr-Kernel button.jp-gpucr-resume').click();
    await expect(status).toHaveAttribute('data-state', 'running', {
      timeout: 15000
    });
    // Keyboard shortcut (Accel Alt S) in the notebook, no dialog any more.
    await page.notebook.selectCells(0);
    await page.keyboard.press('Control+Alt+s');
    await expect(status).toHaveAttribute('data-state', 'suspending');
    await expect(dialog).toHaveCount(0);
    await expect(status).toHaveAttribute('data-state', 'suspended', {
      timeout: 15000
    });

    // Delete a checkpoint from the panel.
    const items = panel.locator('.jp-gpucr-Checkpoint');
    const before = await items.count();
    await items.first().locator('button.jp-gpucr-delete').click();
    await expect(dialog).toContainText('Delete checkpoint?');
    await dialog.getByRole('button', { name: 'Delete' }).click();
    await expect(items).toHaveCount(before - 1);
  });

  test('a failed suspend says why and what to do', async ({ page }) => {
    let fake: FakeGpucr | null = null;
    await page.route(/\/api\/gpucr\//, route =>
      fake
        ? route.fallback()
        : route.fulfill({ status: 404, body: '{"message":"not yet"}' })
    );
    await page.notebook.createNew('fails.ipynb');
    const kernelId = await currentKernelId(page);
    fake = new FakeGpucr(kernelId, 'fails.ipynb');
    fake.opDelay = 500;
    fake.suspendError = {
      status: 500,
      message:
        'CRIU cannot dump the kernel: it holds an open connection to a remote host (tcp 10.0.0.5:5432).',
      hint: 'Close the connection and retry, or suspend with the snapshot engine.'
    };
    await fake.install(page);
    const status = page.locator('.jp-gpucr-Status');
    await expect(status).toHaveAttribute('data-state', 'running', {
      timeout: 15000
    });

    // From the Kernel menu this time.
    await page.menu.clickMenuItem('Kernel>Suspend Kernel to Disk');
    await page
      .locator('.jp-Dialog')
      .getByRole('button', { name: 'Suspend' })
      .click();
    const toast = page
      .locator('.Toastify__toast')
      .filter({ hasText: 'Suspend of fails.ipynb failed' });
    await expect(toast).toBeVisible({ timeout: 15000 });
    await expect(toast).toContainText('CRIU cannot dump the kernel');
    await expect(toast).toContainText('keeps running');
    await expect(status).toHaveAttribute(
      'title',
      /Close the connection and retry/
    );
    await expect(
      toast.getByRole('button', { name: 'Try snapshot' })
    ).toBeVisible();
    await expect(status).toHaveAttribute('data-state', 'running');
    await expect(status).toContainText('⚠ suspend failed');
    await shot(page, 'suspend-failed');

    // "Use snapshot engine" retries with engine=snapshot.
    fake.suspendError = null;
    await toast.getByRole('button', { name: 'Try snapshot' }).click();
    await expect(status).toHaveAttribute('data-state', 'suspended', {
      timeout: 15000
    });
    expect(fake.requests).toContain(`POST kernels/${kernelId}/suspend`);
  });
});

// Keep galata's import used (its fixtures are what `test` provides).
void galata;
