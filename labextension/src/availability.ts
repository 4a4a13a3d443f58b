/**
 * When a notebook command's availability may change: the toolbar buttons
 * and menus of gpucr's commands ask again whether they are enabled.
 */
import { INotebookTracker } from '@jupyterlab/notebook';

import { GpucrModel } from './model';

/**
 * Call `refresh` when a kernel's state changes (told by the server, or an
 * operation of this browser starts or ends), when another notebook becomes
 * current, and when a notebook gets its kernel: the server may tell of a new
 * kernel before the notebook has it.
 */
export function refreshOnKernelChanges(
  model: GpucrModel,
  tracker: INotebookTracker,
  refresh: () => void
): void {
  model.kernelChanged.connect(refresh);
  model.busyChanged.connect(refresh);
  tracker.currentChanged.connect(refresh);
  tracker.widgetAdded.connect((_, panel) =>
    panel.sessionContext.kernelChanged.connect(refresh)
  );
}
