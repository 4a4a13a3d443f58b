/** The kernel states and events the unit tests start from. */
import type { IKernelState, IKernelStateEvent } from '../types';

export const NOW = new Date('2026-11-30T18:10:00Z');

export function kernel(overrides: Partial<IKernelState> = {}): IKernelState {
  return {
    kernel_id: '5f1c0000-aaaa-bbbb-cccc-000000000001',
    state: 'running',
    engine: null,
    checkpoint: null,
    gpu: null,
    progress: null,
    suspended_at: null,
    error: null,
    ...overrides
  };
}

/** An event of the server: the whole state (`kernel(overrides)`) and what happened. */
export function event(
  overrides: Partial<IKernelStateEvent> = {}
): IKernelStateEvent {
  return {
    ...kernel(overrides),
    phase: 'done',
    bytes_done: 0,
    bytes_total: 0,
    ...overrides
  };
}

export const GPU = {
  index: 0,
  uuid: 'GPU-1234',
  name: 'NVIDIA H200',
  memory_used: 6170000000
};

export const CHECKPOINT = {
  id: 'ckpt-1',
  size: 5 * 1024 ** 3,
  created: '2026-11-30T18:00:00Z',
  engine: 'criu',
  gpu_model: 'NVIDIA H200'
};
