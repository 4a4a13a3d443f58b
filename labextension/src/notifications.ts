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
          label: 'Try snapshot',
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
          label: 'Diagnose',
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
          label: 'Checkpoints',
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
    const current = change.current;
    if (!current) {
      return;
    }
    const label = kernelLabel(change.kernelId, pathForKernel(change.kernelId));
    const notice = transitionNotice(change.previous, current, label);
    if (!notice) {
      return;
    }
    if (notice.type !== 'error' || current.hint) {
      show(notice, change.kernelId);
      return;
    }
    // Events carry the error but not the server's hint (what the user can
    // do); the REST state has both.
    model.client
      .getKernel(change.kernelId)
      .then(fresh => {
        const better =
          fresh && fresh.error === current.error && fresh.hint
            ? transitionNotice(
                change.previous,
                { ...current, hint: fresh.hint },
                label
              )
            : null;
        show(better ?? notice, change.kernelId);
      })
      .catch(() => show(notice, change.kernelId));
  });
}
