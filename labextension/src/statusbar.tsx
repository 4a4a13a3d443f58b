/**
 * The status bar item: what the current notebook's kernel is doing.
 *
 * `GPU 0 · NVIDIA H200 · 5.7 GiB`, `CPU`, `Suspend after this cell` (with
 * Cancel), `Suspending… writing image 40%`,
 * `Suspended · 5.0 GiB on disk · 3 min ago`, `Restoring…`, plus a warning
 * when the last operation failed. Clicking it opens the side panel.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { ISignal, Signal } from '@lumino/signaling';
import * as React from 'react';

import { progressPercent } from './format';
import { gpuIcon, resumeIcon, suspendIcon } from './icons';
import { describeKernelState } from './messages';
import { GpucrModel } from './model';
import { isTransient } from './state';
import type { IKernelTransition } from './store';

export class GpucrStatus extends ReactWidget {
  constructor(options: GpucrStatus.IOptions) {
    super();
    this._model = options.model;
    this._onClick = options.onClick;
    this._onCancel = options.onCancel;
    this.addClass('jp-gpucr-StatusItem');
    this._model.kernelChanged.connect(this._onKernelChanged, this);
    this._model.ticked.connect(this._onTick, this);
  }

  /** The kernel shown (the current notebook's), or null. */
  get kernelId(): string | null {
    return this._kernelId;
  }
  set kernelId(value: string | null) {
    if (value === this._kernelId) {
      return;
    }
    this._kernelId = value;
    this._emitActive();
    this.update();
  }

  /** Whether the user wants the item (setting `showStatusBar`). */
  get enabled(): boolean {
    return this._enabled;
  }
  set enabled(value: boolean) {
    if (value === this._enabled) {
      return;
    }
    this._enabled = value;
    this._emitActive();
  }

  /** Whether the status bar should show the item now. */
  get isActive(): boolean {
    return (
      this._enabled &&
      !!this._kernelId &&
      !!this._model.getKernel(this._kernelId)
    );
  }

  /** Emitted when `isActive` may have changed. */
  get activeStateChanged(): ISignal<this, void> {
    return this._activeStateChanged;
  }

  dispose(): void {
    this._model.ticked.disconnect(this._onTick, this);
    super.dispose();
  }

  render(): JSX.Element | null {
    const state = this._model.getKernel(this._kernelId);
    if (!state) {
      return null;
    }
    const { label, title, kind } = describeKernelState(state, this._model.now);
    const percent = isTransient(state.state)
      ? progressPercent(state.progress)
      : null;
    const icon =
      state.state === 'suspended'
        ? suspendIcon
        : state.state === 'restoring'
          ? resumeIcon
          : gpuIcon;
    return (
      <div
        className={`jp-gpucr-Status jp-gpucr-Status-${kind}`}
        data-state={state.state}
        title={title + '\nClick to open the Suspended kernels panel.'}
        onClick={() => this._onClick?.()}
      >
        <icon.react
          tag="span"
          className="jp-gpucr-Status-icon"
          stylesheet="statusBar"
        />
        <span className="jp-gpucr-Status-label">{label}</span>
        {state.state === 'suspend-pending' && (
          <button
            className="jp-gpucr-Status-cancel"
            title="Keep the kernel running: cancel the pending suspend"
            onClick={event => {
              event.stopPropagation();
              this._onCancel?.(state.kernel_id);
            }}
          >
            Cancel
          </button>
        )}
        {percent !== null && (
          <span className="jp-gpucr-Status-bar" aria-hidden="true">
            <span style={{ width: `${percent}%` }} />
          </span>
        )}
      </div>
    );
  }

  /** Keep "3 min ago" fresh, in step with the other views. */
  private _onTick(): void {
    if (this.isVisible) {
      this.update();
    }
  }

  private _onKernelChanged(_: GpucrModel, change: IKernelTransition): void {
    if (change.kernelId !== this._kernelId) {
      return;
    }
    if (!change.previous !== !change.current) {
      this._emitActive();
    }
    this.update();
  }

  private _emitActive(): void {
    this._activeStateChanged.emit();
  }

  private _model: GpucrModel;
  private _onClick: (() => void) | undefined;
  private _onCancel: ((kernelId: string) => void) | undefined;
  private _kernelId: string | null = null;
  private _enabled = true;
  private _activeStateChanged = new Signal<this, void>(this);
}

export namespace GpucrStatus {
  export interface IOptions {
    model: GpucrModel;
    onClick?: () => void;
    /** Cancel a pending suspend of this kernel. */
    onCancel?: (kernelId: string) => void;
  }
}
