/**
 * The model the views render: the kernel states (store.ts), the lists the
 * side panel shows (lists.ts), and the operations of this browser.
 *
 * A kernel's state comes whole from the server's events, from the replies to
 * this browser's operations, and from polls (poller.ts) as the fallback for
 * what no event says: a kernel started or shut down, an event connection
 * lost. Views never call the server themselves; they read this model and
 * listen to its signals. The requests go through the REST client (api.ts).
 */
import { ServerConnection } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { GpucrClient, GpucrRequestError } from './api';
import { ServerLists } from './lists';
import { Poller } from './poller';
import { isTransient } from './state';
import { IKernelTransition, KernelStore } from './store';
import {
  ICheckpoint,
  IDoctorReport,
  IGpu,
  IKernelState,
  IKernelStateEvent,
  IRoomPlace,
  ITrashItem,
  KERNEL_STATE_SCHEMA
} from './types';

export class GpucrModel implements IDisposable {
  constructor(options: GpucrModel.IOptions) {
    this.client = options.client ?? new GpucrClient(options.serverSettings);
    this.trashHours = options.trashHours;
    this._lists = new ServerLists(this.client);
    this._lists.changed.connect(() => this._changed.emit(), this);
    this._store.changed.connect(this._onKernelChanged, this);
    this._poller = new Poller({
      tick: () => this._tick(),
      fast: () => this._store.anyTransient,
      interval: options.pollInterval
    });
  }

  /** The REST client. */
  readonly client: GpucrClient;

  /** Hours a shut down or restarted kernel's saved state stays in the trash (`c.GPUCR.trash_hours`). */
  readonly trashHours: number;

  /**
   * The time every view says "… ago" from: one clock, advanced every 15 s,
   * so that the status bar, the side panel and the Running sidebar agree.
   */
  get now(): Date {
    return this._poller.now;
  }

  /** Emitted when `now` advances: views showing ages render again. */
  get ticked(): ISignal<Poller, void> {
    return this._poller.ticked;
  }

  /** Emitted when one kernel's state changes, from any source. */
  get kernelChanged(): ISignal<this, IKernelTransition> {
    return this._kernelChanged;
  }

  /**
   * Emitted with the kernel's id when an operation of this browser on it
   * starts or ends (`isBusy`): its reply may say what the events said, so
   * that no state changes then.
   */
  get busyChanged(): ISignal<this, string> {
    return this._busyChanged;
  }

  /** Emitted when anything in the model changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** `false` once the server answered that the gpucr API does not exist. */
  get available(): boolean | null {
    return this._available;
  }

  /** Known kernel states by kernel id. */
  get kernels(): ReadonlyMap<string, IKernelState> {
    return this._store.kernels;
  }

  getKernel(kernelId: string | null | undefined): IKernelState | undefined {
    return kernelId ? this._store.get(kernelId) : undefined;
  }

  get checkpoints(): ReadonlyArray<ICheckpoint> {
    return this._lists.checkpoints;
  }

  /** Checkpoints of kernels shut down or restarted, newest first. */
  get trash(): ReadonlyArray<ITrashItem> {
    return this._lists.trash;
  }

  get gpus(): ReadonlyArray<IGpu> {
    return this._lists.gpus;
  }

  /** What each GPU (and the host memory budget) holds: `GET /api/gpucr/room`. */
  get room(): ReadonlyArray<IRoomPlace> {
    return this._lists.room;
  }

  get doctor(): IDoctorReport | null {
    return this._lists.doctor;
  }

  /** What the last refresh of the kernels and lists could not fetch, if anything. */
  get listError(): string | null {
    const errors = [
      ...(this._kernelsError ? [this._kernelsError] : []),
      ...this._lists.errors
    ];
    return errors.length ? [...new Set(errors)].join('; ') : null;
  }

  /** Whether the lists were fetched at least once. */
  get listsLoaded(): boolean {
    return this._lists.loaded;
  }

  /** Poll interval in milliseconds. */
  get pollInterval(): number {
    return this._poller.interval;
  }
  set pollInterval(value: number) {
    this._poller.interval = value;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Whether an operation started from this browser is in flight. */
  isBusy(kernelId: string): boolean {
    return this._store.isBusy(kernelId);
  }

  /** Set the kernels to poll (the current notebook's, for the status bar). */
  watchKernels(kernelIds: Iterable<string>): void {
    const next = new Set(kernelIds);
    const added = [...next].filter(k => !this._watched.has(k));
    this._watched = next;
    for (const k of added) {
      void this.refreshKernel(k);
    }
  }

  /** Poll the checkpoint and GPU lists (while the side panel is visible). */
  setListsActive(active: boolean): void {
    if (active === this._listsActive) {
      return;
    }
    this._listsActive = active;
    if (active) {
      void this.refreshLists();
    }
  }

  /** Fetch one kernel's state now. */
  async refreshKernel(kernelId: string): Promise<IKernelState | undefined> {
    const asked = this._store.ask();
    try {
      const state = await this.client.getKernel(kernelId);
      this._available = true;
      this._store.applyPolled(kernelId, state, asked);
    } catch (error) {
      if (error instanceof GpucrRequestError && error.status === 404) {
        this._store.applyGone(kernelId, asked);
      }
      // Network errors: keep the last known state.
    }
    return this._store.get(kernelId);
  }

  /**
   * Fetch every kernel's state now (the status bar, the toolbar indicator and
   * the Running sidebar show them).
   */
  async refreshKernels(): Promise<void> {
    let states: IKernelState[];
    const asked = this._store.ask();
    try {
      states = await this.client.listKernels();
    } catch (error) {
      if (error instanceof GpucrRequestError && error.status === 404) {
        this._available = false;
      }
      this._setKernelsError(String((error as Error).message ?? error));
      return;
    }
    this._setKernelsError(null);
    if (Array.isArray(states)) {
      this._available = true;
      this._store.applyList(states, asked);
    }
  }

  /** Fetch kernels, checkpoints, trash, GPUs and what they hold now. */
  async refreshLists(): Promise<void> {
    await Promise.all([this.refreshKernels(), this._lists.refresh()]);
  }

  /** Fetch the doctor report (what works on the server machine). */
  refreshDoctor(): Promise<IDoctorReport> {
    return this._lists.refreshDoctor();
  }

  /**
   * Suspend a kernel to disk. Resolves with the final state once the
   * checkpoint is complete (or, `when: 'idle'`, with the `suspend-pending`
   * state). Rejects with the server's message if it failed: the kernel keeps
   * running and its state carries the error; a refusal because a cell runs
   * (`GpucrRequestError.isBusy`) leaves the state alone.
   */
  async suspend(
    kernelId: string,
    options: GpucrClient.ISuspendOptions = {}
  ): Promise<IKernelState> {
    return this._operation(kernelId, 'suspend', () =>
      this.client.suspend(kernelId, options)
    );
  }

  /** Cancel a pending suspend: the kernel keeps running. */
  async cancelSuspend(kernelId: string): Promise<IKernelState> {
    const state = await this.client.cancelSuspend(kernelId);
    const current = this._store.applyReply(kernelId, state);
    this._afterOperation();
    return current;
  }

  /** Resume a suspended kernel (the server picks a GPU unless `gpu` is given). */
  async resume(kernelId: string, gpu?: string | number): Promise<IKernelState> {
    return this._operation(kernelId, 'resume', () =>
      this.client.resume(kernelId, gpu)
    );
  }

  /**
   * The kernel is about to be used (its user types into a cell): a suspended
   * kernel starts restoring in the background. The server answers at once,
   * before the restore's events: its reply counts as a poll.
   */
  async resumeAhead(kernelId: string): Promise<void> {
    const asked = this._store.ask();
    const state = await this.client.resumeAhead(kernelId);
    this._store.applyPolled(kernelId, state, asked);
  }

  /** Put a trashed checkpoint back; its kernel is suspended again. */
  async restoreFromTrash(
    trashId: string,
    options: GpucrClient.IRestoreOptions = {}
  ): Promise<IKernelState> {
    // Its event may come before the reply: neither is a suspend that just finished.
    const kernelId = this.trash.find(t => t.id === trashId)?.kernel_id;
    if (kernelId) {
      this._store.expectFromTrash(kernelId);
    }
    let state: IKernelState;
    try {
      state = await this.client.restoreTrash(trashId, options);
    } catch (error) {
      if (kernelId) {
        this._store.cancelFromTrash(kernelId);
      }
      throw error;
    }
    if (state.kernel_id !== kernelId) {
      this._store.expectFromTrash(state.kernel_id);
    }
    const restored = this._store.applyReply(state.kernel_id, state);
    await this.refreshLists();
    return this._store.get(state.kernel_id) ?? restored;
  }

  /** Delete a trashed checkpoint for good. */
  async deleteFromTrash(trashId: string): Promise<void> {
    await this.client.deleteTrash(trashId);
    this._lists.dropTrash(trashId);
    await this.refreshLists();
  }

  /** Delete a checkpoint and refresh the lists. */
  async deleteCheckpoint(checkpointId: string): Promise<void> {
    await this.client.deleteCheckpoint(checkpointId);
    this._lists.dropCheckpoint(checkpointId);
    await this.refreshLists();
  }

  /**
   * Apply an event of the server's event bus: the kernel's whole state, no
   * request needed. Other schemas are ignored. Returns whether the event
   * was for gpucr.
   */
  applyEvent(event: { schema_id?: string; [key: string]: any }): boolean {
    if (event.schema_id !== KERNEL_STATE_SCHEMA) {
      return false;
    }
    const data = event as unknown as IKernelStateEvent;
    if (typeof data.kernel_id !== 'string' || typeof data.state !== 'string') {
      return true;
    }
    this._available = true;
    this._store.applyEvent(data);
    if (!isTransient(data.state)) {
      // An operation ended: its checkpoint, trash item or GPU memory changed.
      this._afterOperation();
    }
    return true;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._poller.dispose();
    this._store.dispose();
    this._lists.dispose();
    Signal.clearData(this);
  }

  /**
   * A suspend or resume of this browser: its reply is the final state; a
   * failure's message goes into the state the server says after it. A
   * refusal because a cell runs (`isBusy`) changes nothing.
   */
  private async _operation(
    kernelId: string,
    operation: 'suspend' | 'resume',
    request: () => Promise<IKernelState>
  ): Promise<IKernelState> {
    this._store.begin(kernelId, operation);
    this._busyChanged.emit(kernelId);
    try {
      const state = await request();
      this._endOperation(kernelId);
      return this._store.applyReply(kernelId, state);
    } catch (error) {
      this._endOperation(kernelId);
      if (!(error instanceof GpucrRequestError && error.isBusy)) {
        this._store.applyFailure(
          kernelId,
          (error as Error).message || String(error),
          error instanceof GpucrRequestError ? error.reason : null
        );
      }
      throw error;
    } finally {
      this._afterOperation();
    }
  }

  private _endOperation(kernelId: string): void {
    this._store.end(kernelId);
    this._busyChanged.emit(kernelId);
  }

  /** The lists the side panel shows may have changed: fetch them while it shows them. */
  private _afterOperation(): void {
    if (this._listsActive) {
      void this._lists.refresh();
    }
  }

  private _setKernelsError(error: string | null): void {
    if (error !== this._kernelsError) {
      this._kernelsError = error;
      this._changed.emit();
    }
  }

  private _onKernelChanged(_: KernelStore, change: IKernelTransition): void {
    this._kernelChanged.emit(change);
    this._changed.emit();
    this._poller.pace();
  }

  /** One poll: every kernel (and the lists while the side panel shows them). */
  private async _tick(): Promise<void> {
    // Watched kernels the list does not have yet (just started) are
    // fetched one by one.
    const unknown = [...this._watched].filter(k => !this._store.get(k));
    await Promise.allSettled([
      this._listsActive ? this.refreshLists() : this.refreshKernels(),
      ...unknown.map(k => this.refreshKernel(k))
    ]);
  }

  private readonly _store = new KernelStore();
  private readonly _lists: ServerLists;
  private readonly _poller: Poller;
  private _available: boolean | null = null;
  private _kernelsError: string | null = null;
  private _listsActive = false;
  private _watched = new Set<string>();
  private _isDisposed = false;
  private readonly _kernelChanged = new Signal<this, IKernelTransition>(this);
  private readonly _busyChanged = new Signal<this, string>(this);
  private readonly _changed = new Signal<this, void>(this);
}

export namespace GpucrModel {
  export interface IOptions {
    /** Hours the server keeps a shut down kernel's saved state in the trash. */
    trashHours: number;
    client?: GpucrClient;
    serverSettings?: ServerConnection.ISettings;
    /** Poll interval in milliseconds. */
    pollInterval?: number;
  }
}
