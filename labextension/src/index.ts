/**
 * jupyter-gpucr JupyterLab extension: suspend a notebook's kernel to disk,
 * see where it runs and what it holds, and get it back.
 *
 * Wiring only: the logic lives in model.ts / state.ts, the views in
 * statusbar.tsx and panel.tsx, the commands in commands.ts.
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import {
  INotebookTracker,
  NotebookActions,
  NotebookPanel
} from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { addCommands, currentKernelId } from './commands';
import { GpucrModel } from './model';
import { connectNotifications } from './notifications';
import { GpucrPanel } from './panel';
import { GpucrStatus } from './statusbar';
import { CommandIDs, PLUGIN_ID } from './tokens';

export * from './model';
export { CommandIDs, PLUGIN_ID } from './tokens';

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

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'Suspend GPU kernels to disk and restore them: toolbar button, status bar, checkpoints panel.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry, IStatusBar, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null
  ) => {
    const { commands, serviceManager } = app;
    const model = new GpucrModel({
      serverSettings: serviceManager.serverSettings
    });

    let settings: ISettingRegistry.ISettings | null = null;
    let confirmSuspend = true;

    /**
     * The notebook path of a kernel: an open notebook's (kept current across
     * renames), else its session's, else its checkpoint's.
     */
    const pathForKernel = (kernelId: string): string | null => {
      const open = tracker.find(
        p => p.sessionContext.session?.kernel?.id === kernelId
      );
      if (open) {
        return open.context.path;
      }
      for (const session of serviceManager.sessions.running()) {
        if (session.kernel?.id === kernelId) {
          return session.path;
        }
      }
      const checkpoint = model.checkpoints.find(c => c.kernel_id === kernelId);
      return checkpoint?.notebook_path ?? null;
    };

    // Side panel.
    const panel = new GpucrPanel({
      model,
      commands,
      pathForKernel
    });
    app.shell.add(panel, 'right', { rank: 900 });
    const openPanel = () => app.shell.activateById(panel.id);

    addCommands({
      commands,
      model,
      tracker,
      confirmSuspend: () => confirmSuspend,
      disableConfirmSuspend: async () => {
        confirmSuspend = false;
        if (settings) {
          await settings.set('confirmSuspend', false);
        }
      },
      openPanel,
      pathForKernel
    });
    connectNotifications({ model, commands, pathForKernel });

    if (palette) {
      const category = 'GPU Checkpoints';
      for (const command of [
        CommandIDs.suspend,
        CommandIDs.resume,
        CommandIDs.deleteCheckpoint,
        CommandIDs.openPanel,
        CommandIDs.refresh
      ]) {
        palette.addItem({ command, category });
      }
    }

    // Status bar.
    const status = new GpucrStatus({ model, onClick: openPanel });
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
    // suspended kernel makes the server restore it; say so at once.
    const watchPanel = (panel: NotebookPanel) => {
      const ctx = panel.sessionContext;
      ctx.kernelChanged.connect(updateCurrent);
      ctx.sessionChanged.connect(updateCurrent);
      ctx.statusChanged.connect((_, kernelStatus) => {
        const kernelId = ctx.session?.kernel?.id;
        if (!kernelId) {
          return;
        }
        const known = model.getKernel(kernelId);
        if (known?.state === 'suspended' && WAKING.includes(kernelStatus)) {
          model.markRestoring(kernelId);
        } else if (known?.state === 'restoring' && kernelStatus === 'idle') {
          void model.refreshKernel(kernelId);
        }
      });
    };
    tracker.forEach(watchPanel);
    tracker.widgetAdded.connect((_, panel) => watchPanel(panel));
    NotebookActions.executionScheduled.connect((_, { notebook }) => {
      const panel = tracker.find(p => p.content === notebook);
      const kernelId = panel?.sessionContext.session?.kernel?.id;
      if (kernelId && model.getKernel(kernelId)?.state === 'suspended') {
        model.markRestoring(kernelId);
      }
    });

    // Events: state changes and progress pushed by the server.
    serviceManager.events.stream.connect((_, event) => {
      model.applyEvent(event);
    });

    // Settings.
    const applySettings = (s: ISettingRegistry.ISettings) => {
      confirmSuspend = s.get('confirmSuspend').composite !== false;
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
    console.log('JupyterLab extension jupyter-gpucr is activated!');
  }
};

export default plugin;
