/**
 * Notifications when a suspend or restore finishes or fails, from the state
 * transitions the model sees (whoever started the operation: this tab,
 * another tab, the idle culler, or a cell run in a suspended kernel).
 */
import { Notification } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';

import { GpucrModel, IKernelTransition } from './model';
import { INotice, kernelLabel, NoticeAction, transitionNotice } from './state';
import { CommandIDs } from './tokens';

export function connectNotifications(options: {
  model: GpucrModel;
  commands: CommandRegistry;
  pathForKernel: (kernelId: string) => string | null;
}): void {
  const { model, commands, pathForKernel } = options;

  const action = (
    name: NoticeAction,
    kernelId: string
  ): Notification.IAction => {
    switch (name) {
      case 'retry-suspend':
        return {
          label: 'Retry',
          caption: 'Suspend the kernel again',
          callback: () =>
            void commands.execute(CommandIDs.suspend, {
              kernelId,
              confirm: false
            })
        };
      case 'suspend-snapshot':
        return {
          label: 'Use snapshot engine',
          caption:
            'Suspend with the portable snapshot engine (the kernel saves its own variables; no CRIU needed)',
          callback: () =>
            void commands.execute(CommandIDs.suspend, {
              kernelId,
              engine: 'snapshot',
              confirm: false
            })
        };
      case 'retry-resume':
        return {
          label: 'Retry',
          caption: 'Restore the kernel again',
          displayType: 'accent',
          callback: () => void commands.execute(CommandIDs.resume, { kernelId })
        };
      case 'resume-other-gpu':
        return {
          label: 'Choose GPU…',
          caption: 'Restore the kernel on another GPU',
          callback: () =>
            void commands.execute(CommandIDs.resume, {
              kernelId,
              chooseGpu: true
            })
        };
      case 'doctor':
        return {
          label: 'What works here?',
          caption: 'Open the checkpoints panel and its doctor report',
          displayType: 'link',
          callback: () => {
            void model.refreshDoctor();
            void commands.execute(CommandIDs.openPanel);
          }
        };
      case 'open-panel':
      default:
        return {
          label: 'Show checkpoints',
          displayType: 'link',
          callback: () => void commands.execute(CommandIDs.openPanel)
        };
    }
  };

  const show = (notice: INotice, kernelId: string) => {
    Notification.emit(notice.message, notice.type, {
      autoClose: notice.type === 'success' ? 6000 : false,
      actions: notice.actions.map(name => action(name, kernelId))
    });
  };

  model.kernelChanged.connect((_: GpucrModel, change: IKernelTransition) => {
    if (!change.current) {
      return;
    }
    const notice = transitionNotice(
      change.previous,
      change.current,
      kernelLabel(change.kernelId, pathForKernel(change.kernelId))
    );
    if (notice) {
      show(notice, change.kernelId);
    }
  });
}
