/** Command ids, plugin ids and the model's token. */
import { Token } from '@lumino/coreutils';

import type { GpucrModel } from './model';

export const PLUGIN_ID = 'jupyter-gpucr:plugin';

/** The gpucr model (kernel states, checkpoints, trash), shared by the plugins. */
export const IGpucrModel = new Token<GpucrModel>(
  'jupyter-gpucr:IGpucrModel',
  'The gpucr kernel states, checkpoints and trash, kept current from the server.'
);

export namespace CommandIDs {
  export const suspend = 'gpucr:suspend';
  export const cancelSuspend = 'gpucr:cancel-suspend';
  export const resume = 'gpucr:resume';
  export const startFresh = 'gpucr:start-fresh';
  export const shutdownKernel = 'gpucr:shutdown-kernel';
  export const shutdownAll = 'gpucr:shutdown-all';
  export const deleteCheckpoint = 'gpucr:delete-checkpoint';
  export const restoreFromTrash = 'gpucr:restore-from-trash';
  export const deleteFromTrash = 'gpucr:delete-from-trash';
  export const openPanel = 'gpucr:open-panel';
  export const refresh = 'gpucr:refresh';
  export const fork = 'gpucr:fork';
}
