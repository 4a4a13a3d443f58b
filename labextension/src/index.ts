/**
 * jupyter-gpucr JupyterLab extension: suspend a notebook's kernel to disk,
 * see where it runs and what it holds, and get it back.
 *
 * Wiring only: the REST client lives in api.ts, the model in model.ts (its
 * kernel states and their arbitration in store.ts, its polling in
 * poller.ts, the panel's lists in lists.ts), the state logic in state.ts and
 * its words in messages.ts, the views in statusbar.tsx, panel.tsx,
 * kernelindicator.ts and running.ts, the commands in commands.ts (Fork
 * Kernel in fork.ts, save points in savepoints.tsx, "Save Point, then Run"
 * in savethenruncommand.ts), the restart dialog in dialogs.ts, the UI
 * plugin's features in features.ts.
 *
 * Five plugins: the model (shared); three that replace JupyterLab's own
 * (disabled in package.json), for what JupyterLab 4.6 has no extension point
 * for: the session dialogs (`@jupyterlab/apputils-extension:sessionDialogs`:
 * a restart of a suspended kernel says where its saved state goes), the
 * status bar's kernel status (`@jupyterlab/apputils-extension:kernel-status`,
 * kernelstatusplugin.ts: "Suspended to disk" instead of "Idle") and the
 * notebook's cell executor (`@jupyterlab/notebook-extension:cell-executor`:
 * a cell run while the kernel is still starting waits for it instead of
 * being dropped); and the UI.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  ICommandPalette,
  ISessionContextDialogs,
  IToolbarWidgetRegistry
} from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import {
  INotebookCellExecutor,
  INotebookTracker,
  INotebookWidgetFactory
} from '@jupyterlab/notebook';
import { IRunningSessionManagers } from '@jupyterlab/running';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';

import { cellExecutor } from './cellexecutor';
import { addCommands } from './commands';
import { CompletionAfterRestore } from './completionafterrestore';
import { GpucrSessionDialogs } from './dialogs';
import {
  addPaletteItems,
  addSidePanel,
  addStatusBarItem,
  followCurrentNotebook,
  followKernelMessages,
  guardKernelMenu,
  guardShutdowns,
  kernelPathFinder,
  wrapKernelIndicator
} from './features';
import { addForkCommand } from './fork';
import { kernelStatusPlugin } from './kernelstatusplugin';
import { GpucrModel } from './model';
import { GpucrNotifier } from './notifications';
import { RestoreAhead } from './restoreahead';
import { addRunningSection } from './running';
import { addSavePointCommands } from './savepoints';
import { addSaveThenRunCommand } from './savethenruncommand';
import { trashHours } from './serverconfig';
import { GpucrSettings } from './settings';
import { IGpucrModel, PLUGIN_ID } from './tokens';

export * from './api';
export * from './model';
export * from './types';
export type { IKernelTransition } from './store';
export { CommandIDs, IGpucrModel, PLUGIN_ID } from './tokens';

const modelPlugin: JupyterFrontEndPlugin<GpucrModel> = {
  id: 'jupyter-gpucr:model',
  description: 'The gpucr kernel states, checkpoints and trash.',
  autoStart: true,
  provides: IGpucrModel,
  activate: (app: JupyterFrontEnd) => {
    const model = new GpucrModel({
      serverSettings: app.serviceManager.serverSettings,
      trashHours: trashHours()
    });
    // Events: each kernel's whole state, pushed by the server at each change.
    app.serviceManager.events.stream.connect((_, event) => {
      model.applyEvent(event);
    });
    return model;
  }
};

const dialogsPlugin: JupyterFrontEndPlugin<ISessionContextDialogs> = {
  id: 'jupyter-gpucr:session-dialogs',
  description:
    "JupyterLab's session dialogs; restarting a suspended kernel says where its saved state goes.",
  autoStart: true,
  requires: [IGpucrModel],
  optional: [ITranslator, ISettingRegistry],
  provides: ISessionContextDialogs,
  activate: (
    app: JupyterFrontEnd,
    model: GpucrModel,
    translator: ITranslator | null,
    settingRegistry: ISettingRegistry | null
  ) =>
    new GpucrSessionDialogs({
      model,
      translator: translator ?? undefined,
      settingRegistry
    })
};

const cellExecutorPlugin: JupyterFrontEndPlugin<INotebookCellExecutor> = {
  id: 'jupyter-gpucr:cell-executor',
  description:
    "JupyterLab's notebook cell executor; a cell run while the kernel starts waits for it.",
  autoStart: true,
  provides: INotebookCellExecutor,
  activate: () => cellExecutor
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'Suspend kernels to disk and restore them: toolbar button, kernel status, status bar, Running sidebar, side panel.',
  autoStart: true,
  requires: [IGpucrModel, INotebookTracker, INotebookWidgetFactory],
  optional: [
    ISettingRegistry,
    IStatusBar,
    ICommandPalette,
    IMainMenu,
    IRunningSessionManagers,
    IToolbarWidgetRegistry,
    ITranslator
  ],
  activate: (
    app: JupyterFrontEnd,
    model: GpucrModel,
    tracker: INotebookTracker,
    _factory: unknown,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    mainMenu: IMainMenu | null,
    runningManagers: IRunningSessionManagers | null,
    toolbarRegistry: IToolbarWidgetRegistry | null,
    translator: ITranslator | null
  ) => {
    const { commands, serviceManager } = app;
    const pathForKernel = kernelPathFinder(app, model, tracker);
    const notifier = new GpucrNotifier({ model, commands, pathForKernel });
    const label = (kernelId: string) => notifier.label(kernelId);
    const openPanel = addSidePanel(app, model, pathForKernel);
    const { unguarded, shutdowns } = guardShutdowns(
      app,
      model,
      notifier,
      openPanel
    );
    const status = addStatusBarItem(app, statusBar, model, openPanel);
    const restoreAhead = new RestoreAhead(tracker, model);
    const settings = new GpucrSettings(settingRegistry, values => {
      restoreAhead.enabled = values.restoreAhead;
      model.pollInterval = values.pollInterval;
      status.enabled = values.showStatusBar;
    });

    addCommands({
      commands,
      model,
      tracker,
      notifier,
      kernels: serviceManager.kernels,
      unguarded,
      shutdowns,
      confirmSuspend: () => settings.confirmSuspend,
      disableConfirmSuspend: () => settings.disableConfirmSuspend(),
      openPanel
    });
    addForkCommand({
      commands,
      model,
      tracker,
      contents: serviceManager.contents,
      label
    });
    addSavePointCommands({ commands, model, tracker, label });
    addSaveThenRunCommand({ commands, model, tracker, label });
    if (palette) {
      addPaletteItems(palette);
    }
    if (mainMenu) {
      guardKernelMenu(app, mainMenu, model, tracker);
    }
    if (runningManagers) {
      addRunningSection({
        managers: runningManagers,
        model,
        commands,
        pathForKernel,
        shutdowns,
        kernelIds: () => [...serviceManager.kernels.running()].map(k => k.id),
        kernelsSection: (translator ?? nullTranslator)
          .load('jupyterlab')
          .__('Kernels')
      });
    }
    if (toolbarRegistry) {
      wrapKernelIndicator(toolbarRegistry, model);
    }
    followCurrentNotebook(app, tracker, model, status);
    followKernelMessages(tracker, model, notifier);
    new CompletionAfterRestore(tracker, model, commands);
  }
};

export default [
  modelPlugin,
  dialogsPlugin,
  kernelStatusPlugin,
  cellExecutorPlugin,
  plugin
];
