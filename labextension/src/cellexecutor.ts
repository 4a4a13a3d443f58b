/**
 * The notebook's cell executor: JupyterLab's own `runCell`, which a code cell
 * reaches only once the notebook's kernel exists. A cell run while a new
 * notebook's kernel is still on its way (kernelwait.ts says why JupyterLab
 * would drop it) shows `[*]` and runs as soon as the session has its kernel.
 *
 * Replaces `@jupyterlab/notebook-extension:cell-executor` (disabled in
 * package.json): JupyterLab 4.6 has no other hook before a cell's execution.
 */
import type { ICodeCellModel } from '@jupyterlab/cells';
import { INotebookCellExecutor, runCell } from '@jupyterlab/notebook';

import { kernelOnItsWay, untilKernel } from './kernelwait';

export const cellExecutor: INotebookCellExecutor = Object.freeze({
  async runCell(options: INotebookCellExecutor.IRunCellOptions) {
    const { cell, sessionContext } = options;
    if (
      cell.model.type === 'code' &&
      sessionContext &&
      kernelOnItsWay(sessionContext)
    ) {
      const model = cell.model as ICodeCellModel;
      model.executionState = 'running';
      await untilKernel(sessionContext);
      if (cell.isDisposed) {
        return false;
      }
      model.executionState = 'idle';
    }
    return runCell(options);
  }
});
