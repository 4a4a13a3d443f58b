/**
 * JupyterLab's own "Kernels" section of the Running sidebar (its shut-down
 * button, its context menu, its "Shut Down All") shuts kernels down through
 * the kernel manager, with no hook of its own. The guard wraps that manager's
 * `shutdown` and `shutdownAll`, so shutting down a suspended kernel asks first
 * and says that its saved state goes to the trash, wherever the request comes
 * from. gpucr's own commands ask themselves and call the `unguarded` methods.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';

import { GpucrModel } from './model';
import { trashWarning } from './state';
import type { IKernelState } from './types';

export interface IKernelShutdown {
  shutdown(id: string): Promise<void>;
  shutdownAll(): Promise<void>;
}

/** The question before suspended kernels are shut down; true to go on. */
export async function confirmTrash(
  states: IKernelState[],
  label: (kernelId: string) => string
): Promise<boolean> {
  const one = states.length === 1;
  const result = await showDialog({
    title: one
      ? 'Shut down the suspended kernel?'
      : `Shut down ${states.length} suspended kernels?`,
    body: states.map(s => trashWarning(label(s.kernel_id), s)).join(' '),
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Shut Down' })]
  });
  return result.button.accept;
}

/**
 * Wrap `kernels.shutdown` / `kernels.shutdownAll` in place; returns the
 * original methods. `trashed` is told which suspended kernels went to the
 * trash, with the names they had (for the notification).
 */
export function guardKernelShutdown(options: {
  kernels: Kernel.IManager;
  model: GpucrModel;
  label: (kernelId: string) => string;
  trashed: (kernelId: string, label: string) => void;
}): IKernelShutdown {
  const { kernels, model, label, trashed } = options;
  const unguarded: IKernelShutdown = {
    shutdown: kernels.shutdown.bind(kernels),
    shutdownAll: kernels.shutdownAll.bind(kernels)
  };
  const suspended = (ids: string[]): IKernelState[] =>
    ids
      .map(id => model.getKernel(id))
      .filter((s): s is IKernelState => s?.state === 'suspended');

  const ask = async (
    states: IKernelState[],
    shutdown: () => Promise<void>
  ): Promise<void> => {
    if (states.length && !(await confirmTrash(states, label))) {
      return;
    }
    const labels = states.map(s => [s.kernel_id, label(s.kernel_id)]);
    await shutdown();
    labels.forEach(([id, name]) => trashed(id, name));
  };
  kernels.shutdown = (id: string) =>
    ask(suspended([id]), () => unguarded.shutdown(id));
  kernels.shutdownAll = () =>
    ask(suspended([...kernels.running()].map(k => k.id)), () =>
      unguarded.shutdownAll()
    );
  return unguarded;
}
