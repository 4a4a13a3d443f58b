/**
 * The user's settings (`jupyter-gpucr:plugin`, schema/plugin.json): read
 * once loaded and on every change, and handed to what they configure;
 * `confirmSuspend` is asked by the suspend command, whose "Do not ask again"
 * turns it off.
 */
import type { ISettingRegistry } from '@jupyterlab/settingregistry';

import { PLUGIN_ID } from './tokens';

/** The settings as the features use them. */
export interface IGpucrSettings {
  confirmSuspend: boolean;
  restoreAhead: boolean;
  /** Milliseconds between status polls. */
  pollInterval: number;
  showStatusBar: boolean;
}

/**
 * The settings from their composite values (`get(key)`); a missing or
 * invalid poll interval is the default 3 s.
 */
export function readSettings(get: (key: string) => unknown): IGpucrSettings {
  const seconds = Number(get('pollInterval') ?? 3);
  return {
    confirmSuspend: get('confirmSuspend') !== false,
    restoreAhead: get('restoreAhead') !== false,
    pollInterval: (isFinite(seconds) && seconds > 0 ? seconds : 3) * 1000,
    showStatusBar: get('showStatusBar') !== false
  };
}

export class GpucrSettings {
  /** Loads the settings (if there is a registry) and hands them to `apply`, now and on every change. */
  constructor(
    registry: ISettingRegistry | null,
    private readonly _apply: (settings: IGpucrSettings) => void
  ) {
    if (!registry) {
      return;
    }
    registry
      .load(PLUGIN_ID)
      .then(loaded => {
        this._loaded = loaded;
        this._read(loaded);
        loaded.changed.connect(this._read, this);
      })
      .catch(reason => {
        console.error('gpucr: failed to load settings.', reason);
      });
  }

  /** Whether to ask before suspending. */
  get confirmSuspend(): boolean {
    return this._confirmSuspend;
  }

  /** "Do not ask again": stop asking before suspending, and save that. */
  async disableConfirmSuspend(): Promise<void> {
    this._confirmSuspend = false;
    if (this._loaded) {
      await this._loaded.set('confirmSuspend', false);
    }
  }

  private _read(loaded: ISettingRegistry.ISettings): void {
    const settings = readSettings(key => loaded.get(key).composite);
    this._confirmSuspend = settings.confirmSuspend;
    this._apply(settings);
  }

  private _loaded: ISettingRegistry.ISettings | null = null;
  private _confirmSuspend = true;
}
