/**
 * Helpers shared by the UI tests (all against the real server extension).
 */
import type {
  IJupyterLabPageFixture,
  test as galataTest
} from '@jupyterlab/galata';
import type { APIRequestContext, Locator, Page } from '@playwright/test';
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
 * names its connection file `kernel-<id>.json`. A kernel restored lazily has
 * an empty command line until CRIU's lazy-pages daemon has brought back the
 * page that holds it: then it counts if its parent is the kernel's namespace
 * holder (whose command line names `procs/<id>/`).
 */
export function kernelPids(kernelId: string): number[] {
  const pids: number[] = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) {
      continue;
    }
    const cmdline = readProc(entry, 'cmdline');
    if (cmdline === null) {
      continue; // exited meanwhile
    }
    if (
      cmdline.includes(`kernel-${kernelId}.json`) ||
      (cmdline === '' && isHolderOf(livingParent(entry), kernelId))
    ) {
      pids.push(Number(entry));
    }
  }
  return pids;
}

function readProc(pid: string, file: string): string | null {
  try {
    return fs.readFileSync(`/proc/${pid}/${file}`, 'utf8');
  } catch {
    return null;
  }
}

/** The parent of a process that is not a zombie (whose command line is empty too); '' otherwise. */
function livingParent(pid: string): string {
  // /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces
  const stat = readProc(pid, 'stat') ?? '';
  const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return state && state !== 'Z' && state !== 'X' ? (ppid ?? '') : '';
}

function isHolderOf(pid: string, kernelId: string): boolean {
  const cmdline = pid ? readProc(pid, 'cmdline') : null;
  return !!cmdline && cmdline.includes(`/procs/${kernelId}/.status`);
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
      '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar [data-jp-item-name="gpucr-suspend"] :is(button, jp-button)'
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

/**
 * Append a code cell to the current notebook and return its index. The
 * source goes into the notebook's model directly: typing it (galata's
 * addCell) costs seconds per cell on a small machine.
 */
export async function appendCell(page: Page, code: string): Promise<number> {
  return page.evaluate(source => {
    const model = (window as any).jupyterapp.shell.currentWidget.content.model;
    model.sharedModel.addCell({ cell_type: 'code', source });
    return model.cells.length - 1;
  }, code);
}

/** The text of every output of the current notebook, cell by cell. */
export async function outputTexts(page: Page): Promise<string[]> {
  return page.evaluate(() => {
    const model = (window as any).jupyterapp.shell.currentWidget.content.model;
    const texts: string[] = [];
    for (let i = 0; i < model.cells.length; i++) {
      const cell = model.cells.get(i);
      const outputs = cell.type === 'code' ? cell.outputs.toJSON() : [];
      texts.push(JSON.stringify(outputs));
    }
    return texts;
  });
}

/**
 * Run cell `index` of the current notebook with JupyterLab's own command
 * (works in any page, galata's or not) and wait for its text output.
 */
export async function runCellAndWait(
  page: Page,
  index: number,
  timeout = 120000
): Promise<string> {
  await page.evaluate(async i => {
    const app = (window as any).jupyterapp;
    app.shell.currentWidget.content.activeCellIndex = i;
    await app.commands.execute('notebook:run-cell');
  }, index);
  const handle = await page.waitForFunction(
    i => {
      const model = (window as any).jupyterapp.shell.currentWidget.content
        .model;
      const outputs = model.cells.get(i).outputs.toJSON();
      const text = outputs
        .map((o: any) =>
          [].concat(o.text ?? o.data?.['text/plain'] ?? o.evalue ?? '').join('')
        )
        .join('');
      return text || null;
    },
    index,
    { timeout, polling: 250 }
  );
  return (await handle.jsonValue()) as string;
}

/** Run code in a new cell of the current notebook and return its text output. */
export async function runCode(page: Page, code: string): Promise<string> {
  return runCellAndWait(page, await appendCell(page, code));
}

/**
 * That a kernel is suspended for real: the server says `suspended` and no
 * process of the kernel is left on this machine (the server's /proc).
 */
export async function expectSuspended(
  page: Page,
  kernelId: string
): Promise<void> {
  const state = await serverState(page, kernelId);
  if (state.state !== 'suspended') {
    throw new Error(`kernel ${kernelId} is ${state.state}, not suspended`);
  }
  const pids = kernelPids(kernelId);
  if (pids.length) {
    throw new Error(`kernel ${kernelId} still has processes ${pids}`);
  }
}

/** Suspend a kernel through the REST API (when the test is about what follows). */
export async function suspendByRest(
  page: Page,
  kernelId: string
): Promise<any> {
  const response = await page.request.post(
    `/api/gpucr/kernels/${kernelId}/suspend`,
    { data: {} }
  );
  if (response.status() !== 200) {
    throw new Error(
      `suspend ${kernelId}: HTTP ${response.status()} ${await response.text()}`
    );
  }
  return response.json();
}

/**
 * Create a notebook with one code cell in galata's test directory, open it
 * with a Python kernel and run the cell; returns the kernel id. (galata's
 * createNew waits for a kernel selection dialog that JupyterLab shows for
 * the first new notebook only.)
 */
export async function newNotebook(
  page: IJupyterLabPageFixture,
  name: string,
  source: string,
  kernel: { name: string; display_name: string } = {
    name: 'python3',
    display_name: 'Python 3 (ipykernel)'
  }
): Promise<string> {
  const dir = await page.filebrowser.getCurrentDirectory();
  const path = dir ? `${dir}/${name}` : name;
  await page.evaluate(
    async ({ path, source, kernel }) => {
      const app = (window as any).jupyterapp;
      await app.serviceManager.contents.save(path, {
        type: 'notebook',
        format: 'json',
        content: {
          cells: [
            {
              cell_type: 'code',
              source,
              metadata: {},
              outputs: [],
              execution_count: null
            }
          ],
          metadata: {
            kernelspec: { ...kernel, language: 'python' }
          },
          nbformat: 4,
          nbformat_minor: 5
        }
      });
      await app.commands.execute('docmanager:open', {
        path,
        kernel: { name: kernel.name }
      });
    },
    { path, source, kernel }
  );
  await page.waitForFunction(
    p => (window as any).jupyterapp.shell.currentWidget?.context?.path === p,
    path
  );
  const kernelId = await currentKernelId(page);
  await page.notebook.run();
  return kernelId;
}

/** Wait until JupyterLab in this page is up and has restored its layout. */
export async function waitForLab(page: Page): Promise<void> {
  await page.waitForSelector('#jupyterlab-splash', { state: 'detached' });
  await page.waitForFunction(() =>
    (window as any).jupyterapp?.commands?.hasCommand('docmanager:open')
  );
  await page.evaluate(() => (window as any).jupyterapp.restored);
}

/**
 * Open a notebook by path with JupyterLab's own command and make it current.
 * The command is given again while the notebook is not current with its
 * kernel: right after a reload, the layout being restored can still move the
 * focus to another tab (as a user would, click it again).
 */
export async function openNotebook(page: Page, path: string): Promise<string> {
  const deadline = Date.now() + 60000;
  for (;;) {
    await page.evaluate(
      p =>
        (window as any).jupyterapp.commands.execute('docmanager:open', {
          path: p
        }),
      path
    );
    try {
      await page.waitForFunction(
        p =>
          (window as any).jupyterapp.shell.currentWidget?.context?.path === p &&
          !!(window as any).jupyterapp.shell.currentWidget.sessionContext
            .session?.kernel,
        path,
        { timeout: 5000 }
      );
      return currentKernelId(page);
    } catch (e) {
      if (Date.now() < deadline) {
        continue;
      }
      const current = await page.evaluate(() => {
        const widget = (window as any).jupyterapp.shell.currentWidget;
        return {
          path: widget?.context?.path,
          session: !!widget?.sessionContext?.session,
          kernel: !!widget?.sessionContext?.session?.kernel
        };
      });
      throw new Error(
        `${path} did not become the current notebook with its kernel in 60 s; current: ${JSON.stringify(current)}`
      );
    }
  }
}

/**
 * After a test: close every session (their kernels shut down, those on disk
 * into the trash) and empty the trash, so the next test starts from none.
 */
export async function closeSessionsAndEmptyTrash(
  request: APIRequestContext
): Promise<void> {
  for (const session of await (await request.get('/api/sessions')).json()) {
    await request.delete(`/api/sessions/${session.id}`);
  }
  for (const item of await (await request.get('/api/gpucr/trash')).json()) {
    await request.delete(`/api/gpucr/trash/${item.id}`);
  }
}

/**
 * Keep what the browser said during each test (console warnings and errors,
 * uncaught exceptions, failed requests) and print it, with the server's
 * kernels, when the test fails: a CI log then says what the page saw.
 */
export function reportBrowserOnFailure(test: typeof galataTest): void {
  const said: string[] = [];
  test.beforeEach(async ({ page }) => {
    said.length = 0;
    const stamp = () => new Date().toISOString().slice(11, 23);
    page.on('console', m => {
      if (m.type() === 'error' || m.type() === 'warning') {
        said.push(`${stamp()} console.${m.type()}: ${m.text()}`);
      }
    });
    page.on('pageerror', e => said.push(`${stamp()} uncaught: ${e.message}`));
    page.on('requestfailed', r =>
      said.push(
        `${stamp()} request failed: ${r.method()} ${r.url()} ${r.failure()?.errorText ?? ''}`
      )
    );
  });
  test.afterEach(async ({ request }, testInfo) => {
    if (testInfo.status === testInfo.expectedStatus) {
      return;
    }
    const kernels = await (await request.get('/api/gpucr/kernels')).text();
    console.log(
      `what the browser said during "${testInfo.title}":\n${said.join('\n') || '(nothing)'}\n` +
        `the server's kernels: ${kernels.slice(0, 4000)}`
    );
  });
}
