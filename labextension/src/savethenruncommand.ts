/**
 * "Save Point, then Run" (a code cell's context menu and the cell toolbar):
 * a save point of the notebook's kernel named after the active cell
 * (`before cell 3: model = train(data)`), then that cell runs, only once the
 * save point exists. When the server cannot take it (a cell runs, a backend
 * without save points, no whole-process engine), the cell does not run and a
 * notification says why, with "Run anyway". Unavailable, with a tooltip
 * saying why, where no save point can be taken. The pure parts are in
 * savethenrun.ts.
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';

import { refreshOnKernelChanges } from './availability';
import { fitToast, TOAST_MAX } from './messages';
import { GpucrModel } from './model';
import {
  errorText,
  SavePointCommandIDs,
  takeSavePointNoticed
} from './savepoints';
import {
  savePointNameForCell,
  saveThenRun,
  saveThenRunUnavailable
} from './savethenrun';

export const saveThenRunIcon = new LabIcon({
  name: 'jupyter-gpucr:save-then-run',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<g class="jp-icon3" fill="none" stroke="#616161" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">' +
    '<path d="M3 3h10v18l-5-4-5 4z"/></g>' +
    '<path class="jp-icon3" fill="#616161" d="M15 7l8 5-8 5z"/></svg>'
});

export interface ISaveThenRunContext {
  commands: CommandRegistry;
  model: GpucrModel;
  tracker: INotebookTracker;
  /** How the user calls a kernel (its notebook's name). */
  label: (kernelId: string) => string;
}

const CAPTION =
  'Keep the kernel’s whole state as a save point named after this cell, then run the cell; ' +
  'if the save point cannot be taken, the cell does not run';

export function addSaveThenRunCommand(ctx: ISaveThenRunContext): void {
  const { commands, model, tracker } = ctx;

  const unavailable = (): string | null => {
    const panel = tracker.currentWidget;
    const kernelId = panel?.sessionContext.session?.kernel?.id ?? null;
    return saveThenRunUnavailable({
      codeCell: panel?.content.activeCell?.model.type === 'code',
      kernelId,
      gpucr: model.available,
      busy: !!kernelId && model.isBusy(kernelId),
      state: model.getKernel(kernelId)
    });
  };

  commands.addCommand(SavePointCommandIDs.saveThenRun, {
    label: args => (args.toolbar ? '' : 'Save Point, then Run'),
    caption: () => {
      const why = unavailable();
      return why ? `No save point here: ${why}` : CAPTION;
    },
    icon: args => (args.toolbar ? saveThenRunIcon : undefined),
    isEnabled: () => unavailable() === null,
    execute: async () => {
      const panel = tracker.currentWidget;
      const cell = panel?.content.activeCell;
      const kernelId = panel?.sessionContext.session?.kernel?.id;
      if (!panel || !cell || !kernelId || unavailable()) {
        return;
      }
      const position = panel.content.widgets.indexOf(cell) + 1;
      const savePointName = savePointNameForCell(
        position,
        cell.model.sharedModel.getSource()
      );
      const name = ctx.label(kernelId);
      // This cell, even if another is active by the time the save point is taken.
      const run = async () => {
        if (!panel.isDisposed && !cell.isDisposed) {
          await NotebookActions.runCells(
            panel.content,
            [cell],
            panel.sessionContext
          );
        }
      };
      await saveThenRun({
        save: () => takeSavePointNoticed(model, kernelId, savePointName, name),
        run,
        failed: error => notRun(position, name, error, run)
      });
    }
  });

  const refresh = () =>
    commands.notifyCommandChanged(SavePointCommandIDs.saveThenRun);
  refreshOnKernelChanges(model, tracker, refresh);
  tracker.activeCellChanged.connect(refresh);
}

/**
 * The cell did not run: the server's reason and hint, "Run anyway", and the
 * whole text behind "Details" when the notification cuts it.
 */
function notRun(
  position: number,
  name: string,
  error: unknown,
  run: () => Promise<void>
): void {
  const text = `Cell ${position} did not run: no save point of ${name}. ${errorText(error, name)}`;
  const actions: Notification.IAction[] = [
    {
      label: 'Run anyway',
      caption: 'Run the cell without a save point',
      callback: () => void run()
    }
  ];
  if (text.length > TOAST_MAX) {
    actions.push({
      label: 'Details',
      caption: 'The whole message and what to do',
      displayType: 'link',
      callback: event => {
        event.preventDefault(); // the notification stays, with "Run anyway"
        void showDialog({
          title: `Cell ${position} did not run`,
          body: text,
          buttons: [Dialog.okButton({ label: 'Close' })]
        });
      }
    });
  }
  Notification.error(fitToast(text), { autoClose: false, actions });
}
