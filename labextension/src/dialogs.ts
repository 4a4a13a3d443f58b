/**
 * JupyterLab's session dialogs, with one difference: restarting a suspended
 * kernel says what happens to its saved state (it goes to the trash) before
 * it happens. Every restart of JupyterLab goes through these dialogs (Kernel
 * menu, notebook toolbar, "Restart and Run All", the `0 0` shortcut).
 */
import {
  Dialog,
  ISessionContext,
  SessionContextDialogs,
  showDialog
} from '@jupyterlab/apputils';

import { GpucrModel } from './model';
import { kernelLabel, trashWarning } from './messages';

export class GpucrSessionDialogs extends SessionContextDialogs {
  constructor(
    options: ISessionContext.IDialogsOptions & { model: GpucrModel }
  ) {
    super(options);
    this._model = options.model;
  }

  async restart(sessionContext: ISessionContext): Promise<boolean> {
    const kernelId = sessionContext.session?.kernel?.id;
    const state = kernelId
      ? await this._model.refreshKernel(kernelId)
      : undefined;
    if (!kernelId || state?.state !== 'suspended') {
      return super.restart(sessionContext);
    }
    // The path JupyterLab has now (the notebook may have been renamed).
    const name = kernelLabel(kernelId, sessionContext.path);
    const result = await showDialog({
      title: 'Restart the suspended kernel?',
      body:
        trashWarning(name, state, this._model.trashHours) +
        ' The restarted kernel starts empty: its variables are gone.',
      buttons: [
        Dialog.cancelButton(),
        Dialog.warnButton({
          label: 'Restart',
          ariaLabel: 'Confirm Kernel Restart'
        })
      ]
    });
    if (sessionContext.isDisposed || !result.button.accept) {
      return false;
    }
    await sessionContext.restartKernel();
    return true;
  }

  private _model: GpucrModel;
}
