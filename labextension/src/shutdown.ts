/**
 * Shutting down several kernels at once: Kernel > Shut Down All Kernels…,
 * and the Shut Down All of the Running sidebar's Kernels and Suspended
 * Kernels sections. One question lists what happens to each kernel (a
 * running one is shut down and its variables are lost, a suspended one's
 * saved state goes to the trash), then one notice says what happened.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { ServerConnection, Session } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { GpucrRequestError } from './api';
import {
  IShutdownLine,
  plainError,
  shutdownLines,
  shutdownQuestion,
  shutdownSummary
} from './messages';
import { GpucrModel } from './model';
import type { IKernelShutdown } from './shutdownguard';

export class KernelShutdowns {
  constructor(options: KernelShutdowns.IOptions) {
    this._options = options;
  }

  /** What a shutdown would do to these kernels, now. */
  lines(kernelIds: Iterable<string>): IShutdownLine[] {
    const { model, label } = this._options;
    return shutdownLines(
      [...kernelIds].map(kernelId => ({
        kernelId,
        label: label(kernelId),
        state: model.getKernel(kernelId)
      })),
      model.trashHours
    );
  }

  /** The question and one line per kernel, as a dialog body. */
  body(lines: ReadonlyArray<IShutdownLine>): Widget {
    const node = document.createElement('div');
    node.className = 'jp-gpucr-ShutdownList';
    const question = document.createElement('p');
    question.textContent = shutdownQuestion(lines);
    const list = document.createElement('ul');
    for (const line of lines) {
      const item = document.createElement('li');
      item.dataset.kernelId = line.kernelId;
      const name = document.createElement('b');
      name.textContent = line.label;
      item.append(name, ` · ${line.fate}`);
      list.append(item);
    }
    node.append(question, list);
    return new Widget({ node });
  }

  /** Ask once, then shut the kernels down and say what happened. */
  async askAndShutDown(kernelIds: Iterable<string>): Promise<void> {
    const lines = this.lines(kernelIds);
    if (!lines.length) {
      return;
    }
    const result = await showDialog({
      title: 'Shut Down All?',
      body: this.body(lines),
      buttons: [
        Dialog.cancelButton(),
        Dialog.warnButton({ label: 'Shut Down All' })
      ]
    });
    if (result.button.accept) {
      await this.shutDown(lines);
    }
  }

  /**
   * Shut the kernels of `lines` down (the user was asked), one after the
   * other, then one notice. A kernel's sessions go first, so that its open
   * notebooks show no kernel rather than a dead one.
   */
  async shutDown(lines: ReadonlyArray<IShutdownLine>): Promise<void> {
    const done: IShutdownLine[] = [];
    const failed: { line: IShutdownLine; error: string }[] = [];
    for (const line of lines) {
      try {
        await this._shutDownOne(line.kernelId);
        done.push(line);
      } catch (error) {
        failed.push({ line, error: this._errorText(error, line.label) });
      }
    }
    void this._options.model.refreshLists();
    const summary = shutdownSummary(
      done,
      failed,
      this._options.model.trashHours
    );
    const actions: Notification.IAction[] = [];
    if (summary.trashed) {
      actions.push({
        label: 'Open Suspended kernels',
        displayType: 'link',
        callback: () => this._options.openPanel()
      });
    }
    if (summary.details) {
      const details = summary.details;
      actions.push({
        label: 'Details',
        displayType: 'link',
        callback: event => {
          event.preventDefault(); // the notice stays until closed
          void showDialog({
            title: 'Kernels not shut down',
            body: details,
            buttons: [Dialog.okButton({ label: 'Close' })]
          });
        }
      });
    }
    Notification.emit(summary.message, summary.type, {
      autoClose: summary.details ? false : 8000,
      actions
    });
  }

  private async _shutDownOne(kernelId: string): Promise<void> {
    const { sessions, unguarded } = this._options;
    const ids = [...sessions.running()]
      .filter(s => s.kernel?.id === kernelId)
      .map(s => s.id);
    try {
      if (!ids.length) {
        await unguarded.shutdown(kernelId);
        return;
      }
      await sessions.shutdown(ids[0]);
    } catch (error) {
      if (!isGone(error)) {
        throw error;
      }
    }
    for (const id of ids.slice(1)) {
      // The kernel is gone with the first session; the others follow it.
      await sessions.shutdown(id).catch(() => undefined);
    }
  }

  private _errorText(error: unknown, name: string): string {
    if (error instanceof GpucrRequestError) {
      return plainError(error.message, error.reason, name);
    }
    return String((error as Error)?.message ?? error);
  }

  private _options: KernelShutdowns.IOptions;
}

/** A shutdown answered 404: the kernel is gone already, as asked. */
function isGone(error: unknown): boolean {
  return (
    error instanceof ServerConnection.ResponseError &&
    error.response.status === 404
  );
}

export namespace KernelShutdowns {
  export interface IOptions {
    model: GpucrModel;
    sessions: Session.IManager;
    /** The kernel manager's shutdown, without the guard's question. */
    unguarded: IKernelShutdown;
    /** The name the user knows a kernel by. */
    label: (kernelId: string) => string;
    openPanel: () => void;
  }
}
