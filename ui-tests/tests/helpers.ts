/**
 * Helpers shared by the UI tests (all against the real server extension).
 */
import type { Locator, Page } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

export const SHOTS = path.resolve(
  __dirname,
  '..',
  'test-results',
  'screenshots'
);

/** Save a screenshot of the page (or of one element) as screenshots/<name>.png. */
export async function shot(
  page: Page,
  name: string,
  locator?: Locator
): Promise<void> {
  fs.mkdirSync(SHOTS, { recursive: true });
  const file = path.join(SHOTS, `${name}.png`);
  await (locator ?? page).screenshot({ path: file });
}

/**
 * PIDs of this machine's processes that run the kernel: their command line
 * names its connection file `kernel-<id>.json`.
 */
export function kernelPids(kernelId: string): number[] {
  const pids: number[] = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) {
      continue;
    }
    let cmdline = '';
    try {
      cmdline = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8');
    } catch {
      continue; // exited meanwhile
    }
    if (cmdline.includes(`kernel-${kernelId}.json`)) {
      pids.push(Number(entry));
    }
  }
  return pids;
}

/** The id of the current notebook's kernel, once it has one. */
export async function currentKernelId(page: Page): Promise<string> {
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

/** The "Suspend Kernel to Disk" button of the current notebook's toolbar. */
export function suspendButton(page: Page): Locator {
  return page
    .locator(
      '.jp-NotebookPanel-toolbar [data-jp-item-name="gpucr-suspend"] :is(button, jp-button)'
    )
    .first();
}

/** The gpucr REST API's state of a kernel. */
export async function serverState(page: Page, kernelId: string): Promise<any> {
  const response = await page.request.get(`/api/gpucr/kernels/${kernelId}`);
  if (!response.ok()) {
    throw new Error(
      `GET /api/gpucr/kernels/${kernelId}: HTTP ${response.status()}`
    );
  }
  return response.json();
}

/**
 * Record every text the status bar item shows from now on, in
 * `window.__gpucrSeen` as `state|label` strings.
 */
export async function recordStatus(page: Page): Promise<void> {
  await page.evaluate(() => {
    const seen: string[] = [];
    (window as any).__gpucrSeen = seen;
    const record = () => {
      const item = document.querySelector('.jp-gpucr-Status');
      if (!item) {
        return;
      }
      const entry = `${item.getAttribute('data-state')}|${item.textContent ?? ''}`;
      if (seen[seen.length - 1] !== entry) {
        seen.push(entry);
      }
    };
    record();
    new MutationObserver(record).observe(document.body, {
      subtree: true,
      childList: true,
      characterData: true,
      attributes: true,
      attributeFilter: ['data-state']
    });
  });
}

/** What `recordStatus` saw so far: `{ state, label }` in order. */
export async function seenStatus(
  page: Page
): Promise<{ state: string; label: string }[]> {
  const seen: string[] = await page.evaluate(
    () => (window as any).__gpucrSeen ?? []
  );
  return seen.map(entry => {
    const i = entry.indexOf('|');
    return { state: entry.slice(0, i), label: entry.slice(i + 1) };
  });
}
