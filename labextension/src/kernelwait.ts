/**
 * Waiting for a notebook's kernel that is still on its way.
 *
 * A new notebook's session is created by a request that takes as long as the
 * kernel's launch. Until it returns, the session context has no kernel, yet it
 * says "initializing" (a kernel is pending), so JupyterLab's `runCell` does
 * not offer to start one, and `CodeCell.execute` finds no kernel and clears
 * the cell without a word: the first cell, run right away, is lost. The cell
 * executor (cellexecutor.ts) waits here first.
 *
 * Pure (types only), unit-tested in src/__tests__/kernelwait.test.ts.
 */
import type { ISignal } from '@lumino/signaling';

/** What the wait needs of JupyterLab's `ISessionContext`. */
export interface IStartingSession {
  readonly isDisposed: boolean;
  readonly hasNoKernel: boolean;
  readonly kernelDisplayStatus: string;
  readonly session: { readonly kernel: unknown } | null;
  readonly kernelChanged: ISignal<any, any>;
  readonly sessionChanged: ISignal<any, any>;
  readonly statusChanged: ISignal<any, any>;
  readonly disposed: ISignal<any, any>;
}

/**
 * Whether a kernel is being started for the session and it has none yet (a
 * kernel is pending: `hasNoKernel` is false). Not when no kernel is pending:
 * JupyterLab's `runCell` then starts one or asks which, and waits for it.
 */
export function kernelOnItsWay(ctx: IStartingSession): boolean {
  return (
    !ctx.isDisposed &&
    !ctx.session?.kernel &&
    !ctx.hasNoKernel &&
    ctx.kernelDisplayStatus === 'initializing'
  );
}

const waits = new WeakMap<IStartingSession, Promise<void>>();

/**
 * Resolves once the session has its kernel, or no kernel is on its way any
 * more (the start failed, the user chose no kernel, the notebook closed).
 * Every caller of one session shares one promise, so cells waiting together
 * go on in the order they were run.
 */
export function untilKernel(ctx: IStartingSession): Promise<void> {
  if (!kernelOnItsWay(ctx)) {
    return Promise.resolve();
  }
  let wait = waits.get(ctx);
  if (!wait) {
    wait = new Promise<void>(resolve => {
      const signals = [
        ctx.kernelChanged,
        ctx.sessionChanged,
        ctx.statusChanged,
        ctx.disposed
      ];
      const check = () => {
        if (kernelOnItsWay(ctx)) {
          return;
        }
        signals.forEach(s => s.disconnect(check));
        waits.delete(ctx);
        resolve();
      };
      signals.forEach(s => s.connect(check));
    });
    waits.set(ctx, wait);
  }
  return wait;
}
