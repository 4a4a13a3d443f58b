/**
 * "Fork Kernel": a copy of the current notebook's kernel (its variables,
 * models, GPU memory) as a new kernel, and a copy of the notebook attached
 * to it, opened beside the original. The copy is `NAME-fork-N.ipynb` in the
 * notebook's folder, N the first number not taken; it holds the notebook as
 * it is on screen (unsaved edits too), so its cells match the kernel's state.
 *
 * The server makes the kernel (`POST /api/gpucr/kernels/{id}/fork`); a new
 * session for the copy names that kernel's id, so JupyterLab opens the copy
 * on it instead of starting a kernel of its own.
 */
import { Notification } from '@jupyterlab/apputils';
import { PathExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Contents } from '@jupyterlab/services';
import { LabIcon } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';

import { GpucrRequestError } from './api';
import { refreshOnKernelChanges } from './availability';
import { fitToast, plainError } from './messages';
import { GpucrModel } from './model';
import { canResume, canSuspend } from './state';
import { CommandIDs } from './tokens';

export const forkIcon = new LabIcon({
  name: 'jupyter-gpucr:fork',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<g class="jp-icon3" fill="none" stroke="#616161" stroke-width="2" stroke-linecap="round">' +
    '<circle cx="6" cy="5" r="2"/><circle cx="6" cy="19" r="2"/><circle cx="18" cy="19" r="2"/>' +
    '<path d="M6 7v10M6 11c0 4 12 2 12 6"/></g></svg>'
});

export interface IForkContext {
  commands: CommandRegistry;
  model: GpucrModel;
  tracker: INotebookTracker;
  contents: Contents.IManager;
  /** How the user calls a kernel (its notebook's name). */
  label: (kernelId: string) => string;
}

/** The first `NAME-fork-N.ipynb` beside `path` that does not exist. */
export async function nextForkPath(
  contents: Contents.IManager,
  path: string
): Promise<string> {
  const dir = PathExt.dirname(path);
  const ext = PathExt.extname(path);
  const stem = PathExt.basename(path, ext);
  for (let n = 1; ; n++) {
    const candidate = PathExt.join(dir, `${stem}-fork-${n}${ext}`);
    try {
      await contents.get(candidate, { content: false });
    } catch {
      return candidate;
    }
  }
}

export function addForkCommand(ctx: IForkContext): void {
  const { commands, model, tracker } = ctx;
  const current = (): NotebookPanel | null => tracker.currentWidget;

  commands.addCommand(CommandIDs.fork, {
    label: args => (args.toolbar ? '' : 'Fork Kernel'),
    caption:
      'Copy the kernel (variables, loaded models, GPU memory) into a new kernel, and open a copy of the notebook on it',
    icon: args => (args.toolbar || args.isPalette ? forkIcon : undefined),
    isEnabled: () => {
      const kernelId = current()?.sessionContext.session?.kernel?.id;
      if (!kernelId || model.isBusy(kernelId)) {
        return false;
      }
      const state = model.getKernel(kernelId);
      return state ? canSuspend(state) || canResume(state) : true;
    },
    execute: async () => {
      const panel = current();
      const kernelId = panel?.sessionContext.session?.kernel?.id;
      if (!panel || !kernelId) {
        return;
      }
      const name = ctx.label(kernelId);
      const pending = Notification.emit(`Forking ${name}…`, 'in-progress', {
        autoClose: false
      });
      try {
        const [forkId] = await model.client.fork(kernelId, {
          count: 1,
          gpu: 'auto'
        });
        const path = await nextForkPath(ctx.contents, panel.context.path);
        await ctx.contents.save(path, {
          type: 'notebook',
          format: 'json',
          content: panel.content.model?.toJSON()
        });
        await model.client.attachSession(path, forkId);
        await commands.execute('docmanager:open', {
          path,
          factory: 'Notebook'
        });
        Notification.update({
          id: pending,
          message: `Forked ${name}: ${PathExt.basename(path)} runs on the copy of its kernel.`,
          type: 'success',
          autoClose: 5000
        });
      } catch (error) {
        const text =
          error instanceof GpucrRequestError
            ? plainError(error.message, error.reason, name)
            : String((error as Error)?.message ?? error);
        Notification.update({
          id: pending,
          message: fitToast(`Could not fork ${name}: ${text}`),
          type: 'error',
          autoClose: false
        });
      }
    }
  });

  refreshOnKernelChanges(model, tracker, () =>
    commands.notifyCommandChanged(CommandIDs.fork)
  );
}
