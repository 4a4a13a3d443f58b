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
import { describeKernelState, IShutdownLine, kernelLabel } from './messages';
import { GpucrModel } from './model';
import { KernelShutdowns } from './shutdown';
import { CommandIDs } from './tokens';
import type { IKernelState } from './types';

/**
 * Shown before a suspended kernel's label in JupyterLab's Kernels section
 * (first, so that the default sidebar width cuts the kernel's name, not it).
 */
export function kernelsSectionMark(state: IKernelState): string {
  const size = state.checkpoint?.size;
  return (
    'Suspended' +
    (typeof size === 'number' ? ` (${formatBytes(size)})` : '') +
    ' · '
  );
}

/**
 * A section's Shut Down All that asks once: the Running sidebar shows its
 * question with this body (the list of what happens to each kernel), then
 * calls `shutdownAll`, which shuts down what the question listed.
 */
function askOnce(
  shutdowns: KernelShutdowns,
  kernelIds: () => string[]
): Pick<
  IRunningSessions.IManager,
  'shutdownAll' | 'shutdownAllConfirmationText'
> {
  let asked: IShutdownLine[] = [];
  return {
    // The sidebar hands this straight to showDialog, whose body may be a
    // widget: typed as text by @jupyterlab/running 4.6.
    shutdownAllConfirmationText: (() => {
      asked = shutdowns.lines(kernelIds());
      return shutdowns.body(asked);
    }) as unknown as () => string,
    shutdownAll: () => void shutdowns.shutDown(asked)
  };
}

export function addRunningSection(options: {
  managers: IRunningSessionManagers;
  model: GpucrModel;
  commands: CommandRegistry;
  pathForKernel: (kernelId: string) => string | null;
  shutdowns: KernelShutdowns;
  /** All kernels of the server (JupyterLab's Kernels section). */
  kernelIds: () => string[];
  /** The name of JupyterLab's Kernels section, in the user's language. */
  kernelsSection: string;
}): void {
  const { managers, model, commands, pathForKernel, shutdowns } = options;
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
        `${path ?? state.kernel_id}\n${describeKernelState(state, model.now).title}`,
      detail: () =>
        [
          typeof size === 'number' ? formatBytes(size) : '',
          formatSince(
            state.suspended_at ?? state.checkpoint?.created,
            model.now
          )
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
    refreshRunning: () => void model.refreshLists(),
    runningChanged,
    shutdownLabel: 'Shut Down (saved state to the trash)',
    shutdownAllLabel: 'Shut Down All Suspended',
    ...askOnce(shutdowns, () => suspended().map(s => s.kernel_id))
  });
  // JupyterLab's Kernels section asks its own question, then shuts the
  // kernels down through the guarded manager, which would ask again: one
  // question instead, listing what happens to each kernel.
  const patchKernels = (manager: IRunningSessions.IManager) => {
    if (manager.name === options.kernelsSection) {
      Object.assign(manager, askOnce(shutdowns, options.kernelIds));
    }
  };
  managers.items().forEach(patchKernels);
  managers.added.connect((_, manager) => patchKernels(manager));

  // Mark the suspended kernels in JupyterLab's own Kernels section.
  const style = document.createElement('style');
  style.dataset.gpucr = 'running-marks';
  document.head.appendChild(style);
  let last = '';
  const update = () => {
    const rules = suspended().map(
      state =>
        `.jp-RunningSessions-item.jp-mod-kernel[data-context="${CSS.escape(state.kernel_id)}"] > .jp-RunningSessions-itemLabel::before {` +
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
  model.ticked.connect(() => runningChanged.emit());
  update();
}
