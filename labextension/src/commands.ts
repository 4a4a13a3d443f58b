/**
 * Commands: suspend, resume, delete a checkpoint, open the panel, refresh.
 *
 * They act on `args.kernelId` / `args.checkpointId` when given (side panel,
 * notifications) and else on the current notebook's kernel (toolbar, Kernel
 * menu, palette, keyboard shortcut).
 */
import {
  Dialog,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { CommandRegistry } from '@lumino/commands';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { formatBytes } from './format';
import { resumeIcon, suspendIcon } from './icons';
import { GpucrModel, GpucrRequestError } from './model';
import { canResume, canSuspend, kernelLabel } from './state';
import { CommandIDs } from './tokens';

export interface ICommandContext {
  commands: CommandRegistry;
  model: GpucrModel;
  tracker: INotebookTracker;
  /** The `confirmSuspend` setting. */
  confirmSuspend: () => boolean;
  /** Turn the `confirmSuspend` setting off ("do not ask again"). */
  disableConfirmSuspend: () => Promise<void>;
  openPanel: () => void;
  pathForKernel: (kernelId: string) => string | null;
}

/** The current notebook's kernel id, if it has a kernel. */
export function currentKernelId(tracker: INotebookTracker): string | null {
  return tracker.currentWidget?.sessionContext.session?.kernel?.id ?? null;
}

export function addCommands(ctx: ICommandContext): void {
  const { commands, model, tracker } = ctx;

  const targetKernel = (args: ReadonlyPartialJSONObject): string | null =>
    (args.kernelId as string | undefined) ?? currentKernelId(tracker);

  const label = (kernelId: string): string =>
    kernelLabel(kernelId, ctx.pathForKernel(kernelId));

  commands.addCommand(CommandIDs.suspend, {
    label: args => (args.toolbar ? '' : 'Suspend Kernel to Disk'),
    caption:
      'Write the kernel (variables, loaded models, GPU memory) to disk and free its GPU',
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
      if (ctx.confirmSuspend() && args.confirm !== false) {
        const result = await showDialog({
          title: 'Suspend kernel to disk?',
          body:
            `The kernel of ${label(kernelId)} and everything in it (variables, ` +
            'open files, loaded models, GPU memory) is written to disk and its ' +
            'GPU is freed for others. Run a cell or click Resume to bring it ' +
            'back, on whichever GPU has room.',
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
        await model.suspend(kernelId, args.engine as string | undefined);
      } catch (error) {
        // The failure notification comes from the state transition.
        console.warn('gpucr: suspend failed', error);
      }
    }
  });

  commands.addCommand(CommandIDs.resume, {
    label: args => (args.toolbar ? '' : 'Resume Kernel'),
    caption: 'Restore the suspended kernel from its checkpoint',
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

  commands.addCommand(CommandIDs.deleteCheckpoint, {
    label: 'Delete Checkpoint',
    caption: 'Delete a checkpoint from disk',
    isEnabled: args => {
      if (args.checkpointId) {
        return true;
      }
      const kernelId = currentKernelId(tracker);
      return !!model.getKernel(kernelId)?.checkpoint?.id;
    },
    execute: async args => {
      let checkpointId = args.checkpointId as string | undefined;
      if (!checkpointId) {
        checkpointId = model.getKernel(currentKernelId(tracker))?.checkpoint
          ?.id;
      }
      if (!checkpointId) {
        return;
      }
      const checkpoint = model.checkpoints.find(c => c.id === checkpointId);
      const kernel = checkpoint?.kernel_id
        ? model.getKernel(checkpoint.kernel_id)
        : [...model.kernels.values()].find(
            k => k.checkpoint?.id === checkpointId
          );
      const inUse =
        kernel?.state === 'suspended' &&
        (!kernel.checkpoint || kernel.checkpoint.id === checkpointId);
      const what = checkpoint
        ? `${checkpoint.notebook_path || checkpoint.name} (${formatBytes(checkpoint.size)})`
        : checkpointId;
      const result = await showDialog({
        title: 'Delete checkpoint?',
        body: inUse
          ? `The kernel of ${what} is suspended from this checkpoint: deleting it loses the kernel's state for good.`
          : `Delete the checkpoint of ${what} from disk?`,
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
        const status =
          error instanceof GpucrRequestError ? ` (HTTP ${error.status})` : '';
        Notification.error(
          `Could not delete the checkpoint${status}: ${(error as Error).message}`,
          { autoClose: false }
        );
      }
    }
  });

  commands.addCommand(CommandIDs.openPanel, {
    label: 'Show GPU Checkpoints',
    caption: 'Suspended kernels, checkpoints and free GPU memory',
    execute: () => ctx.openPanel()
  });

  commands.addCommand(CommandIDs.refresh, {
    label: 'Refresh GPU Checkpoints',
    execute: async () => {
      const kernelId = currentKernelId(tracker);
      await Promise.all([
        kernelId ? model.refreshKernel(kernelId) : Promise.resolve(),
        model.refreshLists()
      ]);
    }
  });

  // Keep toolbar buttons and menus in step with the kernel state.
  const refreshEnabled = () => {
    commands.notifyCommandChanged(CommandIDs.suspend);
    commands.notifyCommandChanged(CommandIDs.resume);
    commands.notifyCommandChanged(CommandIDs.deleteCheckpoint);
  };
  model.kernelChanged.connect(refreshEnabled);
  tracker.currentChanged.connect(refreshEnabled);
}
