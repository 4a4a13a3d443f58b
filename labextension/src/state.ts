/**
 * Kernel state logic, apart from any widget: what the status bar says for a
 * state, how an event updates a state, which transitions deserve a
 * notification and what the user can do after a failure.
 *
 * Pure functions, unit-tested in src/__tests__/state.test.ts.
 */
import {
  basename,
  formatBytes,
  formatDate,
  formatProgress,
  formatSeconds,
  formatSince,
  truncate
} from './format';
import type { IKernelState, IKernelStateEvent, KernelStateName } from './types';

/** The visual kind of a status, used as a CSS modifier. */
export type StatusKind = 'gpu' | 'cpu' | 'busy' | 'suspended' | 'error';

/** What the status bar shows for one kernel. */
export interface IStatusDescription {
  /** Short text for the status bar. */
  label: string;
  /** Longer text for the tooltip. */
  title: string;
  /** CSS modifier. */
  kind: StatusKind;
}

/** States in which an operation is in flight. */
/** A kernel state with nothing known yet but its id and state. */
export function emptyState(
  kernelId: string,
  state: KernelStateName = 'running'
): IKernelState {
  return {
    kernel_id: kernelId,
    state,
    engine: null,
    checkpoint: null,
    gpu: null,
    progress: null,
    suspended_at: null,
    error: null,
    hint: null,
    timings: null
  };
}

export function isTransient(
  state: KernelStateName | null | undefined
): boolean {
  return state === 'suspending' || state === 'restoring';
}

/** Whether a kernel in this state can be suspended. */
export function canSuspend(state: IKernelState | null | undefined): boolean {
  return !!state && state.state === 'running';
}

/** Whether a kernel in this state can be resumed. */
export function canResume(state: IKernelState | null | undefined): boolean {
  return !!state && state.state === 'suspended';
}

/**
 * Describe a kernel state for the status bar.
 *
 * `running` on a GPU: `GPU 0 · NVIDIA H200 · 5.7 GiB`; without one: `CPU`;
 * `suspending`/`restoring` with progress; `suspended` with the checkpoint
 * size and how long ago; the last error, if any, is flagged with `⚠`.
 */
export function describeKernelState(
  state: IKernelState,
  now: Date = new Date()
): IStatusDescription {
  const error = state.error ? state.error.trim() : '';
  switch (state.state) {
    case 'running': {
      let label: string;
      let title: string;
      let kind: StatusKind;
      if (state.gpu) {
        const gpu = state.gpu;
        const mem =
          typeof gpu.memory_used === 'number'
            ? ` · ${formatBytes(gpu.memory_used)}`
            : '';
        label = `GPU ${gpu.index} · ${gpu.name}${mem}`;
        title =
          `Kernel runs on GPU ${gpu.index} (${gpu.name}` +
          (gpu.uuid ? `, ${gpu.uuid}` : '') +
          ')' +
          (typeof gpu.memory_used === 'number'
            ? `, using ${formatBytes(gpu.memory_used)} of GPU memory.`
            : '.');
        kind = 'gpu';
      } else {
        label = 'CPU';
        title = 'Kernel runs without a GPU.';
        kind = 'cpu';
      }
      title += ' Suspend it to disk to free its memory.';
      if (error) {
        label += ' · ⚠ suspend failed';
        title += `\nThe last suspend failed: ${error}`;
        if (state.hint) {
          title += `\n${state.hint}`;
        }
        kind = 'error';
      }
      return { label, title, kind };
    }
    case 'suspending': {
      const progress = formatProgress(state.progress);
      return {
        label: truncate(`Suspending… ${progress}`.trim(), 60),
        title: `Suspending the kernel to disk${progress ? `: ${progress}` : ''}.`,
        kind: 'busy'
      };
    }
    case 'restoring': {
      const progress = formatProgress(state.progress);
      return {
        label: truncate(`Restoring… ${progress}`.trim(), 60),
        title: `Restoring the kernel from its checkpoint${progress ? `: ${progress}` : ''}. Cells run as soon as it is back.`,
        kind: 'busy'
      };
    }
    case 'suspended': {
      const size = state.checkpoint?.size;
      const since = formatSince(
        state.suspended_at ?? state.checkpoint?.created ?? null,
        now
      );
      const parts = ['Suspended'];
      if (typeof size === 'number') {
        parts.push(`${formatBytes(size)} on disk`);
      }
      if (since) {
        parts.push(since);
      }
      let label = parts.join(' · ');
      let title =
        'Kernel is suspended to disk' +
        (typeof size === 'number' ? ` (${formatBytes(size)}` : ' (') +
        (state.checkpoint?.engine || state.engine
          ? `${typeof size === 'number' ? ', ' : ''}${state.checkpoint?.engine ?? state.engine}`
          : '') +
        ')' +
        (state.suspended_at ? ` since ${formatDate(state.suspended_at)}` : '') +
        '. Run a cell or click Resume to bring it back.';
      title = title.replace(' ()', '');
      let kind: StatusKind = 'suspended';
      if (error) {
        label += ' · ⚠ restore failed';
        title += `\nThe last restore failed: ${error}`;
        if (state.hint) {
          title += `\n${state.hint}`;
        }
        kind = 'error';
      }
      return { label, title, kind };
    }
    default:
      return {
        label: String((state as IKernelState).state ?? 'unknown'),
        title: 'Unknown kernel state.',
        kind: 'cpu'
      };
  }
}

/**
 * Apply a kernel-state event to the last known state of that kernel.
 *
 * Progress is taken from the event while an operation runs and dropped when
 * it ends; everything the event does not carry (GPU, checkpoint) is kept
 * until the next poll brings the full state.
 */
export function mergeEvent(
  previous: IKernelState | undefined,
  event: IKernelStateEvent
): IKernelState {
  const base: IKernelState =
    previous ?? emptyState(event.kernel_id, event.state);
  const transient = isTransient(event.state);
  const hasProgress =
    !!event.phase ||
    typeof event.bytes_done === 'number' ||
    typeof event.bytes_total === 'number';
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
  if (event.error) {
    next.error = event.error;
    if (event.error !== base.error) {
      // The hint belongs to the old error; the next poll brings the new one.
      next.hint = null;
    }
  } else if (
    event.error !== undefined ||
    (transient && base.state !== event.state)
  ) {
    // The server sends "" for "no error"; a new operation also clears
    // the error of the last one.
    next.error = null;
    next.hint = null;
  }
  if (event.state === 'running') {
    next.suspended_at = null;
  }
  if (event.state === 'suspending' && base.state === 'running') {
    next.gpu = base.gpu;
  }
  if (event.state === 'suspended') {
    next.gpu = null;
  }
  return next;
}

/** What a notification offers after a failure. */
export type NoticeAction =
  | 'retry-suspend'
  | 'suspend-snapshot'
  | 'retry-resume'
  | 'resume-other-gpu'
  | 'open-panel'
  | 'doctor';

/** A notification to show for a state transition. */
export interface INotice {
  type: 'success' | 'error' | 'warning' | 'info';
  message: string;
  actions: NoticeAction[];
}

/**
 * The notification, if any, for a kernel going from `previous` to `current`.
 *
 * `label` names the kernel for the user (its notebook, or its id).
 * The first observation of a kernel (`previous` undefined) never notifies.
 */
export function transitionNotice(
  previous: IKernelState | undefined,
  current: IKernelState,
  label: string
): INotice | null {
  if (!previous) {
    return null;
  }
  const name = label || current.kernel_id.slice(0, 8);
  const error = current.error ? current.error.trim() : '';
  const hint = current.hint ? current.hint.trim() : '';
  if (error && error !== (previous.error ?? '').trim()) {
    if (current.state === 'running') {
      const actions: NoticeAction[] = ['retry-suspend'];
      if (/snapshot/i.test(hint) && !/not wired/i.test(error + hint)) {
        actions.push('suspend-snapshot');
      }
      actions.push('doctor');
      return {
        type: 'error',
        message:
          `Suspend of ${name} failed; the kernel keeps running. ` +
          `${sentence(truncate(error, 300))} ` +
          (hint ||
            'Retry when the kernel is idle, or see what works on this ' +
              'server (`gpucr doctor`).'),
        actions
      };
    }
    if (current.state === 'suspended') {
      return {
        type: 'error',
        message:
          `Restore of ${name} failed; its checkpoint is kept. ` +
          `${sentence(truncate(error, 300))} ` +
          (hint ||
            'Retry, restore on another GPU, or restart the kernel to start fresh.'),
        actions: ['retry-resume', 'resume-other-gpu']
      };
    }
  }
  const was = previous.state;
  const now = current.state;
  if (was === now) {
    return null;
  }
  const took = formatSeconds(current.timings?.total);
  if (now === 'suspended' && (was === 'suspending' || was === 'running')) {
    const size = current.checkpoint?.size;
    const engine = current.checkpoint?.engine ?? current.engine;
    const details = [
      typeof size === 'number' ? formatBytes(size) : '',
      engine ?? ''
    ].filter(Boolean);
    return {
      type: 'success',
      message:
        `${name} was suspended to disk` +
        (took ? ` in ${took}` : '') +
        (details.length ? ` (${details.join(', ')})` : '') +
        '. Its memory is free. Run a cell or click Resume to bring it back.',
      actions: []
    };
  }
  if (now === 'running' && (was === 'restoring' || was === 'suspended')) {
    const gpu = current.gpu;
    const where = gpu ? `on GPU ${gpu.index} (${gpu.name})` : 'on the CPU';
    return {
      type: 'success',
      message:
        `${name} was restored ${where}` +
        (took ? ` in ${took}` : '') +
        '. Its variables are back.',
      actions: []
    };
  }
  if (now === 'running' && was === 'suspending') {
    return {
      type: 'warning',
      message: `Suspending ${name} did not complete; the kernel keeps running.`,
      actions: ['retry-suspend']
    };
  }
  if (now === 'suspended' && was === 'restoring') {
    return {
      type: 'warning',
      message: `Restoring ${name} did not complete; the checkpoint is kept.`,
      actions: ['retry-resume', 'open-panel']
    };
  }
  return null;
}

/** End `text` with a full stop unless it ends with punctuation already. */
export function sentence(text: string): string {
  const t = text.trim();
  return !t || /[.!?…:)]$/.test(t) ? t : `${t}.`;
}

/** A short name for a kernel: its notebook's file name, or its id. */
export function kernelLabel(
  kernelId: string,
  notebookPath: string | null | undefined
): string {
  return notebookPath
    ? basename(notebookPath)
    : `kernel ${kernelId.slice(0, 8)}`;
}

/** Whether two states differ in anything the user can see. */
export function stateChanged(
  a: IKernelState | undefined,
  b: IKernelState | undefined
): boolean {
  return JSON.stringify(a ?? null) !== JSON.stringify(b ?? null);
}
