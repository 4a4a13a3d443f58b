/**
 * Types of the gpucr REST API and event bus contract (docs/rest-api.md).
 *
 * `IKernelState` mirrors jupyter_gpucr/server/schemas/kernel-state.json and
 * `IKernelStateEvent` the event schema built from it;
 * tests/server/test_schema_drift.py fails when a property is missing or extra.
 *
 * This module is pure (no imports) so that the unit tests can load it in
 * plain Node.js.
 */

/**
 * A point in time: an ISO 8601 string, or seconds since the epoch (the
 * server sends floats from `time.time()`).
 */
export type Timestamp = string | number;

/**
 * The lifecycle of a kernel as the server reports it. `suspend-pending`: a
 * suspend waits for the running cell to finish. `waiting-for-room`: a restore
 * waits while idle kernels are suspended to make room for it. `uploading`: on
 * this node's disk, its checkpoint going to the object store.
 */
export type KernelStateName =
  | 'running'
  | 'suspend-pending'
  | 'suspending'
  | 'suspended'
  | 'restoring'
  | 'waiting-for-room'
  | 'uploading';

/** The checkpoint engines: criu (whole process), snapshot (saved variables). */
export type EngineName = 'criu' | 'snapshot';

/** Whether a kernel holds GPU memory (or its checkpoint GPU state). */
export type KernelKind = 'cpu' | 'gpu';

/** Phases reported in progress and events. */
export type Phase =
  | 'trimming'
  | 'gpu-checkpoint'
  | 'dumping'
  | 'verifying'
  | 'done'
  | 'restoring'
  | 'gpu-restore'
  | 'failed'
  | 'pending'
  | 'cancelled'
  | 'waiting-for-room'
  | 'uploading'
  | 'downloading';

/** When a suspend happens: now, once the running cell ends, or after interrupting it. */
export type SuspendWhen = 'now' | 'idle' | 'interrupt';

/** A checkpoint summary embedded in a kernel state. */
export interface ICheckpointSummary {
  id: string;
  size: number | null;
  created: Timestamp | null;
  engine: EngineName | string | null;
  gpu_model: string | null;
  gpus?: unknown[];
  notebook_path?: string | null;
  /** Why it was made: `manual`, `idle` (the idle timeout), `server-stop`. */
  reason?: string | null;
}

/** The GPU a running kernel uses. */
export interface IKernelGpu {
  index: number;
  uuid: string;
  name: string;
  memory_used: number | null;
}

/** Progress of a running suspend or restore. */
export interface IProgress {
  phase: Phase | string | null;
  bytes_done: number | null;
  bytes_total: number | null;
}

/** What a restore waits for in `waiting-for-room`. */
export interface IRoomWait {
  /** Where room is made: `on GPU 0`, `in host memory`. */
  where: string | null;
  need: number;
  /** The idle kernels being suspended for it. */
  suspending: string[];
  /** `waiting for room on GPU 0: suspending 2 idle kernels` */
  message: string;
}

/** Something the last restore could not bring back (snapshot engine). */
export interface ILostItem {
  name: string;
  type: string;
  reason?: string;
}

/** `GET /api/gpucr/kernels/{kernel_id}` (schemas/kernel-state.json). */
export interface IKernelState {
  kernel_id: string;
  state: KernelStateName;
  kind?: KernelKind;
  engine: EngineName | string | null;
  engine_reason?: string | null;
  checkpoint: ICheckpointSummary | null;
  gpu: IKernelGpu | null;
  progress: IProgress | null;
  /** The path of the kernel's notebook now (follows renames). */
  notebook_path?: string | null;
  /** The label the kernel was started with (an agent's run or thread id). */
  label?: string | null;
  suspended_at: Timestamp | null;
  /** Since when a suspend waits for the running cell (suspend-pending). */
  pending_since?: Timestamp | null;
  /** When the kernel was last restored. */
  restored_at?: Timestamp | null;
  /** Seconds the kernel spent on disk before its last restore. */
  suspended_for?: number | null;
  /** What the last restore could not bring back. */
  lost?: ILostItem[];
  warnings?: string[];
  /** Message of the last failed operation. */
  error: string | null;
  /** What the user can do about `error` (server's hint), if known. */
  hint?: string | null;
  /** The cause of `error` in a few plain words (`The saved state is damaged`); null: `error` says it plainly. */
  summary?: string | null;
  /** Whether the failed operation, asked again unchanged, can succeed; false for a damaged checkpoint. */
  retryable?: boolean | null;
  /** While `waiting-for-room`: where and for what. */
  room?: IRoomWait | null;
  /** The kernel this one was suspended to make room for. */
  made_room_for?: string | null;
  /** The restore under way was asked for ahead of use (the user typed into a cell). */
  ahead?: boolean;
  /** Live versus reserved bytes reported by the kernel before a criu suspend. */
  trim?: { [key: string]: unknown } | null;
  /** Seconds per step of the last operation, e.g. `{"total": 2.3}`; a snapshot restore's
   * `warm_start` says whether it loaded into the kernel started when the notebook was opened. */
  timings?: {
    [step: string]: number | boolean | undefined;
    total?: number;
    warm_start?: boolean;
  } | null;
}

/** `GET /api/gpucr/checkpoints` items. */
export interface ICheckpoint {
  id: string;
  name: string;
  kernel_id: string | null;
  created: Timestamp | null;
  size: number | null;
  engine: EngineName | string | null;
  gpu_model: string | null;
  reason: 'manual' | 'idle' | 'server-stop' | string | null;
  notebook_path: string | null;
}

/** `GET /api/gpucr/trash` items: checkpoints of kernels shut down or restarted. */
export interface ITrashItem {
  id: string;
  name: string;
  kernel_id: string | null;
  notebook_path: string | null;
  trashed_at: Timestamp | null;
  expires_at: Timestamp | null;
  size: number | null;
  engine: EngineName | string | null;
  kind?: KernelKind;
  reason: 'shutdown' | 'restart' | string | null;
}

/** `GET /api/gpucr/gpus` items. */
export interface IGpu {
  index: number;
  uuid: string;
  name: string;
  memory_total: number;
  memory_used: number;
  memory_free: number;
  kernels: string[];
}

/** A kernel in an `IRoomPlace`. */
export interface IRoomKernel {
  kernel_id: string;
  bytes: number;
  /** Seconds since its last activity. */
  idle_s: number;
  /** Why it would not be suspended to make room (`running a cell`, …); null: it would. */
  kept: string | null;
}

/** `GET /api/gpucr/room` items: a GPU, or the host memory budget. */
export interface IRoomPlace {
  /** `GPU 0` or `host memory`. */
  where: string;
  /** A GPU's index, UUID and model (absent for the host memory budget). */
  index?: number;
  uuid?: string;
  name?: string;
  /** The GPU's memory, or the host memory budget. */
  total: number;
  used: number;
  free: number;
  /** What this server's kernels hold there. */
  held_by_kernels: number;
  /** What idle kernels hold there that would be suspended to make room now. */
  idle: number;
  kernels: IRoomKernel[];
}

/**
 * How a doctor check came out: `note` is something to know (no GPU, a
 * tuning hint), suspend and restore work; only a `fail` means they do not.
 */
export type CheckSeverity = 'ok' | 'note' | 'fail';

/** A check of `GET /api/gpucr/doctor`. */
export interface IDoctorCheck {
  name: string;
  ok: boolean;
  detail?: string | null;
  /** For a `fail`, the fix; for a `note`, advice. */
  fix?: string | null;
  required?: boolean;
  severity?: CheckSeverity;
}

/** `GET /api/gpucr/doctor` */
export interface IDoctorReport {
  ok: boolean;
  /** How many checks fail (severity `fail`). */
  failing?: number;
  checks: IDoctorCheck[];
}

/** A save point as `GET /api/gpucr/kernels/{id}/savepoints` lists it. */
export interface ISavePoint {
  id: string;
  kernel_id: string;
  name: string | null;
  created: number;
  size: number;
  cell?: { execution_count: number; code: string } | null;
  kernel_state?: string | null;
  paused_s?: number | null;
}

/** The error body of a suspend refused because a cell runs (HTTP 409). */
export interface IBusyRefusal {
  error: 'KernelBusyError';
  message: string;
  hint?: string;
  options?: SuspendWhen[];
}

/** The schema id of the kernel state events on the server's event bus. */
export const KERNEL_STATE_SCHEMA =
  'https://events.jupyter.org/jupyter_gpucr/kernel-state/v1';

/**
 * The data of a kernel state event: the kernel's whole state as the server
 * last set it (the fields `GET` fills in as it answers, the GPU and notebook
 * now and a running kernel's engine, as they were last read), and what
 * happened (`phase`, with the bytes of an operation's progress).
 */
export interface IKernelStateEvent extends IKernelState {
  phase: Phase | string;
  bytes_done: number;
  bytes_total: number;
}
