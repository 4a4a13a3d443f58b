/**
 * Restore ahead of the run: typing into a code cell of a notebook whose
 * kernel is suspended starts the kernel's restore in the background (once per
 * suspension), so that when the cell is run the kernel is back, or nearly.
 * Opening, switching to or reloading a notebook changes no cell and wakes
 * nothing. The setting `restoreAhead` turns it off (restore on run only).
 */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { GpucrModel } from './model';

type Cell = NonNullable<INotebookTracker['activeCell']>;

export class RestoreAhead {
  /** Whether typing restores ahead (the `restoreAhead` setting). */
  enabled = true;

  constructor(
    private readonly _tracker: INotebookTracker,
    private readonly _model: GpucrModel
  ) {
    _tracker.activeCellChanged.connect((_, cell) => this._watch(cell));
    this._watch(_tracker.activeCell);
  }

  private _watch(cell: Cell | null): void {
    if (this._cell) {
      this._cell.model.contentChanged.disconnect(this._typed, this);
    }
    this._cell = cell;
    if (cell && cell.model.type === 'code') {
      cell.model.contentChanged.connect(this._typed, this);
    }
  }

  private _typed(): void {
    const panel: NotebookPanel | null = this._tracker.currentWidget;
    const kernelId = panel?.sessionContext.session?.kernel?.id;
    if (!this.enabled || !kernelId) {
      return;
    }
    const state = this._model.getKernel(kernelId);
    if (state?.state !== 'suspended') {
      return;
    }
    const suspension = `${kernelId}@${state.suspended_at ?? ''}`;
    if (this._asked.has(suspension)) {
      return;
    }
    this._asked.add(suspension);
    this._model.resumeAhead(kernelId).catch(reason => {
      this._asked.delete(suspension); // the next keystroke asks again
      console.warn('gpucr: restoring ahead failed', reason);
    });
  }

  private _cell: Cell | null = null;
  private readonly _asked = new Set<string>();
}
