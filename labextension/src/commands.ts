/**
 * Commands: suspend (now, when the cell finishes, or after interrupting it),
 * cancel a pending suspend, resume, shut down a kernel (its saved state goes
 * to the trash), delete a checkpoint, restore or delete from the trash, open
 * the panel, refresh.
 *
 * They act on `args.kernelId` / `args.checkpointId` / `args.trashId` when
 * given (side panel, Running sidebar, notifications) and else on the current
 * notebook's kernel (toolbar, Kernel menu, palette, keyboard shortcut).
 */
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { CommandRegistry } from '@lumino/commands';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { GpucrRequestError } from './api';
import { refreshOnKernelChanges } from './availability';
import { formatBytes } from './format';
import { resumeIcon, suspendIcon } from './icons';
import { fitToast, kernelLabel, plainError, replaceQuestion } from './messages';
import { GpucrModel } from './model';
import { GpucrNotifier } from './notifications';
import { KernelShutdowns } from './shutdown';
import { confirmTrash, IKernelShutdown } from './shutdownguard';
import { canResume, canSuspend } from './state';
import { CommandIDs } from './tokens';
import type { SuspendWhen } from './types';

export interface ICommandContext {
  commands: CommandRegistry;
  model: GpucrModel;
  tracker: INotebookTracker;
  notifier: GpucrNotifier;
  kernels: Kernel.IManager;
  /** The kernel manager's shutdown without the guard's question (asked here). */
  unguarded: IKernelShutdown;
  /** Shutting down several kernels: one question, one notice. */
  shutdowns: KernelShutdowns;
  /** The `confirmSuspend` setting. */
  confirmSuspend: () => boolean;
  /** Turn the `confirmSuspend` setting off ("do not ask again"). */
  disableConfirmSuspend: () => Promise<void>;
  openPanel: () => void;
}

/** The current notebook's kernel id, if it has a kernel. */
export function currentKernelId(tracker: INotebookTracker): string | null {
  return tracker.currentWidget?.sessionContext.session?.kernel?.id ?? null;
}

/** The open notebook whose session uses this kernel, if any. */
export function panelForKernel(
  tracker: INotebookTracker,
  kernelId: string
): NotebookPanel | undefined {
  return tracker.find(p => p.sessionContext.session?.kernel?.id === kernelId);
}

/** Labels of the busy dialog's buttons, and what each asks of the server. */
const WHEN_IDLE = 'Suspend when this cell finishes';
const INTERRUPT = 'Interrupt and suspend';

export function addCommands(ctx: ICommandContext): void {
  const { commands, model, tracker, notifier } = ctx;

  const targetKernel = (args: ReadonlyPartialJSONObject): string | null =>
    (args.kernelId as string | undefined) ?? currentKernelId(tracker);

  /** An error in plain words: kernel ids replaced by `name`, no HTTP status. */
  const errorText = (error: unknown, name: string): string =>
    error instanceof GpucrRequestError
      ? plainError(error.message, error.reason, name)
      : String((error as Error)?.message ?? error);

  commands.addCommand(CommandIDs.suspend, {
    label: args => (args.toolbar ? '' : 'Suspend Kernel to Disk'),
    caption:
      'Write the kernel (variables, loaded models, GPU memory) to disk and free its memory',
    icon: args => (args.toolbar || args.isPalette ? suspendIcon : undefined),
    isEnabled: args => {
      const kernelId = targetKernel(args);
      if (!kernelId || model.isBusy(kernelId)) {
        return false;
      }
      const state = model.getKernel(kernelId);
      return state ? canSuspend(state) : model.available !== false;
    },
    execute: async args => {
      const kernelId = targetKernel(args);
      if (!kernelId) {
        return;
      }
      const name = notifier.label(kernelId);
      let when = args.when as SuspendWhen | undefined;
      const status = panelForKernel(tracker, kernelId)?.sessionContext.session
        ?.kernel?.status;
      if (!when && status === 'busy') {
        const result = await showDialog({
          title: `${name} is running a cell`,
          body:
            'Suspend it as soon as the cell finishes, or interrupt the cell ' +
            '(its work so far is lost) and suspend it now.',
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({ label: INTERRUPT }),
            Dialog.okButton({ label: WHEN_IDLE })
          ],
          defaultButton: 2
        });
        if (!result.button.accept) {
          return;
        }
        when = result.button.label === INTERRUPT ? 'interrupt' : 'idle';
      } else if (ctx.confirmSuspend() && args.confirm !== false) {
        const result = await showDialog({
          title: 'Suspend kernel to disk?',
          body:
            `The kernel of ${name} and everything in it (variables, ` +
            'open files, loaded models, GPU memory) is written to disk and its ' +
            'memory is freed for others. Run a cell or click Resume to bring ' +
            'it back.',
          buttons: [
            Dialog.cancelButton(),
            Dialog.okButton({ label: 'Suspend' })
          ],
          checkbox: { label: 'Do not ask again', checked: false },
          defaultButton: 1
        });
        if (!result.button.accept) {
          return;
        }
        if (result.isChecked) {
          await ctx.disableConfirmSuspend();
        }
      }
      try {
        await model.suspend(kernelId, {
          engine: args.engine as string | undefined,
          when
        });
      } catch (error) {
        if (error instanceof GpucrRequestError && error.isBusy) {
          notifier.showBusy(kernelId);
        } else {
          // The failure notification comes from the state transition.
          console.warn('gpucr: suspend failed', error);
        }
      }
    }
  });

  commands.addCommand(CommandIDs.cancelSuspend, {
    label: 'Cancel Pending Suspend',
    caption: 'Keep the kernel running instead of suspending it after the cell',
    isEnabled: args =>
      model.getKernel(targetKernel(args))?.state === 'suspend-pending',
    execute: async args => {
      const kernelId = targetKernel(args);
      if (!kernelId) {
        return;
      }
      try {
        await model.cancelSuspend(kernelId);
      } catch (error) {
        Notification.warning(
          fitToast(
            `Could not cancel the suspend: ${errorText(error, notifier.label(kernelId))}`
          ),
          { autoClose: 8000 }
        );
      }
    }
  });

  commands.addCommand(CommandIDs.resume, {
    label: args => (args.toolbar ? '' : 'Resume Kernel'),
    caption: 'Restore the suspended kernel from disk',
    icon: args => (args.toolbar || args.isPalette ? resumeIcon : undefined),
    isEnabled: args => {
      const kernelId = targetKernel(args);
      return (
        !!kernelId &&
        !model.isBusy(kernelId) &&
        canResume(model.getKernel(kernelId))
      );
    },
    execute: async args => {
      const kernelId = targetKernel(args);
      if (!kernelId) {
        return;
      }
      let gpu = args.gpu as string | undefined;
      if (args.chooseGpu) {
        await model.refreshLists();
        const items = [
          'auto (the GPU with the most free memory)',
          ...model.gpus.map(
            g => `${g.index}: ${g.name} (${formatBytes(g.memory_free)} free)`
          )
        ];
        const choice = await InputDialog.getItem({
          title: 'Restore on which GPU?',
          items,
          current: 0
        });
        if (!choice.button.accept || choice.value === null) {
          return;
        }
        gpu = choice.value.startsWith('auto')
          ? 'auto'
          : choice.value.split(':')[0];
      }
      try {
        await model.resume(kernelId, gpu);
      } catch (error) {
        console.warn('gpucr: resume failed', error);
      }
    }
  });

  commands.addCommand(CommandIDs.startFresh, {
    label: 'Start Fresh Kernel',
    caption:
      'Restart the suspended kernel empty: its saved state goes to the trash, from where it can still be restored',
    isEnabled: args => {
      const kernelId = targetKernel(args);
      return (
        !!kernelId &&
        !model.isBusy(kernelId) &&
        model.getKernel(kernelId)?.state === 'suspended'
      );
    },
    execute: async args => {
      const kernelId = targetKernel(args);
      if (!kernelId) {
        return;
      }
      // A restart of a suspended kernel moves its checkpoint to the trash and
      // starts an empty kernel under the same id, for the same notebooks.
      const panel = panelForKernel(tracker, kernelId);
      try {
        if (panel) {
          await panel.sessionContext.restartKernel();
        } else {
          const found = await ctx.kernels.findById(kernelId);
          if (!found) {
            return;
          }
          const kernel = ctx.kernels.connectTo({ model: found });
          try {
            await kernel.restart();
          } finally {
            kernel.dispose();
          }
        }
      } catch (error) {
        const name = notifier.label(kernelId);
        Notification.error(
          fitToast(`Could not start ${name} fresh: ${errorText(error, name)}`),
          { autoClose: false }
        );
      }
    }
  });

  commands.addCommand(CommandIDs.shutdownKernel, {
    label: 'Shut Down Kernel',
    caption:
      'Shut the kernel down; the saved state of a suspended kernel goes to the trash',
    isEnabled: args => !!targetKernel(args),
    execute: async args => {
      const kernelId = targetKernel(args);
      if (!kernelId) {
        return;
      }
      const state = model.getKernel(kernelId);
      const suspended = state?.state === 'suspended';
      const name = notifier.label(kernelId);
      if (
        suspended &&
        !(await confirmTrash(state, k => notifier.label(k), model.trashHours))
      ) {
        return;
      }
      try {
        const panel = panelForKernel(tracker, kernelId);
        if (panel) {
          await panel.sessionContext.shutdown();
        } else {
          await ctx.unguarded.shutdown(kernelId);
        }
      } catch (error) {
        Notification.error(
          fitToast(`Could not shut down ${name}: ${errorText(error, name)}`),
          { autoClose: false }
        );
        return;
      }
      if (suspended) {
        notifier.trashed(kernelId, name);
      }
      await model.refreshLists();
    }
  });

  // Kernel > Shut Down All Kernels… (in place of JupyterLab's, removed from
  // the menu): one question listing what happens to each kernel.
  commands.addCommand(CommandIDs.shutdownAll, {
    label: 'Shut Down All Kernels…',
    caption:
      'Shut down every kernel; the saved state of suspended ones goes to the trash',
    isEnabled: () => ctx.kernels.runningCount > 0,
    execute: () =>
      ctx.shutdowns.askAndShutDown([...ctx.kernels.running()].map(k => k.id))
  });

  commands.addCommand(CommandIDs.deleteCheckpoint, {
    label: 'Delete Checkpoint',
    caption: 'Delete a checkpoint no kernel is suspended in, for good',
    isEnabled: args => !!args.checkpointId,
    execute: async args => {
      const checkpointId = args.checkpointId as string | undefined;
      if (!checkpointId) {
        return;
      }
      const checkpoint = model.checkpoints.find(c => c.id === checkpointId);
      const what = checkpoint
        ? `${kernelLabel(checkpoint.kernel_id ?? '', checkpoint.notebook_path)} (${formatBytes(checkpoint.size)})`
        : checkpointId;
      const result = await showDialog({
        title: 'Delete checkpoint for good?',
        body: `The checkpoint of ${what} is deleted from disk; it cannot be brought back.`,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await model.deleteCheckpoint(checkpointId);
        Notification.success(`Checkpoint of ${what} deleted.`, {
          autoClose: 4000
        });
      } catch (error) {
        Notification.error(
          fitToast(
            `Could not delete the checkpoint: ${errorText(error, what)}`
          ),
          { autoClose: false }
        );
      }
    }
  });

  // A failed restore's warning, by trash id: closed once the item left the trash.
  const trashWarnings = new Map<string, string>();
  const dismissTrashWarning = (trashId: string) => {
    const id = trashWarnings.get(trashId);
    if (id !== undefined) {
      Notification.dismiss(id);
      trashWarnings.delete(trashId);
    }
  };
  model.changed.connect(() => {
    for (const trashId of [...trashWarnings.keys()]) {
      if (!model.trash.some(t => t.id === trashId)) {
        dismissTrashWarning(trashId);
      }
    }
  });

  commands.addCommand(CommandIDs.restoreFromTrash, {
    label: 'Restore from Trash',
    caption: 'Put the saved state back: the kernel is suspended again',
    isEnabled: args => !!args.trashId,
    execute: async args => {
      const item = model.trash.find(t => t.id === args.trashId);
      if (!item) {
        return;
      }
      dismissTrashWarning(item.id);
      const name = kernelLabel(item.kernel_id ?? '', item.notebook_path);
      // The notebook, open without a kernel, takes its kernel back itself:
      // the server makes no session for it (it would have two).
      const waiting = tracker.find(
        p =>
          p.context.path === item.notebook_path &&
          !p.sessionContext.session?.kernel
      );
      const restore = (replace: boolean) => {
        return model.restoreFromTrash(item.id, {
          replace,
          sessions: !waiting
        });
      };
      const warn = (error: unknown) => {
        const text = errorText(error, name);
        trashWarnings.set(
          item.id,
          Notification.warning(fitToast(`Could not restore ${name}: ${text}`), {
            autoClose: false,
            actions: [
              {
                label: 'Details',
                displayType: 'link',
                callback: event => {
                  event.preventDefault(); // the warning stays until closed
                  void showDialog({
                    title: `Could not restore ${name}`,
                    body: text,
                    buttons: [Dialog.okButton({ label: 'Close' })]
                  });
                }
              }
            ]
          })
        );
      };
      let state;
      try {
        state = await restore(false);
      } catch (error) {
        if (!(error instanceof GpucrRequestError && error.isReplaced)) {
          warn(error);
          return;
        }
        const result = await showDialog({
          title: `Restore the saved state of ${name}?`,
          body: replaceQuestion(name, model.getKernel(item.kernel_id)),
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({
              label: 'Shut down the new kernel and restore the saved one'
            })
          ]
        });
        if (!result.button.accept) {
          return;
        }
        try {
          state = await restore(true);
        } catch (again) {
          warn(again);
          return;
        }
      }
      if (waiting && !waiting.isDisposed) {
        await waiting.sessionContext.changeKernel({ id: state.kernel_id });
      }
      // In place of the kernel's last notice (its "shut down" one), not beside it.
      notifier.show(state.kernel_id, {
        type: 'success',
        message: fitToast(
          `${name} is back, suspended: run a cell in it to bring its variables back.`
        ),
        actions: [],
        autoClose: 6000
      });
    }
  });

  commands.addCommand(CommandIDs.deleteFromTrash, {
    label: 'Delete Forever',
    caption: 'Delete the saved state from the trash, for good',
    isEnabled: args => !!args.trashId,
    execute: async args => {
      const item = model.trash.find(t => t.id === args.trashId);
      if (!item) {
        return;
      }
      const name = kernelLabel(item.kernel_id ?? '', item.notebook_path);
      const result = await showDialog({
        title: 'Delete forever?',
        body: `The saved state of ${name} (${formatBytes(item.size)}) is deleted from disk; it cannot be brought back.`,
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: 'Delete Forever' })
        ]
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await model.deleteFromTrash(item.id);
      } catch (error) {
        Notification.error(
          fitToast(`Could not delete ${name}: ${errorText(error, name)}`),
          { autoClose: false }
        );
      }
    }
  });

  commands.addCommand(CommandIDs.openPanel, {
    label: 'Show Suspended Kernels',
    caption: 'Suspended kernels, checkpoints, trash and free GPU memory',
    execute: () => ctx.openPanel()
  });

  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh Suspended Kernels',
    execute: async () => {
      const kernelId = currentKernelId(tracker);
      await Promise.all([
        kernelId ? model.refreshKernel(kernelId) : Promise.resolve(),
        model.refreshLists()
      ]);
    }
  });

  refreshOnKernelChanges(model, tracker, () => {
    commands.notifyCommandChanged(CommandIDs.suspend);
    commands.notifyCommandChanged(CommandIDs.cancelSuspend);
    commands.notifyCommandChanged(CommandIDs.resume);
  });
}
