/**
 * jupyter-gpucr JupyterLab extension: suspend a notebook's kernel to disk,
 * see where it runs and what it holds, and get it back.
 *
 * Wiring only: the REST client lives in api.ts, the model in model.ts (its
 * kernel states and their arbitration in store.ts), the state logic in
 * state.ts and its words in messages.ts, the views in statusbar.tsx,
 * panel.tsx, kernelindicator.ts and running.ts, the commands in commands.ts
 * (Fork Kernel in fork.ts), the restart dialog in dialogs.ts.
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
  INotebookWidgetFactory,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { IRunningSessionManagers } from '@jupyterlab/running';
import { Kernel } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator, nullTranslator } from '@jupyterlab/translation';
import { Menu, Widget } from '@lumino/widgets';

import { cellExecutor } from './cellexecutor';
import { CompletionAfterRestore } from './completionafterrestore';
import { addCommands, currentKernelId, panelForKernel } from './commands';
import { GpucrSessionDialogs } from './dialogs';
import { addForkCommand } from './fork';
import { addSavePointCommands, SavePointCommandIDs } from './savepoints';
import { GpucrKernelIndicator } from './kernelindicator';
import { kernelStatusPlugin } from './kernelstatusplugin';
import { GpucrModel } from './model';
import { GpucrNotifier } from './notifications';
import { GpucrPanel } from './panel';
import { RestoreAhead } from './restoreahead';
import { addRunningSection } from './running';
import { trashHours } from './serverconfig';
import { KernelShutdowns } from './shutdown';
import { guardKernelShutdown } from './shutdownguard';
import { isDebuggerRefusal } from './state';
import { GpucrStatus } from './statusbar';
import { CommandIDs, IGpucrModel, PLUGIN_ID } from './tokens';

export * from './api';
export * from './model';
export * from './types';
export type { IKernelTransition } from './store';
export { CommandIDs, IGpucrModel, PLUGIN_ID } from './tokens';

/**
 * Kernel statuses that mean the server is bringing a suspended kernel back.
 * (Not `busy`: a late status message of the suspend itself can say busy.
 * Running a cell is caught by `executionScheduled`, and the server's events
 * say `restoring` anyway.)
 */
const WAKING: ReadonlyArray<Kernel.Status> = [
  'restarting',
  'autorestarting',
  'starting'
];

/**
 * Take JupyterLab's Kernel > Shut Down All Kernels… out of the menu: gpucr's
 * (same label) says what happens to each kernel. (A plugin's menu schema can
 * only do this with a duplicate entry, which JupyterLab warns about on every
 * page load.)
 */
function removeStockShutdownAll(mainMenu: IMainMenu): void {
  const menu = mainMenu.kernelMenu;
  if (!(menu instanceof Menu)) {
    return;
  }
  for (const item of [...menu.items]) {
    if (item.command === 'kernelmenu:shutdownAll') {
      menu.removeItem(item);
    }
  }
}

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
    // Events: state changes and progress pushed by the server.
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

    let settings: ISettingRegistry.ISettings | null = null;
    let confirmSuspend = true;

    /**
     * The notebook path of a kernel now: an open notebook's, else the
     * server's (its session's current path), else a running session's.
     * Never a path kept from an earlier state: notebooks get renamed.
     */
    const pathForKernel = (kernelId: string): string | null => {
      const open = panelForKernel(tracker, kernelId);
      if (open) {
        return open.context.path;
      }
      const fromServer = model.getKernel(kernelId)?.notebook_path;
      if (fromServer) {
        return fromServer;
      }
      for (const session of serviceManager.sessions.running()) {
        if (session.kernel?.id === kernelId) {
          return session.path;
        }
      }
      return null;
    };

    const notifier = new GpucrNotifier({ model, commands, pathForKernel });

    // Side panel.
    const panel = new GpucrPanel({
      model,
      commands,
      pathForKernel,
      serverSettings: serviceManager.serverSettings
    });
    app.shell.add(panel, 'right', { rank: 900 });
    const openPanel = () => app.shell.activateById(panel.id);

    // JupyterLab's own Kernels section shuts down through the kernel manager.
    const unguarded = guardKernelShutdown({
      kernels: serviceManager.kernels,
      model,
      label: kernelId => notifier.label(kernelId),
      trashed: (kernelId, label) => {
        notifier.trashed(kernelId, label);
        void model.refreshLists();
      },
      shutdownAll: kernelIds => shutdowns.askAndShutDown(kernelIds)
    });
    const shutdowns = new KernelShutdowns({
      model,
      sessions: serviceManager.sessions,
      unguarded,
      label: kernelId => notifier.label(kernelId),
      openPanel
    });
    const allKernelIds = () =>
      [...serviceManager.kernels.running()].map(k => k.id);

    addCommands({
      commands,
      model,
      tracker,
      notifier,
      kernels: serviceManager.kernels,
      unguarded,
      shutdowns,
      confirmSuspend: () => confirmSuspend,
      disableConfirmSuspend: async () => {
        confirmSuspend = false;
        if (settings) {
          await settings.set('confirmSuspend', false);
        }
      },
      openPanel
    });
    addForkCommand({
      commands,
      model,
      tracker,
      contents: serviceManager.contents,
      serverSettings: serviceManager.serverSettings,
      label: kernelId => notifier.label(kernelId)
    });
    addSavePointCommands({
      commands,
      model,
      tracker,
      serverSettings: serviceManager.serverSettings,
      label: kernelId => notifier.label(kernelId)
    });

    if (palette) {
      const category = 'Suspended Kernels';
      for (const command of [
        CommandIDs.suspend,
        CommandIDs.fork,
        SavePointCommandIDs.save,
        SavePointCommandIDs.goBack,
        CommandIDs.cancelSuspend,
        CommandIDs.resume,
        CommandIDs.openPanel,
        CommandIDs.refresh
      ]) {
        palette.addItem({ command, category });
      }
    }

    // Kernel > Shut Down Kernel of a suspended kernel asks first.
    if (mainMenu) {
      removeStockShutdownAll(mainMenu);
      void app.restored.then(() => removeStockShutdownAll(mainMenu));
      mainMenu.kernelMenu.kernelUsers.shutdownKernel.add({
        id: CommandIDs.shutdownKernel,
        isEnabled: widget =>
          widget instanceof NotebookPanel &&
          tracker.has(widget) &&
          model.getKernel(widget.sessionContext.session?.kernel?.id)?.state ===
            'suspended',
        rank: 100
      });
    }

    // The Running sidebar.
    if (runningManagers) {
      addRunningSection({
        managers: runningManagers,
        model,
        commands,
        pathForKernel,
        shutdowns,
        kernelIds: allKernelIds,
        kernelsSection: (translator ?? nullTranslator)
          .load('jupyterlab')
          .__('Kernels')
      });
    }

    // The notebook toolbar's kernel status indicator.
    if (toolbarRegistry) {
      const stock: ((p: NotebookPanel) => Widget) | undefined =
        toolbarRegistry.addFactory<NotebookPanel>(
          'Notebook',
          'executionProgress',
          (nbPanel): Widget =>
            new GpucrKernelIndicator({
              model,
              panel: nbPanel,
              stock: stock?.(nbPanel) ?? null
            })
        );
    }

    // Status bar.
    const status = new GpucrStatus({
      model,
      onClick: openPanel,
      onCancel: kernelId =>
        void commands.execute(CommandIDs.cancelSuspend, { kernelId })
    });
    if (statusBar) {
      statusBar.registerStatusItem(`${PLUGIN_ID}:status`, {
        item: status,
        align: 'left',
        rank: 4,
        isActive: () => status.isActive,
        activeStateChanged: status.activeStateChanged
      });
    }

    // Follow the current notebook's kernel.
    const updateCurrent = () => {
      const kernelId = currentKernelId(tracker);
      status.kernelId = kernelId;
      model.watchKernels(kernelId ? [kernelId] : []);
    };
    tracker.currentChanged.connect(updateCurrent);

    // The transparent path: running a cell in (or reconnecting to) a
    // suspended kernel makes the server restore it; say so at once. A
    // refused suspend no longer applies once the kernel is idle.
    const watchPanel = (nbPanel: NotebookPanel) => {
      const ctx = nbPanel.sessionContext;
      ctx.kernelChanged.connect(updateCurrent);
      ctx.sessionChanged.connect(updateCurrent);
      ctx.statusChanged.connect((_, kernelStatus) => {
        const kernelId = ctx.session?.kernel?.id;
        if (!kernelId) {
          return;
        }
        if (kernelStatus === 'idle') {
          notifier.kernelIdle(kernelId);
        }
        const known = model.getKernel(kernelId);
        if (known?.state === 'suspended' && WAKING.includes(kernelStatus)) {
          model.markRestoring(kernelId);
        } else if (known?.state === 'restoring' && kernelStatus === 'idle') {
          void model.refreshKernel(kernelId);
        }
      });
    };
    // The debugger turned on for a suspended kernel: its start is refused
    // (gpucr answers from disk), which JupyterLab only logs.
    const onKernelMessage = (
      kernel: Kernel.IKernelConnection,
      args: Kernel.IAnyMessageArgs
    ) => {
      if (
        args.direction === 'recv' &&
        isDebuggerRefusal(args.msg) &&
        model.getKernel(kernel.id)?.state === 'suspended'
      ) {
        notifier.showDebuggerRefused(kernel.id);
      }
    };
    const watchMessages = (nbPanel: NotebookPanel) => {
      const follow = () =>
        nbPanel.sessionContext.session?.kernel?.anyMessage.connect(
          onKernelMessage
        );
      nbPanel.sessionContext.kernelChanged.connect(follow);
      follow();
    };
    tracker.forEach(watchMessages);
    tracker.widgetAdded.connect((_, nbPanel) => watchMessages(nbPanel));
    tracker.forEach(watchPanel);
    tracker.widgetAdded.connect((_, nbPanel) => watchPanel(nbPanel));
    NotebookActions.executionScheduled.connect((_, { notebook }) => {
      const nbPanel = tracker.find(p => p.content === notebook);
      const kernelId = nbPanel?.sessionContext.session?.kernel?.id;
      if (kernelId && model.getKernel(kernelId)?.state === 'suspended') {
        model.markRestoring(kernelId);
      }
    });

    const restoreAhead = new RestoreAhead(tracker, model);
    new CompletionAfterRestore(tracker, model, app.commands);

    // Settings.
    const applySettings = (s: ISettingRegistry.ISettings) => {
      confirmSuspend = s.get('confirmSuspend').composite !== false;
      restoreAhead.enabled = s.get('restoreAhead').composite !== false;
      const seconds = Number(s.get('pollInterval').composite ?? 3);
      model.pollInterval =
        (isFinite(seconds) && seconds > 0 ? seconds : 3) * 1000;
      status.enabled = s.get('showStatusBar').composite !== false;
    };
    if (settingRegistry) {
      settingRegistry
        .load(PLUGIN_ID)
        .then(s => {
          settings = s;
          applySettings(s);
          s.changed.connect(applySettings);
        })
        .catch(reason => {
          console.error('gpucr: failed to load settings.', reason);
        });
    }

    void app.restored.then(updateCurrent);
  }
};

export default [
  modelPlugin,
  dialogsPlugin,
  kernelStatusPlugin,
  cellExecutorPlugin,
  plugin
];
