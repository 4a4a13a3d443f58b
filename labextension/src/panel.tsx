/**
 * The side panel: one row per suspended kernel (with its checkpoint),
 * the checkpoints no kernel is suspended in, the trash, the GPUs (and the
 * host memory budget) with what the kernels hold there and what idle kernels
 * could make room of, and what works on this server.
 */
import {
  ReactWidget,
  refreshIcon,
  ToolbarButtonComponent
} from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import { formatBytes, formatDate, formatProgress, formatSince } from './format';
import { gpuIcon } from './icons';
import {
  checkSeverity,
  describeKernelState,
  doctorHeadline,
  engineLabel,
  kernelLabel,
  kindLabel,
  reasonLabel
} from './messages';
import { GpucrModel } from './model';
import {
  gpuRoom,
  hostRoom,
  roomKernelLines,
  roomSegments,
  roomText
} from './room';
import { SavePointsSection } from './savepoints';
import { groupForPanel, isTransient } from './state';
import { CommandIDs } from './tokens';
import type {
  CheckSeverity,
  ICheckpoint,
  IGpu,
  IKernelState,
  IRoomPlace,
  ITrashItem
} from './types';

/** The mark of a doctor check: holds, a note to know, fails. */
const CHECK_MARKS: Record<CheckSeverity, string> = {
  ok: '✓',
  note: 'ℹ',
  fail: '✗'
};

export class GpucrPanel extends ReactWidget {
  constructor(options: GpucrPanel.IOptions) {
    super();
    this._model = options.model;
    this._commands = options.commands;
    this._pathForKernel = options.pathForKernel;
    this.id = 'jp-gpucr-panel';
    this.title.icon = gpuIcon;
    this.title.caption = 'Suspended kernels';
    this.addClass('jp-gpucr-Panel');
    const update = () => {
      if (this.isVisible) {
        this.update();
      }
    };
    this._model.changed.connect(update, this);
    this._model.ticked.connect(update, this);
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
    // save points are listed in their own section, not as checkpoints to delete
    const groups = groupForPanel(
      model.kernels.values(),
      model.checkpoints.filter(c => c.reason !== 'savepoint')
    );
    const loading = model.listsLoaded ? null : 'Loading…';
    const host = hostRoom(model.room);
    return (
      <div className="jp-gpucr-Panel-content">
        <div className="jp-gpucr-Panel-header">
          <h2>Suspended kernels</h2>
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
          {groups.kernels.length === 0 ? (
            <p className="jp-gpucr-Panel-empty">
              {loading ??
                'No kernel is suspended. Use “Suspend Kernel to Disk” in a notebook’s toolbar or Kernel menu.'}
            </p>
          ) : (
            <ul>
              {groups.kernels.map(row =>
                this._renderKernel(row.state, row.checkpoint)
              )}
            </ul>
          )}
        </section>
        <SavePointsSection
          kernelIds={[...model.kernels.values()]
            .filter(k => k.state === 'running' || k.state === 'suspended')
            .map(k => k.kernel_id)}
          commands={this._commands}
          client={model.client}
          label={kernelId => this._name(kernelId)}
        />
        {groups.checkpoints.length > 0 && (
          <section className="jp-gpucr-Panel-section jp-gpucr-Panel-checkpoints">
            <h3>Checkpoints without a suspended kernel</h3>
            <ul>{groups.checkpoints.map(c => this._renderCheckpoint(c))}</ul>
          </section>
        )}
        <section className="jp-gpucr-Panel-section jp-gpucr-Panel-trash">
          <h3>Trash</h3>
          {model.trash.length === 0 ? (
            <p className="jp-gpucr-Panel-empty">
              {loading ??
                'Empty. Shutting down or restarting a suspended kernel puts its saved state here for a day.'}
            </p>
          ) : (
            <ul>{model.trash.map(t => this._renderTrash(t))}</ul>
          )}
        </section>
        <section className="jp-gpucr-Panel-section jp-gpucr-Panel-gpus">
          <h3>GPUs</h3>
          {model.gpus.length === 0 ? (
            <p className="jp-gpucr-Panel-empty">
              {loading ??
                'No GPU visible to the server: kernels run on the CPU, and suspending saves their CPU memory.'}
            </p>
          ) : (
            <ul>{model.gpus.map(g => this._renderGpu(g))}</ul>
          )}
        </section>
        {host && (
          <section className="jp-gpucr-Panel-section jp-gpucr-Panel-host">
            <h3>Host memory</h3>
            <ul>
              <li className="jp-gpucr-Item jp-gpucr-Host">
                <div className="jp-gpucr-Item-main">
                  <div
                    className="jp-gpucr-Item-title"
                    title="c.GPUCR.host_memory_budget: the most host memory the kernels may hold at once"
                  >
                    Budget for kernels
                  </div>
                  {this._renderRoom(host)}
                </div>
              </li>
            </ul>
          </section>
        )}
        {this._renderDoctor()}
      </div>
    );
  }

  private _name(kernelId: string, fallback?: string | null): string {
    return kernelLabel(kernelId, this._pathForKernel(kernelId) ?? fallback);
  }

  private _renderKernel(
    state: IKernelState,
    checkpoint: ICheckpoint | null
  ): JSX.Element {
    const path = this._pathForKernel(state.kernel_id);
    const { label, title } = describeKernelState(state, this._model.now);
    const engine = checkpoint?.engine ?? state.checkpoint?.engine;
    const details = [
      engineLabel(engine ?? state.engine),
      kindLabel(
        state.kind,
        checkpoint?.gpu_model ?? state.checkpoint?.gpu_model
      ),
      reasonLabel(checkpoint?.reason)
    ].filter(Boolean);
    const run = (command: string) => () =>
      void this._commands.execute(command, { kernelId: state.kernel_id });
    return (
      <li
        key={state.kernel_id}
        className="jp-gpucr-Item jp-gpucr-Kernel"
        data-kernel-id={state.kernel_id}
        data-state={state.state}
      >
        <div className="jp-gpucr-Item-main">
          <div className="jp-gpucr-Item-title" title={path ?? state.kernel_id}>
            {breakable(this._name(state.kernel_id))}
          </div>
          <div className="jp-gpucr-Item-detail" title={title}>
            {label}
          </div>
          {state.state === 'suspended' && details.length > 0 && (
            <div className="jp-gpucr-Item-detail">{details.join(' · ')}</div>
          )}
          {isTransient(state.state) && state.progress && (
            <div className="jp-gpucr-Item-detail">
              {formatProgress(state.progress, state.kind)}
            </div>
          )}
        </div>
        <div className="jp-gpucr-Item-actions">
          {state.state === 'suspended' && (
            <>
              <button
                className="jp-mod-styled jp-mod-accept jp-gpucr-resume"
                title="Bring this kernel back, its variables intact"
                onClick={run(CommandIDs.resume)}
              >
                Resume
              </button>
              <button
                className="jp-mod-styled jp-mod-warn jp-gpucr-shutdown"
                title={`Shut the kernel down; its saved state goes to the trash for ${this._model.trashHours} h`}
                onClick={run(CommandIDs.shutdownKernel)}
              >
                Shut down
              </button>
            </>
          )}
          {state.state === 'suspend-pending' && (
            <button
              className="jp-mod-styled jp-gpucr-cancel"
              title="Keep the kernel running"
              onClick={run(CommandIDs.cancelSuspend)}
            >
              Cancel
            </button>
          )}
        </div>
      </li>
    );
  }

  private _renderCheckpoint(checkpoint: ICheckpoint): JSX.Element {
    const details = [
      formatBytes(checkpoint.size),
      engineLabel(checkpoint.engine),
      kindLabel(null, checkpoint.gpu_model),
      reasonLabel(checkpoint.reason)
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
            title={`${checkpoint.notebook_path ?? checkpoint.name}\n${checkpoint.id}`}
          >
            {breakable(
              this._name(checkpoint.kernel_id ?? '', checkpoint.notebook_path)
            )}
          </div>
          <div
            className="jp-gpucr-Item-detail"
            title={formatDate(checkpoint.created)}
          >
            saved{' '}
            {formatSince(checkpoint.created, this._model.now) ||
              formatDate(checkpoint.created)}
          </div>
          <div className="jp-gpucr-Item-detail">{details.join(' · ')}</div>
        </div>
        <div className="jp-gpucr-Item-actions">
          <button
            className="jp-mod-styled jp-mod-warn jp-gpucr-delete"
            title="Delete this checkpoint from disk, for good"
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

  private _renderTrash(item: ITrashItem): JSX.Element {
    const details = [
      formatBytes(item.size),
      engineLabel(item.engine),
      kindLabel(item.kind),
      item.reason === 'restart' ? 'restarted' : 'shut down'
    ].filter(Boolean);
    const run = (command: string) => () =>
      void this._commands.execute(command, { trashId: item.id });
    return (
      <li
        key={item.id}
        className="jp-gpucr-Item jp-gpucr-Trash"
        data-trash-id={item.id}
        data-kernel-id={item.kernel_id ?? ''}
      >
        <div className="jp-gpucr-Item-main">
          <div
            className="jp-gpucr-Item-title"
            title={item.notebook_path ?? item.name}
          >
            {breakable(kernelLabel(item.kernel_id ?? '', item.notebook_path))}
          </div>
          <div
            className="jp-gpucr-Item-detail"
            title={`Deleted for good at ${formatDate(item.expires_at)}`}
          >
            trashed{' '}
            {formatSince(item.trashed_at, this._model.now) ||
              formatDate(item.trashed_at)}
          </div>
          <div className="jp-gpucr-Item-detail">{details.join(' · ')}</div>
        </div>
        <div className="jp-gpucr-Item-actions">
          <button
            className="jp-mod-styled jp-mod-accept jp-gpucr-restore"
            title="Put it back: the kernel is suspended again, its variables intact"
            onClick={run(CommandIDs.restoreFromTrash)}
          >
            Restore
          </button>
          <button
            className="jp-mod-styled jp-mod-warn jp-gpucr-delete-forever"
            title="Delete it from disk, for good"
            onClick={run(CommandIDs.deleteFromTrash)}
          >
            Delete forever
          </button>
        </div>
      </li>
    );
  }

  /** A GPU: what it holds (the room report's row), else its free memory alone. */
  private _renderGpu(gpu: IGpu): JSX.Element {
    const room = gpuRoom(this._model.room, gpu.uuid);
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
          {room ? this._renderRoom(room) : this._renderFree(gpu)}
        </div>
      </li>
    );
  }

  private _renderFree(gpu: IGpu): JSX.Element {
    const used =
      gpu.memory_total > 0
        ? Math.min(100, Math.round((100 * gpu.memory_used) / gpu.memory_total))
        : 0;
    const kernels = gpu.kernels?.length ?? 0;
    return (
      <>
        <div className="jp-gpucr-Meter" title={`${used}% used`}>
          <span style={{ width: `${used}%` }} />
        </div>
        <div className="jp-gpucr-Item-detail">
          {formatBytes(gpu.memory_free)} free of {formatBytes(gpu.memory_total)}
          {kernels > 0 ? ` · ${kernels} kernel${kernels > 1 ? 's' : ''}` : ''}
        </div>
      </>
    );
  }

  /**
   * A place's bar (idle kernels, kernels kept, other use, free) and its line;
   * the tooltip names each kernel and whether it could be suspended to make room.
   */
  private _renderRoom(place: IRoomPlace): JSX.Element {
    const kernels = roomKernelLines(place, id => this._name(id));
    const title = [
      'Idle: what is suspended, least recently used first, when another kernel needs the room.',
      ...kernels
    ].join('\n');
    return (
      <>
        <div className="jp-gpucr-Meter jp-gpucr-Room-bar" title={title}>
          {roomSegments(place).map(s => (
            <span
              key={s.part}
              className={`jp-gpucr-Room-${s.part}`}
              style={{ width: `${s.percent}%` }}
            />
          ))}
        </div>
        <div className="jp-gpucr-Item-detail jp-gpucr-Room" title={title}>
          {roomText(place)}
        </div>
      </>
    );
  }

  private _renderDoctor(): JSX.Element | null {
    const doctor = this._model.doctor;
    if (!doctor || !Array.isArray(doctor.checks)) {
      return null;
    }
    return (
      <section className="jp-gpucr-Panel-section jp-gpucr-Panel-doctor">
        <details>
          <summary>What works on this server: {doctorHeadline(doctor)}</summary>
          <ul>
            {doctor.checks.map(check => {
              const severity = checkSeverity(check);
              return (
                <li
                  key={check.name}
                  className={`jp-gpucr-Check jp-gpucr-Check-${severity}`}
                >
                  <span className="jp-gpucr-Check-mark">
                    {CHECK_MARKS[severity]}
                  </span>{' '}
                  <b>{check.name}</b>
                  {check.detail ? `: ${check.detail}` : ''}
                  {severity !== 'ok' && check.fix && (
                    <div className="jp-gpucr-Item-detail">
                      {severity === 'fail' ? 'Fix' : 'Note'}: {check.fix}
                    </div>
                  )}
                </li>
              );
            })}
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
    /** The notebook path of a kernel, now. */
    pathForKernel: (kernelId: string) => string | null;
  }
}

/**
 * A name that wraps where its parts meet (after `/`, `.`, `_`, `-`, spaces)
 * rather than inside a word: `analysis-final.ipynb` breaks as
 * `analysis-` / `final.ipynb`, never `analysis-fin` / `al.ipynb`.
 */
function breakable(name: string): JSX.Element {
  const parts = name.split(/(?<=[/._-])/);
  return (
    <>
      {parts.map((part, i) => (
        <React.Fragment key={i}>
          {i > 0 && <wbr />}
          {part}
        </React.Fragment>
      ))}
    </>
  );
}
