/**
 * Kernel state logic, apart from any widget and any words: the state an
 * event says, what can be done in a state, which transition happened
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

/**
 * A kernel state with every property filled in (null, empty), so that states
 * from replies, events and polls compare reliably.
 */
export function fullState(kernelId: string, state: IKernelState): IKernelState {
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
    label: state.label ?? null,
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
 * The state an event says: the kernel's whole state as the server last set
 * it. What the server fills in only as `GET` answers, and the event therefore
 * may lack, is kept from the last known state: the notebook path (renames
 * followed), and the engine a suspend of a running kernel would use.
 */
export function stateFromEvent(
  previous: IKernelState | undefined,
  event: IKernelStateEvent
): IKernelState {
  const next = fullState(event.kernel_id, event);
  if (!next.notebook_path && previous?.notebook_path) {
    next.notebook_path = previous.notebook_path;
  }
  if (
    next.state === 'running' &&
    next.engine === null &&
    next.engine_reason === null &&
    previous
  ) {
    next.engine = previous.engine ?? null;
    next.engine_reason = previous.engine_reason ?? null;
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
