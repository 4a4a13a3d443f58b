/**
 * The model the views render: the kernel states (store.ts, kept current by
 * polls, events and the replies to this browser's operations), the
 * checkpoint, trash and GPU lists, what each GPU (and the host memory budget)
 * holds, and the operations themselves.
 *
 * Views never call the server themselves; they read this model and listen to
 * its signals. The requests go through the REST client (api.ts).
 */
import { ServerConnection } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { GpucrClient, GpucrRequestError } from './api';
import { timeValue } from './format';
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

/** Poll interval while a kernel is suspending or restoring. */
const FAST_POLL_MS = 1000;
/** How often the views' shared clock (`GpucrModel.now`) advances. */
const CLOCK_MS = 15000;

/**
 * The client-side store: kernel states (polled for the kernels the UI shows
 * and updated from the event bus), checkpoints and GPUs (polled while the
 * side panel is visible). Polls stand by while the page is hidden.
 */
export class GpucrModel implements IDisposable {
  constructor(options: GpucrModel.IOptions) {
    this.client = options.client ?? new GpucrClient(options.serverSettings);
    this.trashHours = options.trashHours;
    this._pollInterval = options.pollInterval ?? 3000;
    this._store.changed.connect(this._onKernelChanged, this);
    this._poll = new Poll({
      name: 'jupyter-gpucr:kernels',
      factory: () => this._tick(),
      frequency: {
        interval: this._pollInterval,
        backoff: false,
        max: Poll.MAX_INTERVAL
      },
      standby: 'when-hidden'
    });
    this._clock = setInterval(() => {
      this._now = new Date();
      this._ticked.emit();
    }, CLOCK_MS);
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
    return this._now;
  }

  /** Emitted when `now` advances: views showing ages render again. */
  get ticked(): ISignal<this, void> {
    return this._ticked;
  }

  /** Emitted when one kernel's state changes, from any source. */
  get kernelChanged(): ISignal<this, IKernelTransition> {
    return this._kernelChanged;
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
    return this._checkpoints;
  }

  /** Checkpoints of kernels shut down or restarted, newest first. */
  get trash(): ReadonlyArray<ITrashItem> {
    return this._trash;
  }

  get gpus(): ReadonlyArray<IGpu> {
    return this._gpus;
  }

  /** What each GPU (and the host memory budget) holds: `GET /api/gpucr/room`. */
  get room(): ReadonlyArray<IRoomPlace> {
    return this._room;
  }

  get doctor(): IDoctorReport | null {
    return this._doctor;
  }

  /** The error of the last list refresh, if it failed. */
  get listError(): string | null {
    return this._listError;
  }

  /** Whether the lists were fetched at least once. */
  get listsLoaded(): boolean {
    return this._listsLoaded;
  }

  /** Poll interval in milliseconds. */
  get pollInterval(): number {
    return this._pollInterval;
  }
  set pollInterval(value: number) {
    this._pollInterval = Math.max(500, value);
    this._pace();
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
   * the Running sidebar show them); returns the error, if any.
   */
  async refreshKernels(): Promise<string | null> {
    let states: IKernelState[];
    const asked = this._store.ask();
    try {
      states = await this.client.listKernels();
    } catch (error) {
      if (error instanceof GpucrRequestError && error.status === 404) {
        this._available = false;
      }
      return String((error as Error).message ?? error);
    }
    if (!Array.isArray(states)) {
      return null;
    }
    this._available = true;
    this._store.applyList(states, asked);
    return null;
  }

  /** Fetch kernels, checkpoints, trash, GPUs and what they hold now. */
  async refreshLists(): Promise<void> {
    const [kernels, checkpoints, gpus, trash, room] = await Promise.allSettled([
      this.refreshKernels(),
      this.client.listCheckpoints(),
      this.client.listGpus(),
      this.client.listTrash(),
      this.client.room()
    ]);
    const errors: string[] = [];
    if (kernels.status === 'fulfilled' && kernels.value) {
      errors.push(kernels.value);
    }
    if (
      checkpoints.status === 'fulfilled' &&
      Array.isArray(checkpoints.value)
    ) {
      this._checkpoints = [...checkpoints.value].sort(
        (a, b) => timeValue(b.created) - timeValue(a.created)
      );
    } else if (checkpoints.status === 'rejected') {
      errors.push(String((checkpoints.reason as Error).message));
    }
    if (trash.status === 'fulfilled' && Array.isArray(trash.value)) {
      this._trash = [...trash.value].sort(
        (a, b) => timeValue(b.trashed_at) - timeValue(a.trashed_at)
      );
    } else if (trash.status === 'rejected') {
      errors.push(String((trash.reason as Error).message));
    }
    if (gpus.status === 'fulfilled' && Array.isArray(gpus.value)) {
      this._gpus = gpus.value;
    } else if (gpus.status === 'rejected') {
      errors.push(String((gpus.reason as Error).message));
    }
    if (room.status === 'fulfilled' && Array.isArray(room.value)) {
      this._room = room.value;
    } else if (room.status === 'rejected') {
      errors.push(String((room.reason as Error).message));
    }
    const listError = errors.length ? [...new Set(errors)].join('; ') : null;
    this._listError = listError;
    this._listsLoaded = true;
    this._changed.emit();
  }

  /** Fetch the doctor report (what works on the server machine). */
  async refreshDoctor(): Promise<IDoctorReport | null> {
    try {
      this._doctor = await this.client.doctor();
    } catch (error) {
      this._doctor = {
        ok: false,
        checks: [
          {
            name: 'gpucr API',
            ok: false,
            detail: (error as Error).message,
            fix: 'Check that the jupyter_gpucr server extension is enabled: jupyter server extension list'
          }
        ]
      };
    }
    this._changed.emit();
    return this._doctor;
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
    const previous = this._store.begin(
      kernelId,
      'suspend',
      options.when === 'idle' ? null : 'suspending'
    );
    try {
      const state = await this.client.suspend(kernelId, options);
      this._store.end(kernelId);
      return this._store.applyReply(kernelId, state);
    } catch (error) {
      this._store.end(kernelId);
      if (error instanceof GpucrRequestError && error.isBusy) {
        this._store.putBack(kernelId, previous);
      } else {
        await this._afterFailure(kernelId, 'running', error as Error);
      }
      throw error;
    } finally {
      this._afterOperation();
    }
  }

  /** Cancel a pending suspend: the kernel keeps running. */
  async cancelSuspend(kernelId: string): Promise<IKernelState> {
    const state = await this.client.cancelSuspend(kernelId);
    const current = this._store.applyReply(kernelId, state);
    this._afterOperation();
    return current;
  }

  /** Put a trashed checkpoint back; its kernel is suspended again. */
  async restoreFromTrash(
    trashId: string,
    options: GpucrClient.IRestoreOptions = {}
  ): Promise<IKernelState> {
    // Its event may come before the reply: neither is a suspend that just finished.
    const kernelId = this._trash.find(t => t.id === trashId)?.kernel_id;
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
    this._trash = this._trash.filter(t => t.id !== trashId);
    this._changed.emit();
    await this.refreshLists();
  }

  /** Resume a suspended kernel (the server picks a GPU unless `gpu` is given). */
  async resume(kernelId: string, gpu?: string | number): Promise<IKernelState> {
    this._store.begin(kernelId, 'resume', 'restoring');
    try {
      const state = await this.client.resume(kernelId, gpu);
      this._store.end(kernelId);
      return this._store.applyReply(kernelId, state);
    } catch (error) {
      this._store.end(kernelId);
      await this._afterFailure(kernelId, 'suspended', error as Error);
      throw error;
    } finally {
      this._afterOperation();
    }
  }

  /** Delete a checkpoint and refresh the lists. */
  async deleteCheckpoint(checkpointId: string): Promise<void> {
    await this.client.deleteCheckpoint(checkpointId);
    this._checkpoints = this._checkpoints.filter(c => c.id !== checkpointId);
    this._changed.emit();
    await this.refreshLists();
  }

  /**
   * The transparent path: the user ran a cell in (or reconnected to) a
   * suspended kernel, so the server is restoring it. Show "restoring" right
   * away, poll fast, and do not let a poll that raced the server undo it.
   */
  markRestoring(kernelId: string): void {
    this._store.markRestoring(kernelId);
  }

  /**
   * Apply an event of the server's event bus. Other schemas are ignored.
   * Returns whether the event was for gpucr.
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
      // The event carries no size/GPU: fetch the full state.
      void this.refreshKernel(data.kernel_id);
      if (this._listsActive) {
        void this.refreshLists();
      }
    }
    return true;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    clearInterval(this._clock);
    this._poll.dispose();
    this._store.dispose();
    Signal.clearData(this);
  }

  /** A failed operation: the state the server has now, with the failure's message. */
  private async _afterFailure(
    kernelId: string,
    fallback: 'running' | 'suspended',
    error: Error
  ): Promise<void> {
    let fetched: IKernelState | undefined;
    try {
      fetched = await this.client.getKernel(kernelId);
    } catch {
      fetched = undefined;
    }
    const hint = error instanceof GpucrRequestError ? error.reason : null;
    this._store.applyFailure(
      kernelId,
      fetched,
      fallback,
      error.message || String(error),
      hint
    );
  }

  private _afterOperation(): void {
    if (this._listsActive) {
      void this.refreshLists();
    }
  }

  private _onKernelChanged(_: KernelStore, change: IKernelTransition): void {
    this._kernelChanged.emit(change);
    this._changed.emit();
    this._pace();
  }

  /**
   * Poll every second while a kernel is suspending or restoring, else every
   * `pollInterval`; a faster pace starts now, not after the slower interval.
   */
  private _pace(): void {
    if (this._isDisposed) {
      return;
    }
    const interval = this._store.anyTransient
      ? FAST_POLL_MS
      : this._pollInterval;
    const current = this._poll.frequency.interval;
    if (interval === current) {
      return;
    }
    this._poll.frequency = { ...this._poll.frequency, interval };
    if (interval < current) {
      void this._poll.schedule({ interval, phase: 'refreshed' });
    }
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

  private _store = new KernelStore();
  private _available: boolean | null = null;
  private _checkpoints: ICheckpoint[] = [];
  private _trash: ITrashItem[] = [];
  private _gpus: IGpu[] = [];
  private _room: IRoomPlace[] = [];
  private _doctor: IDoctorReport | null = null;
  private _listError: string | null = null;
  private _listsLoaded = false;
  private _listsActive = false;
  private _watched = new Set<string>();
  private _pollInterval: number;
  private _poll: Poll;
  private _isDisposed = false;
  private _kernelChanged = new Signal<this, IKernelTransition>(this);
  private _changed = new Signal<this, void>(this);
  private _now = new Date();
  private _clock: ReturnType<typeof setInterval>;
  private _ticked = new Signal<this, void>(this);
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
