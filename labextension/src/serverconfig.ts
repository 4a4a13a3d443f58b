/**
 * What the server's configuration tells the page. The gpucr server extension
 * writes it into JupyterLab's page config (jupyter_gpucr/server/app.py), so
 * that it is known before the first request.
 */
import { PageConfig } from '@jupyterlab/coreutils';

/** The page config option that holds `c.GPUCR.trash_hours`. */
export const TRASH_HOURS_OPTION = 'gpucrTrashHours';

/** The server's default, for a page whose server does not say. */
const DEFAULT_TRASH_HOURS = 24;

/** Hours a shut down or restarted kernel's saved state stays in the trash. */
export function trashHours(): number {
  const value = PageConfig.getOption(TRASH_HOURS_OPTION);
  const hours = value === '' ? NaN : Number(value);
  return Number.isFinite(hours) && hours >= 0 ? hours : DEFAULT_TRASH_HOURS;
}
