/** Command ids and plugin ids. */
export const PLUGIN_ID = 'jupyter-gpucr:plugin';

export namespace CommandIDs {
  export const suspend = 'gpucr:suspend';
  export const resume = 'gpucr:resume';
  export const deleteCheckpoint = 'gpucr:delete-checkpoint';
  export const openPanel = 'gpucr:open-panel';
  export const refresh = 'gpucr:refresh';
}
