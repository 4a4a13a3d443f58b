/**
 * Notifications: when a suspend or restore finishes or fails, from the state
 * transitions the model sees (whoever started the operation: this tab,
 * another tab, the idle culler, or a cell run in a suspended kernel), and
 * when a suspend is refused because a cell runs.
 *
 * Messages fit a toast (messages.ts: TOAST_MAX); details are behind an action.
 * A notice that no longer applies (a refusal once the kernel is idle or
 * suspended, a failure once the next operation starts) is dismissed.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { CommandRegistry } from '@lumino/commands';

import {
  busyNotice,
  debuggerNotice,
  formatLost,
  INotice,
  kernelLabel,
  NoticeAction,
  sentence,
  transitionNotice,
  trashedNotice
} from './messages';
import { GpucrModel } from './model';
import { NoticeBook } from './noticebook';
import { transitionOf } from './state';
import type { IKernelTransition } from './store';
import { CommandIDs } from './tokens';

export class GpucrNotifier {
  constructor(options: GpucrNotifier.IOptions) {
    this._model = options.model;
    this._commands = options.commands;
    this._pathForKernel = options.pathForKernel;
    this._model.kernelChanged.connect(this._onKernelChanged, this);
  }

  /** The name the user knows a kernel by: its notebook's file name. */
  label(kernelId: string): string {
    return kernelLabel(kernelId, this._pathForKernel(kernelId));
  }

  /**
   * Show a notice about a kernel; it replaces the kernel's last one, so that
   * the bell keeps one per kernel. One that lasts until the state changes (a
   * sticky one, or one that offers to cancel a pending suspend: its Cancel
   * means nothing once it is over) is also closed by that change.
   */
  show(kernelId: string, notice: INotice): void {
    this._busy.delete(kernelId);
    const id = Notification.emit(notice.message, notice.type, {
      autoClose: notice.autoClose,
      actions: notice.actions.map(name => this._action(name, kernelId))
    });
    const replaced = this._notices.put(
      kernelId,
      id,
      notice.autoClose === false || notice.actions.includes('cancel-suspend')
    );
    if (replaced !== undefined) {
      Notification.dismiss(replaced);
    }
  }

  /** Say that a suspended kernel was shut down and where its saved state went. */
  trashed(kernelId: string, label: string): void {
    this.show(kernelId, trashedNotice(label, this._model.trashHours));
  }

  /** Say that a suspend was refused because a cell runs, and what to do. */
  showBusy(kernelId: string): void {
    this.show(kernelId, busyNotice(this.label(kernelId)));
    this._busy.add(kernelId);
  }

  /** Say that the debugger needs the (suspended) kernel running. */
  showDebuggerRefused(kernelId: string): void {
    this.show(kernelId, debuggerNotice(this.label(kernelId)));
  }

  /** The kernel's cell finished (JupyterLab saw it go idle). */
  kernelIdle(kernelId: string): void {
    if (this._busy.has(kernelId)) {
      this.dismiss(kernelId);
    }
  }

  /** Close the kernel's sticky notice, if any. */
  dismiss(kernelId: string): void {
    const id = this._notices.takeSticky(kernelId);
    if (id !== undefined) {
      Notification.dismiss(id);
    }
    this._busy.delete(kernelId);
  }

  private _onKernelChanged(_: GpucrModel, change: IKernelTransition): void {
    const { kernelId, previous, current } = change;
    if (!current) {
      this.dismiss(kernelId);
      return;
    }
    if (previous && previous.state !== current.state) {
      // A new state: the refusal or failure of the last one is stale.
      this.dismiss(kernelId);
    }
    if (change.fromTrash && transitionOf(previous, current) === 'suspended') {
      // Back from the trash, suspended in its old checkpoint: the restore
      // says so itself (commands.ts); nothing was suspended now.
      return;
    }
    const notice = transitionNotice(previous, current, this.label(kernelId), {
      gpus: this._model.gpus.length || undefined
    });
    if (notice) {
      this.show(kernelId, notice);
    }
  }

  private _details(kernelId: string): void {
    const state = this._model.getKernel(kernelId);
    const lines: string[] = [];
    if (state?.error) {
      if (state.summary) {
        lines.push(sentence(state.summary));
      }
      lines.push(state.error);
      if (state.hint) {
        lines.push(`What to do: ${state.hint}`);
      }
    }
    const lost = formatLost(state?.lost, 10000);
    if (lost) {
      lines.push(
        `Not kept by the last restore: ${lost}.` +
          (state?.lost ?? [])
            .filter(l => l.reason)
            .map(l => `\n${l.name}: ${l.reason}`)
            .join('')
      );
    }
    for (const warning of state?.warnings ?? []) {
      lines.push(warning);
    }
    void showDialog({
      title: this.label(kernelId),
      body: lines.join('\n\n') || 'Nothing more to say.',
      buttons: [Dialog.okButton({ label: 'Close' })]
    });
  }

  private _action(name: NoticeAction, kernelId: string): Notification.IAction {
    const run =
      (command: string, args: { [key: string]: any } = {}) =>
      () =>
        void this._commands.execute(command, { kernelId, ...args });
    switch (name) {
      case 'retry-suspend':
        return {
          label: 'Retry',
          caption: 'Suspend the kernel again',
          callback: run(CommandIDs.suspend, { confirm: false })
        };
      case 'suspend-snapshot':
        return {
          label: 'Try saved variables',
          caption:
            'Suspend with the snapshot engine: the kernel saves its own variables (no CRIU needed)',
          callback: run(CommandIDs.suspend, {
            engine: 'snapshot',
            confirm: false
          })
        };
      case 'suspend-when-idle':
        return {
          label: 'Suspend when this cell finishes',
          caption: 'The kernel is suspended as soon as the running cell ends',
          callback: run(CommandIDs.suspend, { when: 'idle', confirm: false })
        };
      case 'interrupt-and-suspend':
        return {
          label: 'Interrupt and suspend',
          caption: 'Interrupt the running cell, then suspend the kernel',
          callback: run(CommandIDs.suspend, {
            when: 'interrupt',
            confirm: false
          })
        };
      case 'cancel-suspend':
        return {
          label: 'Cancel',
          caption: 'Keep the kernel running',
          callback: run(CommandIDs.cancelSuspend)
        };
      case 'retry-resume':
        return {
          label: 'Retry',
          caption: 'Restore the kernel again',
          callback: run(CommandIDs.resume)
        };
      case 'resume':
        return {
          label: 'Resume',
          caption: 'Restore the kernel from disk',
          callback: run(CommandIDs.resume)
        };
      case 'start-fresh':
        return {
          label: 'Start fresh',
          caption:
            'Restart the kernel empty; its saved state goes to the trash, from where it can still be restored',
          callback: run(CommandIDs.startFresh)
        };
      case 'resume-other-gpu':
        return {
          label: 'Choose GPU…',
          caption: 'Restore the kernel on another GPU',
          callback: run(CommandIDs.resume, { chooseGpu: true })
        };
      case 'details':
        return {
          label: 'Details',
          caption: 'The whole message and what to do',
          displayType: 'link',
          // A failure stays until closed: reading its details is not closing it.
          callback: event => {
            event.preventDefault();
            this._details(kernelId);
          }
        };
      case 'doctor':
        return {
          label: 'Diagnose',
          caption:
            'Open the Suspended kernels panel and what works on this server',
          displayType: 'link',
          callback: event => {
            event.preventDefault();
            void this._model.refreshDoctor();
            void this._commands.execute(CommandIDs.openPanel);
          }
        };
      case 'open-panel':
      default:
        return {
          label: 'Open Suspended kernels',
          displayType: 'link',
          callback: () => void this._commands.execute(CommandIDs.openPanel)
        };
    }
  }

  private _model: GpucrModel;
  private _commands: CommandRegistry;
  private _pathForKernel: (kernelId: string) => string | null;
  private _notices = new NoticeBook();
  private _busy = new Set<string>();
}

export namespace GpucrNotifier {
  export interface IOptions {
    model: GpucrModel;
    commands: CommandRegistry;
    pathForKernel: (kernelId: string) => string | null;
  }
}
