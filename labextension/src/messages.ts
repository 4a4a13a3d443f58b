/**
 * Every sentence the UI says about kernel states: the status bar's label and
 * tooltip, the notifications, the dialogs' questions, the shutdown summary.
 * Which state or transition it is comes from state.ts; this module only
 * words it.
 *
 * Pure functions, unit-tested in src/__tests__/messages.test.ts.
 */
import {
  basename,
  formatBytes,
  formatClock,
  formatDate,
  formatDuration,
  formatProgress,
  formatSeconds,
  formatSince,
  truncate
} from './format';
import { isOnDisk, Transition, transitionOf } from './state';
import type {
  CheckSeverity,
  IDoctorCheck,
  IDoctorReport,
  IKernelState,
  ILostItem
} from './types';

/** JupyterLab cuts notification messages at this many characters. */
export const TOAST_MAX = 140;

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

/** Plain words for an engine: `whole process` (criu), `saved variables` (snapshot). */
export function engineLabel(engine: string | null | undefined): string {
  switch (engine) {
    case 'criu':
      return 'whole process';
    case 'snapshot':
      return 'saved variables';
    default:
      return engine ?? '';
  }
}

/** The reasons the server suspends a kernel for on its own (the status says which). */
const SERVER_REASONS = ['idle', 'room', 'memory', 'gpu-memory', 'server-stop'];

/** Why a checkpoint was made, in the words the panel shows. */
export function reasonLabel(reason: string | null | undefined): string {
  switch (reason) {
    case 'idle':
      return 'idle';
    case 'room':
      return 'made room for another kernel';
    case 'memory':
      return 'host memory was needed';
    case 'gpu-memory':
      return 'GPU memory was needed';
    case 'server-stop':
      return 'the server stopped';
    default:
      return reason ?? '';
  }
}

/** What a kernel or checkpoint holds: `CPU`, or the GPU model (`GPU` when unknown). */
export function kindLabel(
  kind: string | null | undefined,
  gpuModel?: string | null
): string {
  if (kind === 'gpu' || gpuModel) {
    return gpuModel || 'GPU';
  }
  return 'CPU';
}

/**
 * Describe a kernel state for the status bar.
 *
 * `running` on a GPU: `GPU 0 · NVIDIA H200 · 5.7 GiB`; without one: `CPU`;
 * `suspend-pending`: `Suspend after this cell`; `suspending`/`restoring`
 * with progress; `suspended` with the checkpoint size and how long ago; the
 * last error, if any, is flagged with `⚠`.
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
    case 'suspend-pending': {
      const since = formatSince(state.pending_since ?? null, now);
      return {
        label: 'Suspend after this cell',
        title:
          'The kernel is suspended to disk as soon as the running cell ' +
          `finishes${since ? ` (asked ${since})` : ''}. Cancel keeps it running.`,
        kind: 'busy'
      };
    }
    case 'suspending': {
      const progress = formatProgress(state.progress, state.kind);
      return {
        label: truncate(`Suspending… ${progress}`.trim(), 60),
        title: `Suspending the kernel to disk${progress ? `: ${progress}` : ''}.`,
        kind: 'busy'
      };
    }
    case 'restoring': {
      const progress = formatProgress(state.progress, state.kind);
      const ahead = state.ahead ? ' (you are typing)' : '';
      return {
        label: truncate(`Restoring${ahead}… ${progress}`.trim(), 60),
        title:
          `Restoring the kernel from disk${progress ? `: ${progress}` : ''}` +
          (state.ahead
            ? ', started when you typed into a cell, so that it runs sooner.'
            : '.') +
          ' Cells run as soon as it is back.',
        kind: 'busy'
      };
    }
    case 'waiting-for-room': {
      const message = state.room?.message ?? 'waiting for room';
      return {
        label: truncate(message.charAt(0).toUpperCase() + message.slice(1), 60),
        title:
          `Restoring the kernel: ${message}, least recently used first. ` +
          'Cells run as soon as it is back.',
        kind: 'busy'
      };
    }
    case 'suspended': {
      const size = state.checkpoint?.size;
      const savedAt = state.suspended_at ?? state.checkpoint?.created ?? null;
      const since = formatSince(savedAt, now);
      const parts = ['Suspended'];
      if (typeof size === 'number') {
        parts.push(`${formatBytes(size)} on disk`);
      }
      if (since) {
        parts.push(since);
      }
      let label = parts.join(' · ');
      const details = [
        typeof size === 'number' ? formatBytes(size) : '',
        engineLabel(state.checkpoint?.engine ?? state.engine),
        kindLabel(state.kind, state.checkpoint?.gpu_model)
      ].filter(Boolean);
      let title =
        'Kernel is suspended to disk, no process runs' +
        (details.length ? ` (${details.join(', ')})` : '') +
        (savedAt ? `, since ${formatDate(savedAt)}` : '') +
        (SERVER_REASONS.includes(state.checkpoint?.reason ?? '')
          ? `; suspended: ${reasonLabel(state.checkpoint?.reason)}`
          : '') +
        '. Run a cell or click Resume to bring it back.';
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

/** What a notification offers. */
export type NoticeAction =
  | 'retry-suspend'
  | 'suspend-snapshot'
  | 'suspend-when-idle'
  | 'interrupt-and-suspend'
  | 'cancel-suspend'
  | 'retry-resume'
  | 'resume'
  | 'resume-other-gpu'
  | 'start-fresh'
  | 'details'
  | 'open-panel'
  | 'doctor';

/** A notification to show. */
export interface INotice {
  type: 'success' | 'error' | 'warning' | 'info';
  message: string;
  actions: NoticeAction[];
  /** Close by itself (milliseconds), or stay until closed or no longer true. */
  autoClose: number | false;
}

/** A name short enough for a notification. */
function shortName(label: string): string {
  return truncate(label, 48);
}

/** `msg` fitted to a toast: never longer than TOAST_MAX. */
export function fitToast(msg: string): string {
  return truncate(msg, TOAST_MAX);
}

/**
 * What the last restore did not bring back, for a sentence:
 * `gen (generator), f (file) and 2 more`; `''` when nothing was lost.
 */
export function formatLost(lost: ILostItem[] | null | undefined, max = 40) {
  if (!lost || !lost.length) {
    return '';
  }
  const items = lost.map(l => (l.type ? `${l.name} (${l.type})` : l.name));
  let text = items[0];
  let shown = 1;
  while (shown < items.length && (text + ', ' + items[shown]).length <= max) {
    text += ', ' + items[shown];
    shown++;
  }
  const rest = items.length - shown;
  return rest ? `${text} and ${rest} more` : text;
}

/**
 * The notice after a restore, from the REST/event fields: `train.ipynb was
 * restored from disk after 3 min (onto GPU 1); not kept: gen (generator)`.
 */
export function restoredNotice(current: IKernelState, label: string): INotice {
  const after =
    typeof current.suspended_for === 'number'
      ? ` after ${formatDuration(current.suspended_for)}`
      : '';
  const where = current.gpu ? `onto GPU ${current.gpu.index}` : 'onto the CPU';
  const lost = formatLost(current.lost);
  return {
    type: lost ? 'warning' : 'success',
    message: fitToast(
      `${shortName(label)} was restored from disk${after} (${where})` +
        (lost ? `; not kept: ${lost}` : '.')
    ),
    actions: lost ? ['details'] : [],
    autoClose: lost ? false : 6000
  };
}

/** The notice when a suspended kernel was restarted instead of restored. */
export function restartedNotice(label: string): INotice {
  return {
    type: 'info',
    message:
      `${shortName(label)} restarted as a fresh kernel: its variables are ` +
      'gone. The saved state is in the trash.',
    actions: ['open-panel'],
    autoClose: 10000
  };
}

/** The notice when the debugger was turned on for a suspended kernel. */
export function debuggerNotice(label: string): INotice {
  return {
    type: 'warning',
    message: `The debugger needs ${shortName(label)} running: run a cell in it or resume it, then turn the debugger on again.`,
    actions: ['resume'],
    autoClose: false
  };
}

/** The notice when a suspend was refused because a cell runs. */
export function busyNotice(label: string): INotice {
  return {
    type: 'warning',
    message: `${shortName(label)} is running a cell, so it was not suspended.`,
    actions: ['suspend-when-idle', 'interrupt-and-suspend'],
    autoClose: false
  };
}

/**
 * The notification, if any, for a kernel going from `previous` to `current`
 * (`transitionOf` in state.ts decides which transition it is).
 *
 * `label` names the kernel for the user (its notebook, or its id).
 * Messages fit a toast (TOAST_MAX); the full error and hint are behind the
 * Details action and in the status bar's tooltip.
 */
export function transitionNotice(
  previous: IKernelState | undefined,
  current: IKernelState,
  label: string,
  context: INoticeContext = {}
): INotice | null {
  const transition = transitionOf(previous, current);
  return transition ? noticeOf(transition, current, label, context) : null;
}

/** What a notice's actions depend on beyond the kernel's state. */
export interface INoticeContext {
  /**
   * How many GPUs the server has (undefined: not known yet): choosing one
   * means something from two on, and only for a kernel that used a GPU.
   */
  gpus?: number;
}

/**
 * The cause of a failure, first and in plain words: the server's `summary`
 * (`The saved state is damaged`), else its message with kernel ids replaced
 * by `name`.
 */
export function failureCause(current: IKernelState, name: string): string {
  const summary = current.summary ? current.summary.trim() : '';
  const cause = sentence(
    summary || plainError(current.error ?? '', null, name)
  );
  return cause.charAt(0).toUpperCase() + cause.slice(1);
}

/** The notice of one transition of `current`. */
function noticeOf(
  transition: Transition,
  current: IKernelState,
  label: string,
  context: INoticeContext
): INotice {
  const name = shortName(label || current.kernel_id.slice(0, 8));
  const error = current.error ? current.error.trim() : '';
  const hint = current.hint ? current.hint.trim() : '';
  switch (transition) {
    case 'suspend-failed': {
      const actions: NoticeAction[] = ['details'];
      if (current.retryable !== false) {
        actions.push('retry-suspend');
      }
      if (/snapshot/i.test(hint) && !/not wired/i.test(error + hint)) {
        actions.push('suspend-snapshot');
      }
      actions.push('doctor');
      return {
        type: 'error',
        message: fitToast(
          `Suspend of ${name} failed; it keeps running. ${sentence(error)}`
        ),
        actions,
        autoClose: false
      };
    }
    case 'restore-failed': {
      // The cause first; Retry only where asking again can succeed (not for
      // a damaged checkpoint), another GPU only where there is one to choose,
      // and always a way out: a fresh kernel, the saved state to the trash.
      const actions: NoticeAction[] = ['details'];
      if (current.retryable !== false) {
        actions.push('retry-resume');
      }
      if (
        current.kind === 'gpu' &&
        (context.gpus === undefined || context.gpus > 1)
      ) {
        actions.push('resume-other-gpu');
      }
      actions.push('start-fresh');
      return {
        type: 'error',
        message: fitToast(
          `${failureCause(current, name)} ${name} was not restored` +
            (current.retryable === false ? '.' : '; its saved state is kept.')
        ),
        actions,
        autoClose: false
      };
    }
    case 'suspended':
      return suspendedNotice(current, name);
    case 'pending':
      return {
        type: 'info',
        message: `${name} will be suspended to disk when its cell finishes.`,
        actions: ['cancel-suspend'],
        autoClose: 6000
      };
    case 'pending-cancelled':
      return {
        type: 'info',
        message: `The pending suspend of ${name} was cancelled; it keeps running.`,
        actions: [],
        autoClose: 5000
      };
    case 'restored':
      return restoredNotice(current, label);
    case 'restarted':
      return restartedNotice(label);
  }
}

/**
 * A finished suspend, once its new checkpoint is known (the event that says
 * "suspended" carries it: its size and why it was made).
 */
function suspendedNotice(current: IKernelState, name: string): INotice {
  const took = formatSeconds(current.timings?.total);
  const size = current.checkpoint?.size;
  const details = [
    typeof size === 'number' ? formatBytes(size) : '',
    engineLabel(current.checkpoint?.engine ?? current.engine)
  ].filter(Boolean);
  const what =
    current.checkpoint?.reason === 'idle'
      ? `${name} was idle, so it was suspended to disk`
      : current.checkpoint?.reason === 'room'
        ? `${name} was idle, so it was suspended to disk to make room for another kernel`
        : current.checkpoint?.reason === 'memory' ||
            current.checkpoint?.reason === 'gpu-memory'
          ? `${name} was idle, so it was suspended to disk: ${reasonLabel(current.checkpoint.reason)} by other kernels`
          : `${name} was suspended to disk` + (took ? ` in ${took}` : '');
  return {
    type: 'success',
    message: fitToast(
      what +
        (details.length ? ` (${details.join(', ')})` : '') +
        '. Run a cell to bring it back.'
    ),
    actions: [],
    autoClose: 6000
  };
}

/** End `text` with a full stop unless it ends with punctuation already. */
export function sentence(text: string): string {
  const t = text.trim();
  return !t || /[.!?…:)]$/.test(t) ? t : `${t}.`;
}

const KERNEL_ID =
  /\b(kernel )?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b/gi;

/**
 * A server's error in plain words for a notice about `name`: what happened
 * and what to do, with every kernel id replaced by the name the user knows
 * (and no HTTP status).
 */
export function plainError(
  message: string,
  hint: string | null | undefined,
  name: string
): string {
  return [sentence(message), sentence(hint ?? '')]
    .filter(Boolean)
    .join(' ')
    .replace(KERNEL_ID, name);
}

/**
 * The question before a trashed state replaces the kernel a restart started
 * under the same id (`current`: that kernel's state, when known).
 */
export function replaceQuestion(
  name: string,
  current: IKernelState | undefined
): string {
  const fate =
    current?.state === 'suspended'
      ? 'its own saved state goes to the trash'
      : 'what it holds is lost';
  return (
    `${name} was restarted after this state was saved, and a new kernel runs in it now. ` +
    `Shut the new kernel down (${fate}) and bring the saved one back? ` +
    'It comes back suspended: run a cell to wake it.'
  );
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

/**
 * What the confirmation before a restart or shutdown of a suspended kernel
 * says: `The suspended state of train.ipynb (5.0 GiB, saved at 14:02) goes to
 * the trash for 24 h; you can bring it back from the Suspended kernels panel.`
 */
export function trashWarning(
  label: string,
  state: IKernelState,
  hours: number,
  now: Date = new Date()
): string {
  const size = state.checkpoint?.size;
  const saved = formatClock(
    state.suspended_at ?? state.checkpoint?.created ?? null,
    now
  );
  const details = [
    typeof size === 'number' ? formatBytes(size) : '',
    saved ? `saved at ${saved}` : ''
  ].filter(Boolean);
  return (
    `The suspended state of ${label}` +
    (details.length ? ` (${details.join(', ')})` : '') +
    ` goes to the trash for ${hours} h; you can bring it back from the Suspended kernels panel.`
  );
}

/** The notice after a suspended kernel was shut down: where its saved state is. */
export function trashedNotice(label: string, hours: number): INotice {
  return {
    type: 'info',
    message: `${label} was shut down; its saved state is in the trash for ${hours} h.`,
    actions: ['open-panel'],
    autoClose: 8000
  };
}

/** One kernel of a shutdown of several: its name and what happens to it. */
export interface IShutdownLine {
  kernelId: string;
  label: string;
  /** `running: its variables are lost`, `suspended (5.0 GiB): its saved state goes to the trash for 24 h`. */
  fate: string;
  /** Whether its saved state goes to the trash. */
  trashed: boolean;
}

/** What a shutdown does to each kernel (`state`: gpucr's, when known). */
export function shutdownLines(
  kernels: ReadonlyArray<{
    kernelId: string;
    label: string;
    state: IKernelState | undefined;
  }>,
  hours: number
): IShutdownLine[] {
  return kernels.map(({ kernelId, label, state }) => {
    if (!state || !isOnDisk(state)) {
      return {
        kernelId,
        label,
        fate: 'running: its variables are lost',
        trashed: false
      };
    }
    const size = state.checkpoint?.size;
    return {
      kernelId,
      label,
      fate:
        `${state.state}` +
        (typeof size === 'number' ? ` (${formatBytes(size)})` : '') +
        `: its saved state goes to the trash for ${hours} h`,
      trashed: true
    };
  });
}

/** The question above the list of a shutdown of several kernels. */
export function shutdownQuestion(lines: ReadonlyArray<IShutdownLine>): string {
  const n = lines.length;
  const what = n === 1 ? 'this kernel' : `these ${n} kernels`;
  return lines.some(l => l.trashed)
    ? `Shut down ${what}? A suspended kernel's saved state can be brought back from the trash in the Suspended kernels panel.`
    : `Shut down ${what}?`;
}

/**
 * The one notice after a shutdown of several kernels: how many went, where
 * the saved states are, which could not be shut down and why.
 */
export function shutdownSummary(
  done: ReadonlyArray<IShutdownLine>,
  failed: ReadonlyArray<{ line: IShutdownLine; error: string }>,
  hours: number
): IShutdownSummary {
  const total = done.length + failed.length;
  const kernels = (n: number) => (n === 1 ? '1 kernel' : `${n} kernels`);
  const trashed = done.filter(l => l.trashed);
  let message = failed.length
    ? `Shut down ${done.length} of ${kernels(total)}.`
    : total === 1
      ? `Shut down ${shortName(done[0].label)}.`
      : `Shut down ${kernels(total)}.`;
  if (trashed.length) {
    const whose =
      trashed.length === 1
        ? `The saved state of ${shortName(trashed[0].label)} is`
        : `The saved states of ${trashed.length} suspended kernels are`;
    message += ` ${whose} in the trash for ${hours} h.`;
  }
  if (failed.length === 1) {
    message += ` Could not shut down ${shortName(failed[0].line.label)}: ${sentence(failed[0].error)}`;
  } else if (failed.length > 1) {
    message += ` Could not shut down ${shortName(failed[0].line.label)} and ${failed.length - 1} more; see Details.`;
  }
  return {
    type: failed.length ? 'warning' : 'success',
    message: fitToast(message),
    details: failed.length
      ? failed.map(f => `${f.line.label}: ${sentence(f.error)}`).join('\n\n')
      : null,
    trashed: trashed.length > 0
  };
}

/** The notice after a shutdown of several kernels (`shutdownSummary`). */
export interface IShutdownSummary {
  type: 'success' | 'warning';
  message: string;
  /** Every failure with its reason, for a Details dialog. */
  details: string | null;
  /** Whether saved states went to the trash (the notice opens the panel). */
  trashed: boolean;
}

/**
 * A check's severity; a server that sends none: a check that does not hold
 * fails where it is required, else it is a note.
 */
export function checkSeverity(check: IDoctorCheck): CheckSeverity {
  if (check.severity) {
    return check.severity;
  }
  if (check.ok) {
    return 'ok';
  }
  return check.required === false ? 'note' : 'fail';
}

/**
 * The doctor report's headline: `Everything works`, `Everything works (1 note)`,
 * `1 check fails`, `2 checks fail`. Only failures count as failing: a note
 * (no GPU, a tuning hint) leaves suspend and restore working.
 */
export function doctorHeadline(report: IDoctorReport): string {
  const severities = report.checks.map(checkSeverity);
  const failing = severities.filter(s => s === 'fail').length;
  const notes = severities.filter(s => s === 'note').length;
  if (failing === 0) {
    return notes === 0
      ? 'Everything works'
      : `Everything works (${notes} ${notes === 1 ? 'note' : 'notes'})`;
  }
  return failing === 1 ? '1 check fails' : `${failing} checks fail`;
}
