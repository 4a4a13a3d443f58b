/**
 * JupyterLab's kernel status in the status bar ("Python 3 (ipykernel) |
 * Idle"), whose model says "Suspended to disk" (or "Suspending…",
 * "Restoring…") while gpucr moves the kernel to disk, keeps it there or
 * brings it back. JupyterLab's model maps kernel statuses through a fixed
 * table; this subclass answers for the states the table cannot know.
 */
import { ISessionContext, KernelStatus } from '@jupyterlab/apputils';
import { ITranslator } from '@jupyterlab/translation';

import { GpucrModel } from './model';
import type { IKernelTransition } from './store';
import type { KernelStateName } from './types';

const WORDS: { [state in KernelStateName]?: string } = {
  suspending: 'Suspending to disk…',
  suspended: 'Suspended to disk',
  restoring: 'Restoring from disk…'
};

export class GpucrKernelStatusModel extends KernelStatus.Model {
  constructor(translator: ITranslator | undefined, model: GpucrModel) {
    super(translator);
    this._gpucr = model;
    model.kernelChanged.connect(this._onGpucrChanged, this);
  }

  get status(): string | undefined {
    const state = this._gpucr.getKernel(this._kernelId())?.state;
    return (state && WORDS[state]) || super.status;
  }

  get sessionContext(): ISessionContext | null {
    return super.sessionContext;
  }
  set sessionContext(value: ISessionContext | null) {
    super.sessionContext = value;
    this.stateChanged.emit();
  }

  dispose(): void {
    this._gpucr.kernelChanged.disconnect(this._onGpucrChanged, this);
    super.dispose();
  }

  private _kernelId(): string | undefined {
    return this.sessionContext?.session?.kernel?.id;
  }

  private _onGpucrChanged(_: GpucrModel, change: IKernelTransition): void {
    if (
      change.kernelId === this._kernelId() &&
      change.previous?.state !== change.current?.state
    ) {
      this.stateChanged.emit();
    }
  }

  private _gpucr: GpucrModel;
}
