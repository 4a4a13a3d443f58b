/**
 * The side panel: suspended kernels, checkpoints on disk and the GPUs with
 * their free memory, with Resume and Delete buttons.
 */
import {
  ReactWidget,
  refreshIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import {
  basename,
  formatBytes,
  formatDate,
  formatProgress,
  formatSince
} from './format';
import { gpuIcon } from './icons';
import { GpucrModel, ICheckpoint, IGpu, IKernelState } from './model';
import { describeKernelState, isTransient } from './state';
import { CommandIDs } from './tokens';

export class GpucrPanel extends ReactWidget {
  constructor(options: GpucrPanel.IOptions) {
    super();
    this._model = options.model;
    this._commands = options.commands;
    this._pathForKernel = options.pathForKernel;
    this.id = 'jp-gpucr-panel';
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU checkpoints';
    this.addClass('jp-gpucr-Panel');
    this._model.changed.connect(() => {
      if (this.isVisible) {
        this.update();
      }
    }, this);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._model.setListsActive(true);
    if (!this._model.doctor) {
      void this._model.refreshDoctor();
    }
    this.update();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.setListsActive(false);
  }

  render(): JSX.Element {
    const model = this._model;
    const suspended = [...model.kernels.values()].filter(
      k => k.state !== 'running'
    );
    return (
      <div className="jp-gpucr-Panel-content">
        <div className="jp-gpucr-Panel-header">
          <h2>GPU checkpoints</h2>
          <ToolbarButtonComponent
            icon={refreshIcon}
            tooltip="Refresh"
            onClick={() => {
              void model.refreshLists();
              void model.refreshDoctor();
            }}
          />
        </div>
        {model.available === false && (
          <div className="jp-gpucr-Panel-error">
            The gpucr server extension does not answer. Check
            <code>jupyter server extension list</code>.
          </div>
        )}
        {model.listError && model.available !== false && (
          <div className="jp-gpucr-Panel-error">{model.listError}</div>
        )}
        <section className="jp-gpucr-Panel-section jp-gpucr-Panel-kernels">
          <h3>Suspended kernels</h3>
          {suspended.length === 0 ? (
            <p className="jp-gpucr-Panel-empty">
              No kernel is suspended. Use “Suspend Kernel to Disk” in a
              notebook’s toolbar or Kernel menu.
            </p>
          ) : (
            <ul>{suspended.map(k => this._renderKernel(k))}</ul>
          )}
        </section>
        <section className="jp-gpucr-Panel-section jp-gpucr-Panel-checkpoints">
          <h3>Checkpoints on disk</h3>
          {model.checkpoints.length === 0 ? (
            <p className="jp-gpucr-Panel-empty">
              {model.listsLoaded ? 'No checkpoint.' : 'Loading…'}
            </p>
          ) : (
            <ul>{model.checkpoints.map(c => this._renderCheckpoint(c))}</ul>
          )}
        </section>
        <section className="jp-gpucr-Panel-section jp-gpucr-Panel-gpus">
          <h3>GPUs</h3>
          {model.gpus.length === 0 ? (
            <p className="jp-gpucr-Panel-empty">
              {model.listsLoaded
                ? 'No GPU visible to the server: kernels run on the CPU, and suspend saves their CPU state.'
                : 'Loading…'}
            </p>
          ) : (
            <ul>{model.gpus.map(g => this._renderGpu(g))}</ul>
          )}
        </section>
        {this._renderDoctor()}
      </div>
    );
  }

  private _renderKernel(state: IKernelState): JSX.Element {
    const path =
      this._pathForKernel(state.kernel_id) ??
      this._model.checkpoints.find(c => c.kernel_id === state.kernel_id)
        ?.notebook_path ??
      null;
    const { label, title } = describeKernelState(state);
    const checkpoint = state.checkpoint;
    // The label already says the size and age.
    const details = [
      checkpoint?.engine ?? state.engine ?? '',
      checkpoint?.gpu_model ?? ''
    ].filter(Boolean);
    return (
      <li
        key={state.kernel_id}
        className="jp-gpucr-Item jp-gpucr-Kernel"
        data-kernel-id={state.kernel_id}
        data-state={state.state}
      >
        <div className="jp-gpucr-Item-main">
          <div className="jp-gpucr-Item-title" title={path ?? state.kernel_id}>
            {path ? basename(path) : `kernel ${state.kernel_id.slice(0, 8)}`}
          </div>
          <div className="jp-gpucr-Item-detail" title={title}>
            {label}
          </div>
          {details.length > 0 && (
            <div className="jp-gpucr-Item-detail">{details.join(' · ')}</div>
          )}
          {isTransient(state.state) && state.progress && (
            <div className="jp-gpucr-Item-detail">
              {formatProgress(state.progress)}
            </div>
          )}
        </div>
        <div className="jp-gpucr-Item-actions">
          {state.state === 'suspended' && (
            <button
              className="jp-mod-styled jp-mod-accept jp-gpucr-resume"
              title="Restore this kernel on a GPU with room"
              onClick={() =>
                void this._commands.execute(CommandIDs.resume, {
                  kernelId: state.kernel_id
                })
              }
            >
              Resume
            </button>
          )}
        </div>
      </li>
    );
  }

  private _renderCheckpoint(checkpoint: ICheckpoint): JSX.Element {
    const kernel = checkpoint.kernel_id
      ? this._model.getKernel(checkpoint.kernel_id)
      : undefined;
    // The open notebook's path first: it follows renames after the suspend.
    const path =
      (checkpoint.kernel_id
        ? this._pathForKernel(checkpoint.kernel_id)
        : null) ?? checkpoint.notebook_path;
    const live =
      kernel?.state === 'suspended' &&
      (!kernel.checkpoint || kernel.checkpoint.id === checkpoint.id);
    const details = [
      formatBytes(checkpoint.size),
      checkpoint.engine ?? '',
      checkpoint.gpu_model ?? 'CPU only',
      checkpoint.reason ?? ''
    ].filter(Boolean);
    return (
      <li
        key={checkpoint.id}
        className="jp-gpucr-Item jp-gpucr-Checkpoint"
        data-checkpoint-id={checkpoint.id}
      >
        <div className="jp-gpucr-Item-main">
          <div
            className="jp-gpucr-Item-title"
            title={`${path ?? checkpoint.name}\n${checkpoint.id}`}
          >
            {path ? basename(path) : checkpoint.name || checkpoint.id}
          </div>
          <div
            className="jp-gpucr-Item-detail"
            title={formatDate(checkpoint.created)}
          >
            {formatSince(checkpoint.created) || formatDate(checkpoint.created)}
            {live ? ' · kernel suspended' : ''}
          </div>
          <div className="jp-gpucr-Item-detail">{details.join(' · ')}</div>
        </div>
        <div className="jp-gpucr-Item-actions">
          {live && (
            <button
              className="jp-mod-styled jp-mod-accept jp-gpucr-resume"
              title="Restore the kernel from this checkpoint"
              onClick={() =>
                void this._commands.execute(CommandIDs.resume, {
                  kernelId: checkpoint.kernel_id!
                })
              }
            >
              Resume
            </button>
          )}
          <button
            className="jp-mod-styled jp-mod-warn jp-gpucr-delete"
            title="Delete this checkpoint from disk"
            aria-label={`Delete checkpoint ${checkpoint.id}`}
            onClick={() =>
              void this._commands.execute(CommandIDs.deleteCheckpoint, {
                checkpointId: checkpoint.id
              })
            }
          >
            Delete
          </button>
        </div>
      </li>
    );
  }

  private _renderGpu(gpu: IGpu): JSX.Element {
    const used =
      gpu.memory_total > 0
        ? Math.min(100, Math.round((100 * gpu.memory_used) / gpu.memory_total))
        : 0;
    const kernels = gpu.kernels?.length ?? 0;
    return (
      <li
        key={gpu.uuid || gpu.index}
        className="jp-gpucr-Item jp-gpucr-Gpu"
        data-gpu-index={gpu.index}
      >
        <div className="jp-gpucr-Item-main">
          <div className="jp-gpucr-Item-title" title={gpu.uuid}>
            GPU {gpu.index} · {gpu.name}
          </div>
          <div className="jp-gpucr-Meter" title={`${used}% used`}>
            <span style={{ width: `${used}%` }} />
          </div>
          <div className="jp-gpucr-Item-detail">
            {formatBytes(gpu.memory_free)} free of{' '}
            {formatBytes(gpu.memory_total)}
            {kernels > 0 ? ` · ${kernels} kernel${kernels > 1 ? 's' : ''}` : ''}
          </div>
        </div>
      </li>
    );
  }

  private _renderDoctor(): JSX.Element | null {
    const doctor = this._model.doctor;
    if (!doctor || !Array.isArray(doctor.checks)) {
      return null;
    }
    const failing = doctor.checks.filter(c => !c.ok).length;
    return (
      <section className="jp-gpucr-Panel-section jp-gpucr-Panel-doctor">
        <details>
          <summary>
            What works here:{' '}
            {doctor.ok
              ? 'everything'
              : `${failing} check${failing === 1 ? '' : 's'} failing`}
          </summary>
          <ul>
            {doctor.checks.map(check => (
              <li
                key={check.name}
                className={`jp-gpucr-Check jp-gpucr-Check-${check.ok ? 'ok' : 'fail'}`}
              >
                <span className="jp-gpucr-Check-mark">
                  {check.ok ? '✓' : '✗'}
                </span>{' '}
                <b>{check.name}</b>
                {check.detail ? `: ${check.detail}` : ''}
                {!check.ok && check.fix && (
                  <div className="jp-gpucr-Item-detail">Fix: {check.fix}</div>
                )}
              </li>
            ))}
          </ul>
        </details>
      </section>
    );
  }

  private _model: GpucrModel;
  private _commands: CommandRegistry;
  private _pathForKernel: (kernelId: string) => string | null;
}

export namespace GpucrPanel {
  export interface IOptions {
    model: GpucrModel;
    commands: CommandRegistry;
    /** The notebook path of a running session's kernel, if any. */
    pathForKernel: (kernelId: string) => string | null;
  }
}
