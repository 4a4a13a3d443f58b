/**
 * The UI plugin's features, one function each: what it adds to JupyterLab
 * (side panel, shut-down guard, palette, Kernel menu, toolbar indicator,
 * status bar) and what it follows (the current notebook, its kernel's
 * messages). index.ts calls them in order and hands each what an earlier one
 * made.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, IToolbarWidgetRegistry } from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Menu, Widget } from '@lumino/widgets';

import { currentKernelId, panelForKernel } from './commands';
import { GpucrKernelIndicator } from './kernelindicator';
import { GpucrModel } from './model';
import { GpucrNotifier } from './notifications';
import { GpucrPanel } from './panel';
import { SavePointCommandIDs } from './savepoints';
import { KernelShutdowns } from './shutdown';
import { guardKernelShutdown, IKernelShutdown } from './shutdownguard';
import { isDebuggerRefusal } from './state';
import { GpucrStatus } from './statusbar';
import { CommandIDs, PLUGIN_ID } from './tokens';

/**
 * The notebook path of a kernel now: an open notebook's, else the server's
 * (its session's current path), else a running session's. Never a path kept
 * from an earlier state: notebooks get renamed.
 */
export function kernelPathFinder(
  app: JupyterFrontEnd,
  model: GpucrModel,
  tracker: INotebookTracker
): (kernelId: string) => string | null {
  return kernelId => {
    const open = panelForKernel(tracker, kernelId);
    if (open) {
      return open.context.path;
    }
    const fromServer = model.getKernel(kernelId)?.notebook_path;
    if (fromServer) {
      return fromServer;
    }
    for (const session of app.serviceManager.sessions.running()) {
      if (session.kernel?.id === kernelId) {
        return session.path;
      }
    }
    return null;
  };
}

/** The side panel in the right sidebar; returns what opens it. */
export function addSidePanel(
  app: JupyterFrontEnd,
  model: GpucrModel,
  pathForKernel: (kernelId: string) => string | null
): () => void {
  const panel = new GpucrPanel({
    model,
    commands: app.commands,
    pathForKernel
  });
  app.shell.add(panel, 'right', { rank: 900 });
  return () => app.shell.activateById(panel.id);
}

/**
 * Shutting down a suspended kernel asks first, also from JupyterLab's own
 * Kernels section, which shuts down through the kernel manager; several at
 * once ask once.
 */
export function guardShutdowns(
  app: JupyterFrontEnd,
  model: GpucrModel,
  notifier: GpucrNotifier,
  openPanel: () => void
): { unguarded: IKernelShutdown; shutdowns: KernelShutdowns } {
  const label = (kernelId: string) => notifier.label(kernelId);
  const unguarded = guardKernelShutdown({
    kernels: app.serviceManager.kernels,
    model,
    label,
    trashed: (kernelId, name) => {
      notifier.trashed(kernelId, name);
      void model.refreshLists();
    },
    shutdownAll: kernelIds => shutdowns.askAndShutDown(kernelIds)
  });
  const shutdowns = new KernelShutdowns({
    model,
    sessions: app.serviceManager.sessions,
    unguarded,
    label,
    openPanel
  });
  return { unguarded, shutdowns };
}

/** The commands in the palette, category "Suspended Kernels". */
export function addPaletteItems(palette: ICommandPalette): void {
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
    palette.addItem({ command, category: 'Suspended Kernels' });
  }
}

/**
 * The Kernel menu: Shut Down Kernel of a suspended kernel asks first, and
 * gpucr's Shut Down All Kernels… (which says what happens to each kernel)
 * replaces JupyterLab's.
 */
export function guardKernelMenu(
  app: JupyterFrontEnd,
  mainMenu: IMainMenu,
  model: GpucrModel,
  tracker: INotebookTracker
): void {
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

/** The notebook toolbar's kernel indicator (JupyterLab's `executionProgress`) knows suspended kernels. */
export function wrapKernelIndicator(
  toolbarRegistry: IToolbarWidgetRegistry,
  model: GpucrModel
): void {
  const stock: ((panel: NotebookPanel) => Widget) | undefined =
    toolbarRegistry.addFactory<NotebookPanel>(
      'Notebook',
      'executionProgress',
      (panel): Widget =>
        new GpucrKernelIndicator({
          model,
          panel,
          stock: stock?.(panel) ?? null
        })
    );
}

/** gpucr's status bar item (where the current notebook's kernel is); clicking it opens the panel. */
export function addStatusBarItem(
  app: JupyterFrontEnd,
  statusBar: IStatusBar | null,
  model: GpucrModel,
  openPanel: () => void
): GpucrStatus {
  const status = new GpucrStatus({
    model,
    onClick: openPanel,
    onCancel: kernelId =>
      void app.commands.execute(CommandIDs.cancelSuspend, { kernelId })
  });
  statusBar?.registerStatusItem(`${PLUGIN_ID}:status`, {
    item: status,
    align: 'left',
    rank: 4,
    isActive: () => status.isActive,
    activeStateChanged: status.activeStateChanged
  });
  return status;
}

/** The status bar shows, and the model polls, the current notebook's kernel. */
export function followCurrentNotebook(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  model: GpucrModel,
  status: GpucrStatus
): void {
  const update = () => {
    const kernelId = currentKernelId(tracker);
    status.kernelId = kernelId;
    model.watchKernels(kernelId ? [kernelId] : []);
  };
  const follow = (panel: NotebookPanel) => {
    panel.sessionContext.kernelChanged.connect(update);
    panel.sessionContext.sessionChanged.connect(update);
  };
  tracker.currentChanged.connect(update);
  tracker.forEach(follow);
  tracker.widgetAdded.connect((_, panel) => follow(panel));
  void app.restored.then(update);
}

/**
 * What the notebooks' kernels say that the notices follow: a kernel gone
 * idle (a refused suspend no longer applies), and the debugger refused to a
 * suspended kernel (gpucr answers its start from disk; JupyterLab only logs
 * that).
 */
export function followKernelMessages(
  tracker: INotebookTracker,
  model: GpucrModel,
  notifier: GpucrNotifier
): void {
  const onMessage = (
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
  const follow = (panel: NotebookPanel) => {
    const context = panel.sessionContext;
    const listen = () => context.session?.kernel?.anyMessage.connect(onMessage);
    context.kernelChanged.connect(listen);
    listen();
    context.statusChanged.connect((_, kernelStatus) => {
      const kernelId = context.session?.kernel?.id;
      if (kernelId && kernelStatus === 'idle') {
        notifier.kernelIdle(kernelId);
      }
    });
  };
  tracker.forEach(follow);
  tracker.widgetAdded.connect((_, panel) => follow(panel));
}
