/**
 * A Tab completion asked while its kernel is on disk or being restored:
 * JupyterLab's completer gives each provider one second (`providerTimeout`)
 * and drops a reply that comes later, and a restore takes longer, so no list
 * would appear until a second Tab. Once the kernel runs again, the completion
 * is asked again for the user, if the cursor is still where it was.
 */
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { CommandRegistry } from '@lumino/commands';

import { GpucrModel } from './model';

/** How long the completion waits for this page's connection to the restored kernel. */
const IDLE_WAIT_MS = 30000;

/** The kernel states in which a completion request waits for a restore. */
const ON_DISK = ['suspended', 'restoring', 'waiting-for-room'];

interface IAsked {
  panel: NotebookPanel;
  cell: unknown;
  offset: number;
}

export class CompletionAfterRestore {
  constructor(
    private readonly _tracker: INotebookTracker,
    private readonly _model: GpucrModel,
    private readonly _commands: CommandRegistry
  ) {
    _tracker.forEach(panel => this._follow(panel));
    _tracker.widgetAdded.connect((_, panel) => this._follow(panel));
    _model.kernelChanged.connect((_, t) => {
      if (t.current?.state === 'running') {
        this._back(t.kernelId);
      }
    });
  }

  private _follow(panel: NotebookPanel): void {
    const connect = () => {
      const kernel = panel.sessionContext.session?.kernel;
      if (kernel && !this._followed.has(kernel)) {
        this._followed.add(kernel);
        kernel.anyMessage.connect(this._message, this);
      }
    };
    panel.sessionContext.kernelChanged.connect(connect);
    connect();
  }

  private _message(
    kernel: Kernel.IKernelConnection,
    args: Kernel.IAnyMessageArgs
  ): void {
    if (
      args.direction !== 'send' ||
      args.msg.header.msg_type !== 'complete_request' ||
      !ON_DISK.includes(this._model.getKernel(kernel.id)?.state ?? '')
    ) {
      return;
    }
    const panel = this._tracker.currentWidget;
    const cell = panel?.content.activeCell;
    const editor = cell?.editor;
    if (!panel || !editor || panel.sessionContext.session?.kernel !== kernel) {
      return;
    }
    this._asked.set(kernel.id, {
      panel,
      cell,
      offset: editor.getOffsetAt(editor.getCursorPosition())
    });
  }

  private _back(kernelId: string): void {
    const asked = this._asked.get(kernelId);
    if (!asked) {
      return;
    }
    this._asked.delete(kernelId);
    const panel = this._tracker.currentWidget;
    const cell = panel?.content.activeCell;
    const editor = cell?.editor;
    if (
      panel !== asked.panel ||
      cell !== asked.cell ||
      !editor ||
      editor.getOffsetAt(editor.getCursorPosition()) !== asked.offset
    ) {
      return;
    }
    // The server says the kernel runs; this page's connection to it may still be coming back
    // (JupyterLab drops a completion asked of a kernel that is not idle): ask once it is.
    const kernel = panel.sessionContext.session?.kernel;
    const ask = () => void this._commands.execute('completer:invoke-notebook');
    if (!kernel || kernel.status === 'idle') {
      ask();
      return;
    }
    const deadline = setTimeout(() => {
      kernel.statusChanged.disconnect(onStatus);
    }, IDLE_WAIT_MS);
    const onStatus = (_: Kernel.IKernelConnection, status: Kernel.Status) => {
      if (status === 'idle') {
        clearTimeout(deadline);
        kernel.statusChanged.disconnect(onStatus);
        ask();
      }
    };
    kernel.statusChanged.connect(onStatus);
  }

  private readonly _asked = new Map<string, IAsked>();
  private readonly _followed = new WeakSet<Kernel.IKernelConnection>();
}
