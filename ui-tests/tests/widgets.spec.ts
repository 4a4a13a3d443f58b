/**
 * ipywidgets of a suspended kernel, against the real server extension and
 * real CRIU: reloading the notebook draws its slider from what the kernel
 * said when it was suspended (an image's bytes too), and the kernel stays on
 * disk (no process, no 'Comm not found' in the console); moving the slider
 * restores the kernel, whose observer sets the label: the label follows only
 * if the kernel runs.
 */
import { expect, test } from '@jupyterlab/galata';
import type { Page } from '@playwright/test';
import * as fs from 'fs';

import {
  closeSessionsAndEmptyTrash,
  expectSuspended,
  newNotebook,
  openNotebook,
  reportBrowserOnFailure,
  serverState,
  shot,
  suspendByRest,
  waitForLab
} from './helpers';

reportBrowserOnFailure(test);

/** A 1×1 PNG: an Image widget's value travels as a binary buffer. */
const PIXEL =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';

const SLIDER_AND_LABEL = [
  'import base64, ipywidgets as w',
  'slider = w.IntSlider(value=3, max=10, description="n")',
  'label = w.Label("not moved")',
  'slider.observe(lambda change: setattr(label, "value", f"moved to {change.new}"), "value")',
  `pixel = w.Image(value=base64.b64decode("${PIXEL}"), format="png", width=20)`,
  'w.VBox([slider, label, pixel])'
].join('\n');

/** The decoded width of the output's image: 1 once its bytes came through. */
async function pixelWidth(page: Page): Promise<number> {
  return page
    .locator('.jp-OutputArea-output img')
    .evaluate(img => (img as HTMLImageElement).naturalWidth);
}

test.describe('widgets of a suspended kernel', () => {
  test.skip(
    !fs.existsSync('/proc/self/cmdline'),
    'needs /proc to check for the kernel process'
  );
  // As in suspended.spec.ts: talk to the server's /api/sessions directly.
  test.use({ kernels: null as any, sessions: null as any });

  test.afterEach(async ({ request }) => {
    await closeSessionsAndEmptyTrash(request);
  });

  test('a reload draws the slider without a restore; moving it restores the kernel and the label follows', async ({
    page
  }) => {
    const kernelId = await newNotebook(page, 'slider.ipynb', SLIDER_AND_LABEL);
    const output = page.locator('.jp-OutputArea-output');
    const readout = output.locator('.widget-readout');
    await expect(readout).toHaveText('3');
    await expect.poll(() => pixelWidth(page)).toBe(1);
    await page.notebook.save(); // the reload reads the notebook, its widget output included
    const path = (await serverState(page, kernelId)).notebook_path;
    await suspendByRest(page, kernelId);
    await expectSuspended(page, kernelId);

    const consoleErrors: string[] = [];
    page.on('console', message => {
      if (message.type() === 'error') {
        consoleErrors.push(message.text());
      }
    });
    await page.evaluate(() => location.reload());
    await waitForLab(page);
    expect(await openNotebook(page, path)).toBe(kernelId);
    await expect(readout).toHaveText('3');
    await expect(output).toContainText('not moved');
    await expect.poll(() => pixelWidth(page)).toBe(1);
    await page.waitForTimeout(5000); // the restore this guards against came about 2 s after the reload
    await expectSuspended(page, kernelId);
    expect(consoleErrors.filter(e => /comm not found/i.test(e))).toEqual([]);
    await shot(page, 'widgets-after-reload-suspended');

    // The user moves the slider one step with the keyboard.
    await output.locator('.noUi-handle').focus();
    await page.keyboard.press('ArrowRight');
    await expect(output).toContainText('moved to 4', { timeout: 120000 });
    await expect(readout).toHaveText('4');
    expect((await serverState(page, kernelId)).state).toBe('running');
    await shot(page, 'widgets-moved-restored');
  });
});
