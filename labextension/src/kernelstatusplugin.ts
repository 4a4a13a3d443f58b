/**
 * The plugin that replaces JupyterLab's kernel status in the status bar
 * (`@jupyterlab/apputils-extension:kernel-status`, disabled in package.json):
 * the same item, made as JupyterLab makes it, with a model that says when a
 * kernel is suspended to disk (kernelstatus.ts). JupyterLab 4 has no other
 * way to change what the item says.
 */
import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  IKernelStatusModel,
  ISessionContext,
  ISessionContextDialogs,
  KernelStatus
} from '@jupyterlab/apputils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { ITranslator } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { GpucrKernelStatusModel } from './kernelstatus';
import { GpucrModel } from './model';
import { IGpucrModel } from './tokens';

/**
 * JupyterLab's kernel status item (as `@jupyterlab/apputils-extension:kernel-status`
 * makes it), with a model that knows the suspended states.
 */
export const kernelStatusPlugin: JupyterFrontEndPlugin<IKernelStatusModel> = {
  id: 'jupyter-gpucr:kernel-status',
  description:
    "JupyterLab's kernel status in the status bar, saying when a kernel is suspended to disk.",
  autoStart: true,
  requires: [IStatusBar, IGpucrModel],
  provides: IKernelStatusModel,
  optional: [ISessionContextDialogs, ITranslator, ILabShell],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar,
    model: GpucrModel,
    dialogs: ISessionContextDialogs | null,
    translator: ITranslator | null,
    labShell: ILabShell | null
  ) => {
    const selectKernel = async () => {
      if (item.model.sessionContext) {
        await dialogs?.selectKernel(item.model.sessionContext);
      }
    };
    const item = new KernelStatus(
      {
        onClick: selectKernel,
        onKeyDown: async event => {
          if (['Enter', 'Spacebar', ' '].includes(event.key)) {
            event.preventDefault();
            event.stopPropagation();
            return selectKernel();
          }
        }
      },
      translator ?? undefined
    );
    item.model = new GpucrKernelStatusModel(translator ?? undefined, model);
    const providers = new Set<(w: Widget | null) => ISessionContext | null>();
    const onTitle = (title: { label: string }) => {
      item.model.activityName = title.label;
    };
    const onCurrent = (
      _: unknown,
      change: { oldValue: Widget | null; newValue: Widget | null }
    ) => {
      change.oldValue?.title.changed.disconnect(onTitle);
      item.model.sessionContext =
        [...providers].map(p => p(change.newValue)).find(c => c !== null) ??
        null;
      if (change.newValue && item.model.sessionContext) {
        onTitle(change.newValue.title);
        change.newValue.title.changed.connect(onTitle);
      }
    };
    labShell?.currentChanged.connect(onCurrent);
    statusBar.registerStatusItem(kernelStatusPlugin.id, {
      priority: 1,
      item,
      align: 'left',
      rank: 1,
      isActive: () => item.model.sessionContext !== null
    });
    return {
      addSessionProvider: provider => {
        providers.add(provider);
        if (app.shell.currentWidget) {
          onCurrent(app.shell, {
            newValue: app.shell.currentWidget,
            oldValue: null
          });
        }
      }
    };
  }
};
