/**
 * JupyterLab's own "Kernels" section of the Running sidebar (its shut-down
 * button, its context menu, its "Shut Down All") shuts kernels down through
 * the kernel manager, with no hook of its own. The guard wraps that manager's
 * `shutdown` and `shutdownAll`, so shutting down a suspended kernel asks first
 * and says that its saved state goes to the trash, wherever the request comes
 * from; shutting them all down asks once, listing every kernel (shutdown.ts).
 * gpucr's own commands ask themselves and call the `unguarded` methods.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Kernel } from '@jupyterlab/services';

import { GpucrModel } from './model';
import { trashWarning } from './messages';
import type { IKernelState } from './types';

export interface IKernelShutdown {
  shutdown(id: string): Promise<void>;
  shutdownAll(): Promise<void>;
}

/**
 * The question before a suspended kernel is shut down; true to go on.
 * `hours`: how long the trash keeps its saved state.
 */
export async function confirmTrash(
  state: IKernelState,
  label: (kernelId: string) => string,
  hours: number
): Promise<boolean> {
  const result = await showDialog({
    title: 'Shut down the suspended kernel?',
    body: trashWarning(label(state.kernel_id), state, hours),
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Shut Down' })]
  });
  return result.button.accept;
}

/**
 * Wrap `kernels.shutdown` / `kernels.shutdownAll` in place; returns the
 * original methods. `trashed` is told which suspended kernel went to the
 * trash, with the name it had (for the notification); `shutdownAll` asks
 * and shuts several kernels down when one of them is suspended.
 */
export function guardKernelShutdown(options: {
  kernels: Kernel.IManager;
  model: GpucrModel;
  label: (kernelId: string) => string;
  trashed: (kernelId: string, label: string) => void;
  shutdownAll: (kernelIds: string[]) => Promise<void>;
}): IKernelShutdown {
  const { kernels, model, label, trashed } = options;
  const unguarded: IKernelShutdown = {
    shutdown: kernels.shutdown.bind(kernels),
    shutdownAll: kernels.shutdownAll.bind(kernels)
  };
  const suspended = (id: string): IKernelState | undefined => {
    const state = model.getKernel(id);
    return state?.state === 'suspended' ? state : undefined;
  };

  kernels.shutdown = async (id: string) => {
    const state = suspended(id);
    if (!state) {
      return unguarded.shutdown(id);
    }
    if (!(await confirmTrash(state, label, model.trashHours))) {
      return;
    }
    const name = label(id);
    await unguarded.shutdown(id);
    trashed(id, name);
  };
  kernels.shutdownAll = () => {
    const ids = [...kernels.running()].map(k => k.id);
    return ids.some(suspended)
      ? options.shutdownAll(ids)
      : unguarded.shutdownAll();
  };
  return unguarded;
}
