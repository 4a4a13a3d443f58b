/**
 * Save points (docs/rest-api.md, "Save points"): "Save Point" keeps the
 * current notebook's kernel's whole state now (the kernel is left as it was),
 * "Go Back to Save Point" returns the kernel to one under the same kernel id,
 * after asking (the state it leaves goes to the trash). The side panel lists
 * each running or suspended kernel's save points with a "Go back" button
 * (SavePointsSection).
 */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { ISignal, Signal } from '@lumino/signaling';
import * as React from 'react';

import { GpucrClient, GpucrRequestError } from './api';
import { refreshOnKernelChanges } from './availability';
import { formatBytes, formatDate } from './format';
import { fitToast, plainError } from './messages';
import { GpucrModel } from './model';
import { canResume, canSuspend } from './state';
import type { ISavePoint } from './types';

export const SavePointCommandIDs = {
  save: 'gpucr:save-point',
  saveThenRun: 'gpucr:save-then-run',
  goBack: 'gpucr:go-back'
};

export const savePointIcon = new LabIcon({
  name: 'jupyter-gpucr:save-point',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16">' +
    '<g class="jp-icon3" fill="none" stroke="#616161" stroke-width="2" stroke-linecap="round">' +
    '<path d="M6 3h12v18l-6-4-6 4z"/></g></svg>'
});

/** How a save point is shown: its name, else the cell that ran last, else its time. */
export function savePointTitle(sp: ISavePoint): string {
  if (sp.name) {
    return sp.name;
  }
  const code = sp.cell?.code?.trim().split('\n')[0];
  if (code) {
    return `after [${sp.cell?.execution_count}] ${code.slice(0, 40)}`;
  }
  return formatDate(sp.created);
}

export interface ISavePointContext {
  commands: CommandRegistry;
  model: GpucrModel;
  tracker: INotebookTracker;
  label: (kernelId: string) => string;
}

const changed = new Signal<object, string>({});
/** A kernel's save points changed (taken, gone back to). */
export const savePointsChanged: ISignal<object, string> = changed;

/** A failed request in plain words: the server's message and hint, kernel ids replaced by `name`. */
export function errorText(error: unknown, name: string): string {
  return error instanceof GpucrRequestError
    ? plainError(error.message, error.reason, name)
    : String((error as Error)?.message ?? error);
}

/**
 * Take a save point of `kernelId` (`name` is how the user calls the kernel),
 * with a notification while it is taken and once it is; when it cannot be
 * taken, that notification closes and the error is thrown, for the caller
 * to say.
 */
export async function takeSavePointNoticed(
  model: GpucrModel,
  kernelId: string,
  savePointName: string | null,
  name: string
): Promise<ISavePoint> {
  const pending = Notification.emit(
    `Taking a save point of ${name}…`,
    'in-progress',
    { autoClose: false }
  );
  let sp: ISavePoint;
  try {
    sp = await model.client.takeSavePoint(kernelId, savePointName);
  } catch (error) {
    Notification.dismiss(pending);
    throw error;
  }
  const paused =
    typeof sp.paused_s === 'number'
      ? `, paused ${sp.paused_s.toFixed(1)} s`
      : '';
  Notification.update({
    id: pending,
    message: `Save point of ${name} (${formatBytes(sp.size)}${paused}). Go back to it from the Suspended Kernels panel.`,
    type: 'success',
    autoClose: 5000
  });
  changed.emit(kernelId);
  return sp;
}

export function addSavePointCommands(ctx: ISavePointContext): void {
  const { commands, model, tracker } = ctx;
  const currentKernel = (): string | undefined =>
    tracker.currentWidget?.sessionContext.session?.kernel?.id;

  commands.addCommand(SavePointCommandIDs.save, {
    label: args => (args.toolbar ? '' : 'Save Point'),
    caption:
      'Keep the kernel’s whole state now (variables, GPU memory) to go back to later; the kernel runs on as it was',
    icon: args => (args.toolbar || args.isPalette ? savePointIcon : undefined),
    isEnabled: () => {
      const kernelId = currentKernel();
      if (!kernelId || model.isBusy(kernelId)) {
        return false;
      }
      const state = model.getKernel(kernelId);
      return state ? canSuspend(state) || canResume(state) : true;
    },
    execute: async args => {
      const kernelId = (args.kernelId as string) || currentKernel();
      if (!kernelId) {
        Notification.info(
          'No save point: this notebook has no kernel yet. Start one (Kernel > Change Kernel…) first.',
          { autoClose: 5000 }
        );
        return;
      }
      const name = ctx.label(kernelId);
      try {
        await takeSavePointNoticed(
          model,
          kernelId,
          (args.name as string) || null,
          name
        );
      } catch (error) {
        Notification.error(
          fitToast(
            `Could not take a save point of ${name}: ${errorText(error, name)}`
          ),
          { autoClose: false }
        );
      }
    }
  });

  commands.addCommand(SavePointCommandIDs.goBack, {
    label: 'Go Back to Save Point…',
    caption:
      'Return the kernel to a save point under the same kernel; the state it has now goes to the trash',
    execute: async args => {
      const kernelId = (args.kernelId as string) || currentKernel();
      if (!kernelId) {
        return;
      }
      const name = ctx.label(kernelId);
      let savePointId = args.savePointId as string | undefined;
      let title = args.title as string | undefined;
      if (!savePointId) {
        const listed = await model.client.listSavePoints(kernelId);
        const newest = listed[listed.length - 1];
        if (!newest) {
          Notification.info(`${name} has no save point yet.`, {
            autoClose: 5000
          });
          return;
        }
        savePointId = newest.id;
        title = savePointTitle(newest);
      }
      const answer = await showDialog({
        title: 'Go back to the save point?',
        body:
          `${name} returns to “${title ?? savePointId}”: its variables and memory as they were then. ` +
          'What it holds now goes to the trash (restorable from there). Notebook outputs are not changed.',
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: 'Go back' })
        ]
      });
      if (!answer.button.accept) {
        return;
      }
      const pending = Notification.emit(
        `${name} goes back to “${title}”…`,
        'in-progress',
        {
          autoClose: false
        }
      );
      try {
        await model.client.goBackToSavePoint(kernelId, savePointId);
        Notification.update({
          id: pending,
          message: `${name} is back at “${title}”. The state it left is in the trash.`,
          type: 'success',
          autoClose: 5000
        });
        changed.emit(kernelId);
        void model.refreshLists();
      } catch (error) {
        Notification.update({
          id: pending,
          message: fitToast(
            `${name} could not go back: ${errorText(error, name)}`
          ),
          type: 'error',
          autoClose: false
        });
      }
    }
  });

  refreshOnKernelChanges(model, tracker, () =>
    commands.notifyCommandChanged(SavePointCommandIDs.save)
  );
}

/** The side panel's list: each kernel's save points, with "Go back" (asks first). */
export function SavePointsSection(props: {
  kernelIds: string[];
  commands: CommandRegistry;
  client: GpucrClient;
  label: (kernelId: string) => string;
}): JSX.Element {
  const { kernelIds, commands, client, label } = props;
  const [found, setFound] = React.useState<Record<string, ISavePoint[]>>({});
  const [tick, setTick] = React.useState(0);
  const key = kernelIds.join(',');
  React.useEffect(() => {
    const bump = () => setTick(t => t + 1);
    changed.connect(bump);
    return () => {
      changed.disconnect(bump);
    };
  }, []);
  React.useEffect(() => {
    let live = true;
    void Promise.all(
      kernelIds.map(k =>
        client.listSavePoints(k).then(
          sps => [k, sps] as const,
          () => [k, [] as ISavePoint[]] as const
        )
      )
    ).then(pairs => {
      if (live) {
        setFound(Object.fromEntries(pairs));
      }
    });
    return () => {
      live = false;
    };
  }, [key, tick]);
  const rows = kernelIds.filter(k => (found[k] ?? []).length > 0);
  return (
    <section className="jp-gpucr-Panel-section jp-gpucr-Panel-savepoints">
      <h3>Save points</h3>
      {rows.length === 0 ? (
        <p className="jp-gpucr-Panel-empty">
          None. “Save Point” in a notebook’s toolbar keeps its kernel’s state to
          go back to.
        </p>
      ) : (
        <ul>
          {rows.flatMap(k =>
            [...found[k]].reverse().map(sp => (
              <li key={sp.id} className="jp-gpucr-Item jp-gpucr-SavePoint">
                <div className="jp-gpucr-Item-main">
                  <div
                    className="jp-gpucr-Item-title"
                    title={sp.cell?.code ?? ''}
                  >
                    {savePointTitle(sp)}
                  </div>
                  <div className="jp-gpucr-Item-detail">
                    {label(k)} · {formatDate(sp.created)} ·{' '}
                    {formatBytes(sp.size)}
                  </div>
                </div>
                <button
                  className="jp-mod-styled jp-gpucr-GoBack"
                  title="Return the kernel to this save point (asks first)"
                  onClick={() =>
                    void commands.execute(SavePointCommandIDs.goBack, {
                      kernelId: k,
                      savePointId: sp.id,
                      title: savePointTitle(sp)
                    })
                  }
                >
                  Go back
                </button>
              </li>
            ))
          )}
        </ul>
      )}
    </section>
  );
}
