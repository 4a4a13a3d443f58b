/**
 * The model: REST calls to the gpucr server extension and the client-side
 * store of kernel states, checkpoints and GPUs that the views render.
 *
 * Views never call the server themselves; they read this model and listen to
 * its signals.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { timeValue } from './format';
import {
  emptyState,
  isTransient,
  mergeEvent,
  PollOrder,
  stateChanged
} from './state';
import {
  ICheckpoint,
  IDoctorReport,
  IGpu,
  IKernelState,
  IKernelStateEvent,
  ITrashItem,
  KERNEL_STATE_SCHEMA,
  SuspendWhen
} from './types';

export * from './types';

/** The URL prefix of the REST API, relative to the server's base URL. */
export const API_PREFIX = 'api/gpucr';

/** An error answer of the REST API, with its HTTP status. */
export class GpucrRequestError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly reason: string | null = null,
    readonly body: { [key: string]: unknown } | null = null
  ) {
    super(message);
    this.name = 'GpucrRequestError';
  }

  /** Whether the server refused a suspend because the kernel runs a cell. */
  get isBusy(): boolean {
    return this.status === 409 && this.body?.error === 'KernelBusyError';
  }

  /** Whether a trashed kernel's id is taken by the fresh kernel of a restart. */
  get isReplaced(): boolean {
    return this.status === 409 && this.body?.error === 'KernelReplacedError';
  }
}

/**
 * Call the gpucr REST API.
 *
 * @param endPoint path under `/api/gpucr/`, already URL-encoded
 * @param init request options (method, body)
 * @param settings server connection settings (token, XSRF, base URL)
 * @returns the decoded JSON answer, `undefined` for 204
 * @throws GpucrRequestError with the server's message on an HTTP error
 */
export async function requestAPI<T>(
  endPoint = '',
  init: RequestInit = {},
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, API_PREFIX, endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  if (response.status === 204) {
    return undefined as T;
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // Not JSON (e.g. tornado's HTML 404 page): keep the text.
    }
  }
  if (!response.ok) {
    let message =
      (data && typeof data === 'object' && (data.message || data.reason)) || '';
    if (!message) {
      message =
        response.status === 404 && typeof data === 'string'
          ? 'Not found (is the jupyter_gpucr server extension enabled?)'
          : response.statusText || `HTTP ${response.status}`;
    }
    // jupyter_server writes {"message", "reason"}; gpucr adds "hint" (what to do).
    const hint =
      data && typeof data === 'object'
        ? data.hint || data.reason || null
        : null;
    throw new GpucrRequestError(
      String(message),
      response.status,
      hint ? String(hint) : null,
      data && typeof data === 'object' ? data : null
    );
  }
  return data as T;
}

function id(value: string): string {
  return encodeURIComponent(value);
}

/** Thin typed client of the REST API (docs/rest-api.md). */
export class GpucrClient {
  constructor(
    readonly serverSettings: ServerConnection.ISettings = ServerConnection.makeSettings()
  ) {}

  listKernels(): Promise<IKernelState[]> {
    return requestAPI<IKernelState[]>('kernels', {}, this.serverSettings);
  }

  getKernel(kernelId: string): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}`,
      {},
      this.serverSettings
    );
  }

  suspend(
    kernelId: string,
    options: GpucrClient.ISuspendOptions = {}
  ): Promise<IKernelState> {
    const body: GpucrClient.ISuspendOptions = {};
    if (options.engine) {
      body.engine = options.engine;
    }
    if (options.when) {
      body.when = options.when;
    }
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}/suspend`,
      { method: 'POST', body: JSON.stringify(body) },
      this.serverSettings
    );
  }

  /** Cancel a pending suspend (`suspend-pending`). */
  cancelSuspend(kernelId: string): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}/suspend`,
      { method: 'DELETE' },
      this.serverSettings
    );
  }

  resume(kernelId: string, gpu?: string | number): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `kernels/${id(kernelId)}/resume`,
      {
        method: 'POST',
        body: JSON.stringify(gpu !== undefined ? { gpu: String(gpu) } : {})
      },
      this.serverSettings
    );
  }

  listCheckpoints(): Promise<ICheckpoint[]> {
    return requestAPI<ICheckpoint[]>('checkpoints', {}, this.serverSettings);
  }

  deleteCheckpoint(checkpointId: string): Promise<void> {
    return requestAPI<void>(
      `checkpoints/${id(checkpointId)}`,
      { method: 'DELETE' },
      this.serverSettings
    );
  }

  listTrash(): Promise<ITrashItem[]> {
    return requestAPI<ITrashItem[]>('trash', {}, this.serverSettings);
  }

  /** Put a trashed checkpoint back: its kernel is suspended again. */
  restoreTrash(
    trashId: string,
    options: GpucrClient.IRestoreOptions = {}
  ): Promise<IKernelState> {
    return requestAPI<IKernelState>(
      `trash/${id(trashId)}/restore`,
      { method: 'POST', body: JSON.stringify(options) },
      this.serverSettings
    );
  }

  deleteTrash(trashId: string): Promise<void> {
    return requestAPI<void>(
      `trash/${id(trashId)}`,
      { method: 'DELETE' },
      this.serverSettings
    );
  }

  listGpus(): Promise<IGpu[]> {
    return requestAPI<IGpu[]>('gpus', {}, this.serverSettings);
  }

  doctor(): Promise<IDoctorReport> {
    return requestAPI<IDoctorReport>('doctor', {}, this.serverSettings);
  }
}

export namespace GpucrClient {
  /** The body of `POST /api/gpucr/kernels/{id}/suspend`. */
  export interface ISuspendOptions {
    engine?: string;
    when?: SuspendWhen;
  }

  /** The body of `POST /api/gpucr/trash/{id}/restore`. */
  export interface IRestoreOptions {
    /** Shut down the kernel that runs under the same id (a restart's fresh one) first. */
    replace?: boolean;
    /**
     * Give the kernel its notebook sessions back (default); false when this
     * client connects the notebook it has open itself.
     */
    sessions?: boolean;
  }
}

/** A change of one kernel's state in the model. */
export interface IKernelTransition {
  kernelId: string;
  previous: IKernelState | undefined;
  current: IKernelState | undefined;
}

/** How long a local "restoring" guess survives polls that still say "suspended". */
const RESTORE_GRACE_MS = 15000;
/** Poll interval while an operation is in flight. */
const FAST_POLL_MS = 1000;
/** How often the views' shared clock (`GpucrModel.now`) advances. */
const CLOCK_MS = 15000;

/**
 * The client-side store: kernel states (polled for the kernels the UI shows
 * and updated from the event bus), checkpoints and GPUs (polled while the
 * side panel is visible).
 */
export class GpucrModel implements IDisposable {
  constructor(options: GpucrModel.IOptions = {}) {
    this.client = options.client ?? new GpucrClient(options.serverSettings);
    this._pollInterval = options.pollInterval ?? 3000;
    this._clock = setInterval(() => {
      this._now = new Date();
      this._ticked.emit();
    }, CLOCK_MS);
  }

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

  /** The REST client. */
  readonly client: GpucrClient;

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
    return this._kernels;
  }

  getKernel(kernelId: string | null | undefined): IKernelState | undefined {
    return kernelId ? this._kernels.get(kernelId) : undefined;
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
    this._schedule();
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Whether an operation started from this browser is in flight. */
  isBusy(kernelId: string): boolean {
    return this._inflight.has(kernelId);
  }

  /** Set the kernels to poll (the current notebook's, for the status bar). */
  watchKernels(kernelIds: Iterable<string>): void {
    const next = new Set(kernelIds);
    const added = [...next].filter(k => !this._watched.has(k));
    this._watched = next;
    for (const k of added) {
      void this.refreshKernel(k);
    }
    this._schedule();
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
    this._schedule();
  }

  /** Fetch one kernel's state now. */
  async refreshKernel(kernelId: string): Promise<IKernelState | undefined> {
    const asked = this._order.ask();
    try {
      const state = await this.client.getKernel(kernelId);
      this._available = true;
      this._applyPolled(kernelId, state, asked);
    } catch (error) {
      if (
        error instanceof GpucrRequestError &&
        error.status === 404 &&
        !this._order.isStale(kernelId, asked)
      ) {
        this._setState(kernelId, undefined);
      }
      // Network errors: keep the last known state.
    }
    return this._kernels.get(kernelId);
  }

  /**
   * Fetch every kernel's state now (the status bar, the toolbar indicator and
   * the Running sidebar show them); returns the error, if any.
   */
  async refreshKernels(): Promise<string | null> {
    let states: IKernelState[];
    const asked = this._order.ask();
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
    const seen = new Set<string>();
    for (const state of states) {
      seen.add(state.kernel_id);
      this._applyPolled(state.kernel_id, state, asked);
    }
    for (const kernelId of [...this._kernels.keys()]) {
      if (
        !seen.has(kernelId) &&
        !this._inflight.has(kernelId) &&
        !this._order.isStale(kernelId, asked)
      ) {
        this._setState(kernelId, undefined);
      }
    }
    return null;
  }

  /** Fetch kernels, checkpoints, trash and GPUs now. */
  async refreshLists(): Promise<void> {
    const [kernels, checkpoints, gpus, trash] = await Promise.allSettled([
      this.refreshKernels(),
      this.client.listCheckpoints(),
      this.client.listGpus(),
      this.client.listTrash()
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
    if (this._inflight.has(kernelId)) {
      throw new Error('An operation on this kernel is already in progress.');
    }
    this._inflight.set(kernelId, 'suspend');
    const previous = this._kernels.get(kernelId);
    if (options.when !== 'idle') {
      this._setState(kernelId, {
        ...(previous ?? emptyState(kernelId)),
        state: 'suspending',
        progress: null,
        error: null
      });
    }
    this._schedule();
    try {
      const state = await this.client.suspend(kernelId, options);
      this._inflight.delete(kernelId);
      this._setState(kernelId, Private.normalize(kernelId, state));
      return this._kernels.get(kernelId)!;
    } catch (error) {
      this._inflight.delete(kernelId);
      if (error instanceof GpucrRequestError && error.isBusy) {
        if (previous) {
          this._setState(kernelId, previous);
        }
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
    this._setState(kernelId, Private.normalize(kernelId, state));
    this._afterOperation();
    return this._kernels.get(kernelId)!;
  }

  /** Put a trashed checkpoint back; its kernel is suspended again. */
  async restoreFromTrash(
    trashId: string,
    options: GpucrClient.IRestoreOptions = {}
  ): Promise<IKernelState> {
    const state = await this.client.restoreTrash(trashId, options);
    this._setState(state.kernel_id, Private.normalize(state.kernel_id, state));
    await this.refreshLists();
    return this._kernels.get(state.kernel_id)!;
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
    if (this._inflight.has(kernelId)) {
      throw new Error('An operation on this kernel is already in progress.');
    }
    this._inflight.set(kernelId, 'resume');
    const previous = this._kernels.get(kernelId);
    this._setState(kernelId, {
      ...(previous ?? emptyState(kernelId)),
      state: 'restoring',
      progress: null,
      error: null
    });
    this._schedule();
    try {
      const state = await this.client.resume(kernelId, gpu);
      this._inflight.delete(kernelId);
      this._setState(kernelId, Private.normalize(kernelId, state));
      return this._kernels.get(kernelId)!;
    } catch (error) {
      this._inflight.delete(kernelId);
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
    const current = this._kernels.get(kernelId);
    if (!current || current.state !== 'suspended') {
      return;
    }
    this._restoreGuess.set(kernelId, Date.now() + RESTORE_GRACE_MS);
    this._setState(kernelId, {
      ...current,
      state: 'restoring',
      progress: null,
      error: null
    });
    this._schedule();
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
    this._order.event(data.kernel_id);
    this._restoreGuess.delete(data.kernel_id);
    const previous = this._kernels.get(data.kernel_id);
    this._setState(data.kernel_id, mergeEvent(previous, data));
    if (!isTransient(data.state)) {
      // The event carries no size/GPU: fetch the full state.
      void this.refreshKernel(data.kernel_id);
      if (this._listsActive) {
        void this.refreshLists();
      }
    }
    this._schedule();
    return true;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    clearInterval(this._clock);
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    Signal.clearData(this);
  }

  private _applyPolled(
    kernelId: string,
    state: IKernelState,
    asked: number
  ): void {
    if (this._order.isStale(kernelId, asked)) {
      return; // an event told something newer meanwhile; the next poll follows
    }
    const normalized = Private.normalize(kernelId, state);
    const op = this._inflight.get(kernelId);
    if (op && !isTransient(normalized.state)) {
      // The POST in flight decides the final state; a poll that raced it
      // (still "running" before the server marked it "suspending") must not
      // flip the status bar back and forth.
      return;
    }
    const guess = this._restoreGuess.get(kernelId);
    if (guess !== undefined) {
      if (
        normalized.state === 'suspended' &&
        !normalized.error &&
        Date.now() < guess
      ) {
        return;
      }
      this._restoreGuess.delete(kernelId);
    }
    this._setState(kernelId, normalized);
  }

  private async _afterFailure(
    kernelId: string,
    fallback: 'running' | 'suspended',
    error: Error
  ): Promise<void> {
    let state: IKernelState | undefined;
    try {
      state = Private.normalize(
        kernelId,
        await this.client.getKernel(kernelId)
      );
    } catch {
      state = undefined;
    }
    const previous = this._kernels.get(kernelId);
    const base = state ?? {
      ...(previous ?? emptyState(kernelId)),
      state: fallback,
      progress: null
    };
    if (!base.error && !isTransient(base.state)) {
      base.error = error.message || String(error);
      if (error instanceof GpucrRequestError && error.reason && !base.hint) {
        base.hint = error.reason;
      }
    }
    this._setState(kernelId, base);
  }

  private _afterOperation(): void {
    this._schedule();
    if (this._listsActive) {
      void this.refreshLists();
    }
  }

  private _setState(kernelId: string, next: IKernelState | undefined): void {
    const previous = this._kernels.get(kernelId);
    if (!stateChanged(previous, next)) {
      return;
    }
    if (next) {
      this._kernels.set(kernelId, next);
    } else {
      this._kernels.delete(kernelId);
    }
    this._kernelChanged.emit({ kernelId, previous, current: next });
    this._changed.emit();
  }

  /** (Re)arm the poll timer: fast while an operation runs, else pollInterval. */
  private _schedule(): void {
    if (this._isDisposed) {
      return;
    }
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    const transient = [...this._kernels.values()].some(k =>
      isTransient(k.state)
    );
    const delay = transient ? FAST_POLL_MS : this._pollInterval;
    this._timer = setTimeout(() => {
      this._timer = null;
      void this._tick().finally(() => this._schedule());
    }, delay);
  }

  private async _tick(): Promise<void> {
    if (typeof document !== 'undefined' && document.hidden) {
      return;
    }
    // Watched kernels the list does not have yet (just started) are
    // fetched one by one.
    const unknown = [...this._watched].filter(k => !this._kernels.has(k));
    await Promise.allSettled([
      this._listsActive ? this.refreshLists() : this.refreshKernels(),
      ...unknown.map(k => this.refreshKernel(k))
    ]);
  }

  private _available: boolean | null = null;
  private _kernels = new Map<string, IKernelState>();
  private _checkpoints: ICheckpoint[] = [];
  private _trash: ITrashItem[] = [];
  private _gpus: IGpu[] = [];
  private _doctor: IDoctorReport | null = null;
  private _listError: string | null = null;
  private _listsLoaded = false;
  private _listsActive = false;
  private _watched = new Set<string>();
  private _inflight = new Map<string, 'suspend' | 'resume'>();
  private _restoreGuess = new Map<string, number>();
  private _order = new PollOrder();
  private _pollInterval: number;
  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _isDisposed = false;
  private _kernelChanged = new Signal<this, IKernelTransition>(this);
  private _changed = new Signal<this, void>(this);
  private _now = new Date();
  private _clock: ReturnType<typeof setInterval>;
  private _ticked = new Signal<this, void>(this);
}

export namespace GpucrModel {
  export interface IOptions {
    client?: GpucrClient;
    serverSettings?: ServerConnection.ISettings;
    /** Poll interval in milliseconds. */
    pollInterval?: number;
  }
}

namespace Private {
  /** Fill in the optional fields so that states compare reliably. */
  export function normalize(
    kernelId: string,
    state: IKernelState
  ): IKernelState {
    return {
      kernel_id: state.kernel_id ?? kernelId,
      state: state.state,
      kind: state.kind ?? 'cpu',
      engine: state.engine ?? null,
      engine_reason: state.engine_reason ?? null,
      checkpoint: state.checkpoint ?? null,
      gpu: state.gpu ?? null,
      progress: state.progress ?? null,
      notebook_path: state.notebook_path ?? null,
      suspended_at: state.suspended_at ?? null,
      pending_since: state.pending_since ?? null,
      restored_at: state.restored_at ?? null,
      suspended_for: state.suspended_for ?? null,
      lost: state.lost ?? [],
      warnings: state.warnings ?? [],
      error: state.error || null,
      hint: state.hint || null,
      trim: state.trim ?? null,
      timings: state.timings ?? null
    };
  }
}
