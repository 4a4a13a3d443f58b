/**
 * The kernel states the views show, and the rules that decide which answer
 * wins when a kernel's state reaches the browser three ways: an event of the
 * server's event bus, the reply to a POST this browser sent (both the whole
 * state, applied as they come), and a poll (the fallback).
 *
 * - A poll asked before the kernel's last event or reply is older than it,
 *   however late it is answered: dropped (`PollOrder`).
 * - Nothing is guessed: every state shown is one the server said. A failed
 *   operation's message goes into the first state the server says once the
 *   operation is over, unless that state has an error of its own.
 *
 * Synchronous and without I/O: `GpucrModel` sends the requests and hands the
 * answers here. Unit-tested in src/__tests__/store.test.ts.
 */
import type { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { fullState, isTransient, stateChanged, stateFromEvent } from './state';
import type { IKernelState, IKernelStateEvent } from './types';

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
   * This browser starts an operation (its buttons are disabled until `end`);
   * the server's events say what it does.
   *
   * @throws Error while another operation on the kernel is in flight
   */
  begin(kernelId: string, operation: Operation): void {
    if (this._inflight.has(kernelId)) {
      throw new Error('An operation on this kernel is already in progress.');
    }
    this._inflight.set(kernelId, operation);
  }

  /** The operation's POST was answered or failed. */
  end(kernelId: string): void {
    this._inflight.delete(kernelId);
  }

  /**
   * The reply to a POST of this browser that answers once the operation is
   * over: the server's state, applied as it is; polls asked before it are
   * older.
   */
  applyReply(kernelId: string, state: IKernelState): IKernelState {
    this._order.told(kernelId);
    this._set(kernelId, fullState(kernelId, state));
    return this._kernels.get(kernelId)!;
  }

  /**
   * The operation failed with `message` (and the server's `hint`). The
   * server says what became of the kernel (its failure event, a poll); the
   * first state it says once the operation is over (not suspending or
   * restoring) gets the message, unless it has an error of its own.
   */
  applyFailure(kernelId: string, message: string, hint: string | null): void {
    this._failures.set(kernelId, { message, hint });
    const current = this._kernels.get(kernelId);
    if (current) {
      this._set(kernelId, current);
    }
  }

  /** A poll is about to be sent: give the number to `applyPolled` with its answer. */
  ask(): number {
    return this._order.ask();
  }

  /**
   * A poll's answer for one kernel, asked as `asked` (also the reply of a
   * POST answered before its operation is over: a restore ahead).
   */
  applyPolled(kernelId: string, state: IKernelState, asked: number): void {
    if (!this._order.isStale(kernelId, asked)) {
      this._set(kernelId, fullState(kernelId, state));
    }
  }

  /** A poll found no such kernel (404). */
  applyGone(kernelId: string, asked: number): void {
    if (!this._order.isStale(kernelId, asked)) {
      this._set(kernelId, undefined);
    }
  }

  /** A poll's answer for every kernel: a known kernel it lacks is gone. */
  applyList(states: ReadonlyArray<IKernelState>, asked: number): void {
    const seen = new Set<string>();
    for (const state of states) {
      seen.add(state.kernel_id);
      this.applyPolled(state.kernel_id, state, asked);
    }
    for (const kernelId of [...this._kernels.keys()]) {
      if (!seen.has(kernelId) && !this._order.isStale(kernelId, asked)) {
        this._set(kernelId, undefined);
      }
    }
  }

  /** An event of the server's event bus: the kernel's whole state, applied as it comes. */
  applyEvent(event: IKernelStateEvent): void {
    this._order.told(event.kernel_id);
    this._set(
      event.kernel_id,
      stateFromEvent(this._kernels.get(event.kernel_id), event)
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

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    Signal.clearData(this);
  }

  private _set(kernelId: string, next: IKernelState | undefined): void {
    const previous = this._kernels.get(kernelId);
    next = this._withFailure(kernelId, next);
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
   * The first state once a failed operation is over carries its message,
   * unless the server put an error of its own into it.
   */
  private _withFailure(
    kernelId: string,
    next: IKernelState | undefined
  ): IKernelState | undefined {
    const failure = this._failures.get(kernelId);
    if (!failure || (next && isTransient(next.state))) {
      return next;
    }
    this._failures.delete(kernelId);
    if (!next || next.error) {
      return next;
    }
    return {
      ...next,
      error: failure.message,
      hint: next.hint || failure.hint || null
    };
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
  /** Failed operations whose message waits for the state after them. */
  private _failures = new Map<
    string,
    { message: string; hint: string | null }
  >();
  /** Kernels coming back from the trash: their checkpoint id once known. */
  private _fromTrash = new Map<string, string | null | undefined>();
  private _order = new PollOrder();
  private _isDisposed = false;
  private _changed = new Signal<this, IKernelTransition>(this);
}

/**
 * Orders polls against events and replies. A poll answered after an event
 * may have been asked before it, and would then put back an older state (a
 * status bar going restoring → suspended → restoring). A logical clock: each
 * poll takes a number when it is asked, each event or reply one when it is
 * applied.
 */
export class PollOrder {
  /** A poll is about to be asked; give the number to `isStale` with its answer. */
  ask(): number {
    return ++this._clock;
  }

  /** The server told the kernel's state as it is now (an event, a POST reply). */
  told(kernelId: string): void {
    this._told.set(kernelId, ++this._clock);
  }

  /** Whether the answer of the poll asked as `asked` predates what the server last told of the kernel. */
  isStale(kernelId: string, asked: number): boolean {
    return (this._told.get(kernelId) ?? 0) > asked;
  }

  private _clock = 0;
  private _told = new Map<string, number>();
}
