/**
 * The Running sidebar: a "Suspended Kernels" section (notebook, size on
 * disk, since when; its shut-down button asks first and sends the saved
 * state to the trash), and a mark on the suspended kernels in JupyterLab's
 * own "Kernels" section, whose items carry the kernel id as `data-context`.
 */
import { IRunningSessionManagers, IRunningSessions } from '@jupyterlab/running';
import { CommandRegistry } from '@lumino/commands';
import { Signal } from '@lumino/signaling';

import { formatBytes, formatSince } from './format';
import { suspendIcon } from './icons';
import { GpucrModel } from './model';
import { describeKernelState, kernelLabel } from './state';
import { CommandIDs } from './tokens';
import type { IKernelState } from './types';

/** Shown after a suspended kernel's label in JupyterLab's Kernels section. */
export function kernelsSectionMark(state: IKernelState): string {
  const size = state.checkpoint?.size;
  return (
    ' · suspended to disk' +
    (typeof size === 'number' ? ` (${formatBytes(size)})` : '')
  );
}

export function addRunningSection(options: {
  managers: IRunningSessionManagers;
  model: GpucrModel;
  commands: CommandRegistry;
  pathForKernel: (kernelId: string) => string | null;
}): void {
  const { managers, model, commands, pathForKernel } = options;
  const runningChanged = new Signal<GpucrModel, void>(model);
  const suspended = () =>
    [...model.kernels.values()].filter(k => k.state === 'suspended');

  const item = (state: IKernelState): IRunningSessions.IRunningItem => {
    const path = pathForKernel(state.kernel_id);
    const size = state.checkpoint?.size;
    return {
      className: 'jp-gpucr-RunningItem',
      context: state.kernel_id,
      icon: () => suspendIcon,
      label: () => kernelLabel(state.kernel_id, path),
      labelTitle: () =>
        `${path ?? state.kernel_id}\n${describeKernelState(state).title}`,
      detail: () =>
        [
          typeof size === 'number' ? formatBytes(size) : '',
          formatSince(state.suspended_at ?? state.checkpoint?.created)
        ]
          .filter(Boolean)
          .join(' · '),
      open: path
        ? () => void commands.execute('docmanager:open', { path })
        : undefined,
      shutdown: () =>
        void commands.execute(CommandIDs.shutdownKernel, {
          kernelId: state.kernel_id
        })
    };
  };

  managers.add({
    name: 'Suspended Kernels',
    running: () => suspended().map(item),
    shutdownAll: () => {
      void (async () => {
        for (const state of suspended()) {
          await commands.execute(CommandIDs.shutdownKernel, {
            kernelId: state.kernel_id
          });
        }
      })();
    },
    refreshRunning: () => void model.refreshLists(),
    runningChanged,
    shutdownLabel: 'Shut Down (saved state to the trash)',
    shutdownAllLabel: 'Shut Down All Suspended',
    shutdownAllConfirmationText:
      'Shut down every suspended kernel? Each one asks first; their saved states go to the trash.'
  });

  // Mark the suspended kernels in JupyterLab's own Kernels section.
  const style = document.createElement('style');
  style.dataset.gpucr = 'running-marks';
  document.head.appendChild(style);
  let last = '';
  const update = () => {
    const rules = suspended().map(
      state =>
        `.jp-RunningSessions-item.jp-mod-kernel[data-context="${CSS.escape(state.kernel_id)}"] > .jp-RunningSessions-itemLabel::after {` +
        ` content: ${JSON.stringify(kernelsSectionMark(state))}; }`
    );
    const text = rules.join('\n');
    if (text !== last) {
      last = text;
      style.textContent = text;
    }
    runningChanged.emit();
  };
  model.changed.connect(update);
  update();
}
