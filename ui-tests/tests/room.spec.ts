/**
 * The side panel says what the kernels hold under the host memory budget
 * (this machine has no GPU; on one, each GPU's row says the same from the
 * same report), and how much of it idle kernels hold that could be made room
 * of: a kernel running a cell is not idle (against the real server extension,
 * c.GPUCR.host_memory_budget 16 GiB, a kernel that declares 10 GiB).
 */
import { expect, test } from '@jupyterlab/galata';

import { newNotebook, reportBrowserOnFailure, shot } from './helpers';

reportBrowserOnFailure(test);

const ROOM_KERNEL = {
  name: 'python3-room',
  display_name: 'Python 3 (declares 10 GiB)'
};

test.describe('what the kernels hold', () => {
  test.afterEach(async ({ request }) => {
    for (const session of await (await request.get('/api/sessions')).json()) {
      await request.delete(`/api/sessions/${session.id}`);
    }
  });

  test('the side panel says what the kernels hold of the host memory budget, and what of it is idle', async ({
    page,
    request
  }) => {
    // Only this test's kernel counts.
    for (const kernel of await (await request.get('/api/kernels')).json()) {
      await request.delete(`/api/kernels/${kernel.id}`);
    }
    await newNotebook(page, 'room.ipynb', 'x = 1', ROOM_KERNEL);
    await page.evaluate(() =>
      (window as any).jupyterapp.commands.execute('gpucr:open-panel')
    );
    const panel = page.locator('#jp-gpucr-panel');
    const host = panel.locator('.jp-gpucr-Panel-host');
    const line = host.locator('.jp-gpucr-Room');
    await expect(host.locator('h3')).toHaveText('Host memory');
    await expect(line).toHaveText(
      '10 GiB of 16 GiB held by kernels, 10 GiB idle (could be made room of), 6.0 GiB free'
    );
    await expect(line).toHaveAttribute(
      'title',
      /room\.ipynb: 10 GiB, unused for \d+ s, could be suspended to make room/
    );
    await expect(panel.locator('.jp-gpucr-Panel-gpus')).toContainText(
      'No GPU visible to the server'
    );
    await shot(page, 'room-idle', panel);

    // A kernel running a cell is kept: nothing of it is idle.
    await page.evaluate(() =>
      (
        window as any
      ).jupyterapp.shell.currentWidget.sessionContext.session.kernel.requestExecute(
        { code: 'import time; time.sleep(60)' }
      )
    );
    await expect(line).toHaveText(
      '10 GiB of 16 GiB held by kernels, none idle, 6.0 GiB free'
    );
    await expect(line).toHaveAttribute(
      'title',
      /room\.ipynb: 10 GiB, kept: running a cell/
    );
    await shot(page, 'room-busy', panel);
    await expect(host).not.toContainText('gpucr');
  });
});
