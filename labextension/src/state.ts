/**
 * Kernel state logic, apart from any widget and any words: how an event
 * updates a state, what can be done in a state, which transition happened
 * (messages.ts says it in words), and how the side panel groups kernels and
 * checkpoints.
 *
 * Pure functions, unit-tested in src/__tests__/state.test.ts.
 */
import { parseTime } from './format';
import type {
  ICheckpoint,
  IKernelState,
  IKernelStateEvent,
  KernelStateName
} from './types';

/** A kernel state with nothing known yet but its id and state. */
export function emptyState(
  kernelId: string,
  state: KernelStateName = 'running'
): IKernelState {
  return {
    kernel_id: kernelId,
    state,
    kind: 'cpu',
    engine: null,
    engine_reason: null,
    checkpoint: null,
    gpu: null,
    progress: null,
    notebook_path: null,
    suspended_at: null,
    pending_since: null,
    restored_at: null,
    suspended_for: null,
    lost: [],
    warnings: [],
    error: null,
    hint: null,
    summary: null,
    retryable: null,
    trim: null,
    timings: null
  };
}

/**
 * States in which an operation is in flight (the UI polls fast): moving to
 * disk or back, waiting for room before a restore, uploading to the store.
 */
export function isTransient(
  state: KernelStateName | null | undefined
): boolean {
  return (
    state === 'suspending' ||
    state === 'restoring' ||
    state === 'waiting-for-room' ||
    state === 'uploading'
  );
}

/** Whether a kernel in this state can be suspended. */
export function canSuspend(state: IKernelState | null | undefined): boolean {
  return !!state && state.state === 'running';
}

/** Whether a kernel in this state can be resumed. */
export function canResume(state: IKernelState | null | undefined): boolean {
  return !!state && state.state === 'suspended';
}

/** Whether a kernel's saved state goes to the trash when it is shut down. */
export function isOnDisk(state: IKernelState | null | undefined): boolean {
  return (
    state?.state === 'suspended' ||
    state?.state === 'suspending' ||
    state?.state === 'uploading'
  );
}

/**
 * Apply a kernel-state event to the last known state of that kernel.
 *
 * Progress is taken from the event while an operation runs and dropped when
 * it ends; the restore fields and the notebook path are taken when the event
 * has them; everything else (GPU, checkpoint) is kept until the next poll
 * brings the full state.
 */
export function mergeEvent(
  previous: IKernelState | undefined,
  event: IKernelStateEvent
): IKernelState {
  const base: IKernelState =
    previous ?? emptyState(event.kernel_id, event.state);
  const transient = isTransient(event.state);
  const hasProgress =
    typeof event.bytes_done === 'number' ||
    typeof event.bytes_total === 'number' ||
    (transient && !!event.phase);
  const next: IKernelState = {
    ...base,
    state: event.state,
    progress:
      transient && hasProgress
        ? {
            phase: event.phase ?? base.progress?.phase ?? null,
            bytes_done: event.bytes_done ?? null,
            bytes_total: event.bytes_total ?? base.progress?.bytes_total ?? null
          }
        : transient
          ? base.progress
          : null
  };
  if (event.notebook_path) {
    next.notebook_path = event.notebook_path;
  }
  if (event.restored_at !== undefined) {
    next.restored_at = event.restored_at;
  }
  if (event.suspended_for !== undefined) {
    next.suspended_for = event.suspended_for;
  }
  if (event.lost !== undefined) {
    next.lost = event.lost;
  }
  if (event.room !== undefined) {
    next.room = event.room;
  }
  if (event.ahead !== undefined) {
    next.ahead = event.ahead;
  }
  if (event.made_room_for !== undefined) {
    next.made_room_for = event.made_room_for;
  }
  if (event.error) {
    next.error = event.error;
    next.hint =
      event.hint ?? (event.error !== base.error ? null : (base.hint ?? null));
    const same = event.error === base.error;
    next.summary =
      event.summary !== undefined
        ? event.summary || null
        : same
          ? (base.summary ?? null)
          : null;
    next.retryable =
      event.retryable !== undefined
        ? event.retryable
        : same
          ? (base.retryable ?? null)
          : null;
  } else if (
    event.error !== undefined ||
    (transient && base.state !== event.state)
  ) {
    // The server sends "" or null for "no error"; a new operation also
    // clears the error of the last one.
    next.error = null;
    next.hint = null;
    next.summary = null;
    next.retryable = null;
  }
  if (event.state === 'running') {
    next.suspended_at = null;
    next.pending_since = null;
  }
  if (event.state === 'suspended') {
    next.gpu = null;
    next.pending_since = null;
  }
  return next;
}

/**
 * Whether a kernel message is the refusal of a suspended kernel to start
 * its debugger (gpucr answers `initialize` from disk with success false).
 */
export function isDebuggerRefusal(msg: {
  header: { msg_type: string };
  content: unknown;
}): boolean {
  const content = msg.content as { command?: string; success?: boolean };
  return (
    msg.header.msg_type === 'debug_reply' &&
    content.command === 'initialize' &&
    content.success === false
  );
}

function timesDiffer(a: unknown, b: unknown): boolean {
  const ta = parseTime((a as string | number | null | undefined) ?? null);
  const tb = parseTime((b as string | number | null | undefined) ?? null);
  return (ta?.getTime() ?? 0) !== (tb?.getTime() ?? 0);
}

/**
 * What happened between two states of a kernel that deserves a notification
 * (messages.ts: `transitionNotice` says it).
 */
export type Transition =
  /** The suspend failed; the kernel keeps running. */
  | 'suspend-failed'
  /** The restore failed; the saved state is kept. */
  | 'restore-failed'
  /** A suspend finished and its new checkpoint is known. */
  | 'suspended'
  /** The kernel is suspended once its cell finishes. */
  | 'pending'
  /** The pending suspend was cancelled. */
  | 'pending-cancelled'
  /** The kernel came back from disk. */
  | 'restored'
  /** The suspended kernel was restarted instead of restored. */
  | 'restarted';

/**
 * Which transition, if any, a kernel made from `previous` to `current`.
 * The first observation of a kernel (`previous` undefined) is none.
 */
export function transitionOf(
  previous: IKernelState | undefined,
  current: IKernelState
): Transition | null {
  if (!previous) {
    return null;
  }
  const error = current.error ? current.error.trim() : '';
  if (error && error !== (previous.error ?? '').trim()) {
    if (current.state === 'running') {
      return 'suspend-failed';
    }
    if (current.state === 'suspended') {
      return 'restore-failed';
    }
  }
  const was = previous.state;
  const now = current.state;
  const newCheckpoint =
    !!current.checkpoint?.id &&
    current.checkpoint.id !== previous.checkpoint?.id;
  if (now === 'suspended' && newCheckpoint && was !== 'restoring') {
    return 'suspended';
  }
  if (was === now) {
    return null;
  }
  if (now === 'suspend-pending' && was === 'running') {
    return 'pending';
  }
  if (now === 'running' && was === 'suspend-pending' && !error) {
    return 'pending-cancelled';
  }
  if (now === 'running' && (was === 'restoring' || was === 'suspended')) {
    if (
      current.restored_at &&
      timesDiffer(current.restored_at, previous.restored_at)
    ) {
      return 'restored';
    }
    if (!error) {
      return 'restarted';
    }
  }
  return null;
}

/** Whether two states differ in anything the user can see. */
export function stateChanged(
  a: IKernelState | undefined,
  b: IKernelState | undefined
): boolean {
  return JSON.stringify(a ?? null) !== JSON.stringify(b ?? null);
}

/** The side panel's groups. */
export interface IPanelGroups {
  /** Kernels not plainly running (pending, suspending, suspended, restoring). */
  kernels: Array<{ state: IKernelState; checkpoint: ICheckpoint | null }>;
  /** Checkpoints no kernel is suspended in (old ones, or of kernels gone). */
  checkpoints: ICheckpoint[];
}

/**
 * One row per suspended (or otherwise not plainly running) kernel with its
 * checkpoint; the other checkpoints apart.
 */
export function groupForPanel(
  kernels: Iterable<IKernelState>,
  checkpoints: ReadonlyArray<ICheckpoint>
): IPanelGroups {
  const rows: IPanelGroups['kernels'] = [];
  const used = new Set<string>();
  for (const state of kernels) {
    if (state.state === 'running') {
      continue;
    }
    const id = state.checkpoint?.id;
    const checkpoint =
      (state.state === 'suspended' || state.state === 'restoring') && id
        ? (checkpoints.find(c => c.id === id) ?? null)
        : null;
    if (checkpoint) {
      used.add(checkpoint.id);
    }
    rows.push({ state, checkpoint });
  }
  return {
    kernels: rows,
    checkpoints: checkpoints.filter(c => !used.has(c.id))
  };
}
