/**
 * When the model asks the server: a `Poll` every `interval` (the
 * `pollInterval` setting), every second while an operation runs, standing by
 * while the page is hidden; and the one clock every "… ago" is counted from.
 *
 * It knows nothing of what a poll fetches (the model's `tick`): events carry
 * each kernel's state, so polling is the fallback for what no event says (a
 * kernel started or shut down, the lists) and for a lost event connection.
 */
import type { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

/** Poll interval while an operation runs (`fast()` is true). */
export const FAST_POLL_MS = 1000;
/** The shortest `interval` accepted. */
export const MIN_POLL_MS = 500;
/** How often the shared clock (`Poller.now`) advances. */
export const CLOCK_MS = 15000;

export class Poller implements IDisposable {
  constructor(options: Poller.IOptions) {
    this._fast = options.fast;
    this._interval = Math.max(MIN_POLL_MS, options.interval ?? 3000);
    this._poll = new Poll({
      name: 'jupyter-gpucr:kernels',
      factory: options.tick,
      frequency: {
        interval: this._interval,
        backoff: false,
        max: Poll.MAX_INTERVAL
      },
      standby: 'when-hidden'
    });
    this._clock = setInterval(() => {
      this._now = new Date();
      this._ticked.emit();
    }, options.clockInterval ?? CLOCK_MS);
  }

  /**
   * The time every view says "… ago" from: one clock, so that the status
   * bar, the side panel and the Running sidebar agree.
   */
  get now(): Date {
    return this._now;
  }

  /** Emitted when `now` advances: views showing ages render again. */
  get ticked(): ISignal<this, void> {
    return this._ticked;
  }

  /** Milliseconds between polls while no operation runs. */
  get interval(): number {
    return this._interval;
  }
  set interval(value: number) {
    this._interval = Math.max(MIN_POLL_MS, value);
    this.pace();
  }

  /** Milliseconds between polls now: `FAST_POLL_MS` or `interval`. */
  get currentInterval(): number {
    return this._poll.frequency.interval;
  }

  /**
   * Poll every second while `fast()`, else every `interval`; call when
   * `fast()` may have changed. A faster pace starts now, not after the slower
   * interval.
   */
  pace(): void {
    if (this._isDisposed) {
      return;
    }
    const interval = this._fast() ? FAST_POLL_MS : this._interval;
    const current = this._poll.frequency.interval;
    if (interval === current) {
      return;
    }
    this._poll.frequency = { ...this._poll.frequency, interval };
    if (interval < current) {
      void this._poll.schedule({ interval, phase: 'refreshed' });
    }
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    clearInterval(this._clock);
    this._poll.dispose();
    Signal.clearData(this);
  }

  private readonly _fast: () => boolean;
  private _interval: number;
  private readonly _poll: Poll;
  private readonly _clock: ReturnType<typeof setInterval>;
  private _now = new Date();
  private readonly _ticked = new Signal<this, void>(this);
  private _isDisposed = false;
}

export namespace Poller {
  export interface IOptions {
    /** One poll: what the model fetches. */
    tick: () => Promise<void>;
    /** Whether an operation runs (poll every second). */
    fast: () => boolean;
    /** Milliseconds between polls otherwise (default 3000). */
    interval?: number;
    /** Milliseconds between the clock's advances (default `CLOCK_MS`). */
    clockInterval?: number;
  }
}
