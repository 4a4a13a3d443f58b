/** Icons of the extension (themable through the `jp-icon3` class). */
import { LabIcon } from '@jupyterlab/ui-components';

import gpuSvg from '../style/icons/gpu.svg';
import resumeSvg from '../style/icons/resume.svg';
import suspendSvg from '../style/icons/suspend.svg';

export const suspendIcon = new LabIcon({
  name: 'jupyter-gpucr:suspend',
  svgstr: suspendSvg
});

export const resumeIcon = new LabIcon({
  name: 'jupyter-gpucr:resume',
  svgstr: resumeSvg
});

export const gpuIcon = new LabIcon({
  name: 'jupyter-gpucr:gpu',
  svgstr: gpuSvg
});
