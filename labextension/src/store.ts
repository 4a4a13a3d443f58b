/**
 * The kernel states the views show, and the rules that decide which answer
 * wins when a kernel's state reaches the browser three ways: the reply to a
 * POST this browser sent, an event of the server's event bus, and a poll.
 *
 * - A poll asked before the kernel's last event is older than that event,
 *   however late it is answered: dropped (`PollOrder`).
 * - While this browser's suspend or resume is in flight, its POST reply
 *   decides the final state: a poll saying anything but `suspending` or
 *   `restoring` is dropped (it raced the POST); events are applied.
 * - The POST reply is applied when it comes, whatever came before it.
 * - A local `restoring` guess (a cell run in a suspended kernel) survives
 *   polls that still say `suspended` for `RESTORE_GRACE_MS`; an event, a
 *   poll saying anything else, or the end of the grace ends it.
 *
 * Synchronous and without I/O: `GpucrModel` sends the requests and hands the
 * answers here. Unit-tested in src/__tests__/store.test.ts.
 */
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { emptyState, isTransient, mergeEvent, stateChanged } from './state';
import type { IKernelState, IKernelStateEvent, KernelStateName } from './types';

/** How long a local `restoring` guess survives polls that still say `suspended`. */
export const RESTORE_GRACE_MS = 15000;

/** An operation this browser runs on a kernel. */
export type Operation = 'suspend' | 'resume';

/** A change of one kernel's state. */
export interface IKernelTransition {
  kernelId: string;
  previous: IKernelState | undefined;
  current: IKernelState | undefined;
  /**
   * The kernel is coming back from the trash (`KernelStore.expectFromTrash`),
   * or stays suspended in the checkpoint it came back in: its checkpoint
   * becoming known is not a suspend that just finished.
   */
  fromTrash?: boolean;
}

export class KernelStore implements IDisposable {
  /** `clock` gives the time in milliseconds (`Date.now`). */
  constructor(private readonly _clock: () => number = Date.now) {}

  /** Emitted when one kernel's state changes, from any source. */
  get changed(): ISignal<this, IKernelTransition> {
    return this._changed;
  }

  /** Known kernel states by kernel id. */
  get kernels(): ReadonlyMap<string, IKernelState> {
    return this._kernels;
  }

  get(kernelId: string): IKernelState | undefined {
    return this._kernels.get(kernelId);
  }

  /** Whether an operation started from this browser is in flight. */
  isBusy(kernelId: string): boolean {
    return this._inflight.has(kernelId);
  }

  /** Whether some kernel is suspending or restoring. */
  get anyTransient(): boolean {
    return [...this._kernels.values()].some(k => isTransient(k.state));
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /**
   * This browser starts an operation: `shown` (`suspending`, `restoring`)
   * is shown at once unless null. Returns the state before.
   *
   * @throws Error while another operation on the kernel is in flight
   */
  begin(
    kernelId: string,
    operation: Operation,
    shown: KernelStateName | null
  ): IKernelState | undefined {
    if (this._inflight.has(kernelId)) {
      throw new Error('An operation on this kernel is already in progress.');
    }
    this._inflight.set(kernelId, operation);
    const previous = this._kernels.get(kernelId);
    if (shown) {
      this._set(kernelId, {
        ...(previous ?? emptyState(kernelId)),
        state: shown,
        progress: null,
        error: null
      });
    }
    return previous;
  }

  /** The operation's POST was answered or failed: polls count again. */
  end(kernelId: string): void {
    this._inflight.delete(kernelId);
  }

  /** The reply to a POST of this browser: the server's state, applied as it is. */
  applyReply(kernelId: string, state: IKernelState): IKernelState {
    this._set(kernelId, normalize(kernelId, state));
    return this._kernels.get(kernelId)!;
  }

  /** The server refused the operation before starting it: show the state from before. */
  putBack(kernelId: string, previous: IKernelState | undefined): void {
    if (previous) {
      this._set(kernelId, previous);
    }
  }

  /**
   * The operation failed. `fetched`: the state the server has now, if it
   * could be asked, else the last known one in `fallback` (the state the
   * kernel stays in). Unless the state carries an error of its own (or a new
   * operation runs), the failure's message and hint go into it.
   */
  applyFailure(
    kernelId: string,
    fetched: IKernelState | undefined,
    fallback: 'running' | 'suspended',
    message: string,
    hint: string | null
  ): void {
    const previous = this._kernels.get(kernelId);
    const base = fetched
      ? normalize(kernelId, fetched)
      : {
          ...(previous ?? emptyState(kernelId)),
          state: fallback,
          progress: null
        };
    if (!base.error && !isTransient(base.state)) {
      base.error = message;
      if (hint && !base.hint) {
        base.hint = hint;
      }
    }
    this._set(kernelId, base);
  }

  /** A poll is about to be sent: give the number to `applyPolled` with its answer. */
  ask(): number {
    return this._order.ask();
  }

  /** A poll's answer for one kernel, asked as `asked`. */
  applyPolled(kernelId: string, state: IKernelState, asked: number): void {
    if (this._order.isStale(kernelId, asked)) {
      return;
    }
    const normalized = normalize(kernelId, state);
    if (this._inflight.has(kernelId) && !isTransient(normalized.state)) {
      return;
    }
    const guess = this._restoreGuess.get(kernelId);
    if (guess !== undefined) {
      if (
        normalized.state === 'suspended' &&
        !normalized.error &&
        this._clock() < guess
      ) {
        return;
      }
      this._restoreGuess.delete(kernelId);
    }
    this._set(kernelId, normalized);
  }

  /** A poll found no such kernel (404). */
  applyGone(kernelId: string, asked: number): void {
    if (!this._order.isStale(kernelId, asked)) {
      this._set(kernelId, undefined);
    }
  }

  /**
   * A poll's answer for every kernel: a known kernel it lacks is gone,
   * unless an operation of this browser runs on it.
   */
  applyList(states: ReadonlyArray<IKernelState>, asked: number): void {
    const seen = new Set<string>();
    for (const state of states) {
      seen.add(state.kernel_id);
      this.applyPolled(state.kernel_id, state, asked);
    }
    for (const kernelId of [...this._kernels.keys()]) {
      if (
        !seen.has(kernelId) &&
        !this._inflight.has(kernelId) &&
        !this._order.isStale(kernelId, asked)
      ) {
        this._set(kernelId, undefined);
      }
    }
  }

  /** An event of the server's event bus, merged into the last known state. */
  applyEvent(event: IKernelStateEvent): void {
    this._order.event(event.kernel_id);
    this._restoreGuess.delete(event.kernel_id);
    this._set(
      event.kernel_id,
      mergeEvent(this._kernels.get(event.kernel_id), event)
    );
  }

  /**
   * This browser asks the server to bring `kernelId` back from the trash: it
   * is listed again, suspended in the checkpoint it went to the trash with.
   * Its event, the POST reply and polls may come in any order; until its
   * checkpoint is known its changes are marked `fromTrash`, and while it
   * stays suspended in that checkpoint its age is the checkpoint's time
   * (`suspended_at` = the checkpoint's `created`), not the time it came back.
   */
  expectFromTrash(kernelId: string): void {
    this._fromTrash.set(kernelId, null);
  }

  /** The trash restore of `kernelId` failed: nothing comes back. */
  cancelFromTrash(kernelId: string): void {
    if (this._fromTrash.get(kernelId) === null) {
      this._fromTrash.delete(kernelId);
    }
  }

  /**
   * The transparent path: the user ran a cell in (or reconnected to) a
   * suspended kernel, so the server is restoring it. Show `restoring` now
   * and keep it against polls that raced the server.
   */
  markRestoring(kernelId: string): void {
    const current = this._kernels.get(kernelId);
    if (!current || current.state !== 'suspended') {
      return;
    }
    this._restoreGuess.set(kernelId, this._clock() + RESTORE_GRACE_MS);
    this._set(kernelId, {
      ...current,
      state: 'restoring',
      progress: null,
      error: null
    });
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    Signal.clearData(this);
  }

  private _set(kernelId: string, next: IKernelState | undefined): void {
    const previous = this._kernels.get(kernelId);
    let fromTrash = false;
    if (this._fromTrash.has(kernelId)) {
      next = this._trashAge(kernelId, next);
      fromTrash = this._fromTrash.get(kernelId) !== undefined;
      if (!fromTrash) {
        this._fromTrash.delete(kernelId);
      }
    }
    if (!stateChanged(previous, next)) {
      return;
    }
    if (next) {
      this._kernels.set(kernelId, next);
    } else {
      this._kernels.delete(kernelId);
    }
    this._changed.emit({
      kernelId,
      previous,
      current: next,
      ...(fromTrash ? { fromTrash: true } : {})
    });
  }

  /**
   * A state of a kernel coming back from the trash: remember its checkpoint
   * once known, and date it by that checkpoint. Once it leaves that
   * checkpoint (restored, suspended again, gone) the mark ends (set to
   * undefined; `_set` deletes it).
   */
  private _trashAge(
    kernelId: string,
    next: IKernelState | undefined
  ): IKernelState | undefined {
    const known = this._fromTrash.get(kernelId);
    const onDisk =
      !!next && (next.state === 'suspended' || next.state === 'uploading');
    const id = onDisk ? (next?.checkpoint?.id ?? null) : null;
    if (known === null) {
      // Not listed again yet (a poll of the kernel a restart started under
      // its id, or its 404, may come first): wait for its checkpoint.
      if (!id) {
        return next;
      }
      this._fromTrash.set(kernelId, id);
    } else if (!onDisk || (id && id !== known)) {
      this._fromTrash.set(kernelId, undefined);
      return next;
    }
    const created = next?.checkpoint?.created;
    return next && created !== undefined && created !== null
      ? { ...next, suspended_at: created }
      : next;
  }

  private _kernels = new Map<string, IKernelState>();
  private _inflight = new Map<string, Operation>();
  private _restoreGuess = new Map<string, number>();
  /** Kernels coming back from the trash: their checkpoint id once known. */
  private _fromTrash = new Map<string, string | null | undefined>();
  private _order = new PollOrder();
  private _isDisposed = false;
  private _changed = new Signal<this, IKernelTransition>(this);
}

/**
 * Orders polls and events. A poll answered after an event may have been
 * asked before it, and would then put back an older state (a status bar
 * going restoring → suspended → restoring). A logical clock: each poll takes
 * a number when it is asked, each event one when it is applied.
 */
export class PollOrder {
  /** A poll is about to be asked; give the number to `isStale` with its answer. */
  ask(): number {
    return ++this._clock;
  }

  /** An event for the kernel was applied. */
  event(kernelId: string): void {
    this._events.set(kernelId, ++this._clock);
  }

  /** Whether the answer of the poll asked as `asked` predates the kernel's last event. */
  isStale(kernelId: string, asked: number): boolean {
    return (this._events.get(kernelId) ?? 0) > asked;
  }

  private _clock = 0;
  private _events = new Map<string, number>();
}

/** Fill in the optional fields so that states compare reliably. */
function normalize(kernelId: string, state: IKernelState): IKernelState {
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
    summary: state.summary || null,
    retryable: state.retryable ?? null,
    room: state.room ?? null,
    made_room_for: state.made_room_for ?? null,
    ahead: state.ahead ?? false,
    trim: state.trim ?? null,
    timings: state.timings ?? null
  };
}
