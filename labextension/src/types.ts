/**
 * Types of the gpucr REST API and event bus contract (docs/rest-api.md).
 *
 * This module is pure (no imports) so that the unit tests can load it in
 * plain Node.js.
 */

/**
 * A point in time: an ISO 8601 string, or seconds since the epoch (the
 * server sends floats from `time.time()`).
 */
export type Timestamp = string | number;

/** The lifecycle of a kernel as the server reports it. */
export type KernelStateName =
  'running' | 'suspending' | 'suspended' | 'restoring';

/** The checkpoint engines. */
export type EngineName = 'criu' | 'snapshot';

/** Phases reported in progress and events. */
export type Phase =
  | 'trimming'
  | 'gpu-checkpoint'
  | 'dumping'
  | 'verifying'
  | 'done'
  | 'restoring'
  | 'gpu-restore'
  | 'failed';

/** A checkpoint summary embedded in a kernel state. */
export interface ICheckpointSummary {
  id: string;
  size: number | null;
  created: Timestamp | null;
  engine: EngineName | string | null;
  gpu_model: string | null;
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

/** `GET /api/gpucr/kernels/{kernel_id}` */
export interface IKernelState {
  kernel_id: string;
  state: KernelStateName;
  engine: EngineName | string | null;
  checkpoint: ICheckpointSummary | null;
  gpu: IKernelGpu | null;
  progress: IProgress | null;
  suspended_at: Timestamp | null;
  /** Message of the last failed operation. */
  error: string | null;
  /** What the user can do about `error` (server's hint), if known. */
  hint?: string | null;
  /** Seconds per step of the last operation, e.g. `{"total": 2.3}`. */
  timings?: { [step: string]: number } | null;
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

/** `GET /api/gpucr/doctor` */
export interface IDoctorReport {
  ok: boolean;
  checks: Array<{
    name: string;
    ok: boolean;
    detail?: string | null;
    fix?: string | null;
  }>;
}

/** The schema id of the kernel state events on the server's event bus. */
export const KERNEL_STATE_SCHEMA =
  'https://events.jupyter.org/jupyter_gpucr/kernel-state/v1';

/** The data of a kernel state event. */
export interface IKernelStateEvent {
  schema_id?: string;
  kernel_id: string;
  state: KernelStateName;
  phase?: Phase | string | null;
  bytes_done?: number | null;
  bytes_total?: number | null;
  error?: string | null;
}
