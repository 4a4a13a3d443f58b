/**
 * The notebook toolbar's kernel status indicator (JupyterLab's
 * `executionProgress` item), wrapped: while gpucr has the notebook's kernel
 * on disk (or is moving it there or back) it shows that state instead of
 * JupyterLab's circle, whose tooltip would say "Idle".
 */
import { NotebookPanel } from '@jupyterlab/notebook';
import { PanelLayout, Widget } from '@lumino/widgets';

import { resumeIcon, suspendIcon } from './icons';
import { describeKernelState } from './messages';
import { GpucrModel } from './model';
import type { IKernelTransition } from './store';

export class GpucrKernelIndicator extends Widget {
  constructor(options: GpucrKernelIndicator.IOptions) {
    super();
    this._model = options.model;
    this._panel = options.panel;
    this._stock = options.stock;
    this.addClass('jp-gpucr-KernelIndicator');
    const layout = (this.layout = new PanelLayout());
    if (this._stock) {
      layout.addWidget(this._stock);
    }
    this._badge.addClass('jp-gpucr-KernelIndicator-badge');
    layout.addWidget(this._badge);
    this._model.kernelChanged.connect(this._onKernelChanged, this);
    this._panel.sessionContext.kernelChanged.connect(this._update, this);
    this._update();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.kernelChanged.disconnect(this._onKernelChanged, this);
    super.dispose();
  }

  private _onKernelChanged(_: GpucrModel, change: IKernelTransition): void {
    if (change.kernelId === this._panel.sessionContext.session?.kernel?.id) {
      this._update();
    }
  }

  private _update(): void {
    const state = this._model.getKernel(
      this._panel.sessionContext.session?.kernel?.id
    );
    const shown =
      !!state && state.state !== 'running' && state.state !== 'suspend-pending';
    this.node.dataset.gpucrState = state?.state ?? '';
    this._stock?.setHidden(shown);
    this._badge.setHidden(!shown);
    if (!shown) {
      return;
    }
    const icon = state.state === 'restoring' ? resumeIcon : suspendIcon;
    const { title } = describeKernelState(state, this._model.now);
    const word =
      state.state === 'suspended'
        ? 'Suspended to disk'
        : state.state === 'restoring'
          ? 'Restoring from disk'
          : 'Suspending to disk';
    this._badge.node.title = `Kernel status: ${word}\n${title}`;
    this._badge.node.setAttribute('aria-label', `Kernel status: ${word}`);
    icon.element({
      container: this._badge.node,
      stylesheet: 'toolbarButton',
      height: '24px',
      alignSelf: 'normal'
    });
  }

  private _model: GpucrModel;
  private _panel: NotebookPanel;
  private _stock: Widget | null;
  private _badge = new Widget();
}

export namespace GpucrKernelIndicator {
  export interface IOptions {
    model: GpucrModel;
    panel: NotebookPanel;
    /** JupyterLab's own indicator, shown while the kernel runs. */
    stock: Widget | null;
  }
}
