/**
 * Playwright configuration for the jupyter-gpucr UI tests.
 *
 * Uses the system Chromium (Debian's `chromium` package); Playwright's own
 * browser builds are never downloaded (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1).
 * run.sh starts the Jupyter server; `jlpm test` alone starts one too.
 */
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const port = process.env.GPUCR_UI_PORT || '8899';
const chromium = process.env.GPUCR_CHROMIUM || '/usr/bin/chromium';

module.exports = {
  ...baseConfig,
  testDir: './tests',
  outputDir: './test-results/output',
  // One Jupyter server, kernels suspended with CRIU: no parallel workers.
  workers: 1,
  fullyParallel: false,
  // A test that fails is run once more, in a fresh page: passing then, it is
  // reported "flaky" with its first failure (and what the browser said) in
  // the log; failing twice, it fails the run.
  retries: 1,
  timeout: 240000,
  expect: { timeout: 30000 },
  reporter: [
    ['list'],
    ['html', { open: 'never', outputFolder: './test-results/report' }]
  ],
  use: {
    ...baseConfig.use,
    baseURL: `http://127.0.0.1:${port}`,
    viewport: { width: 1280, height: 800 },
    // No ffmpeg without a Playwright browser download: no video.
    video: 'off',
    // A click on something that never comes fails in 30 s, not at the test's timeout.
    actionTimeout: 30000,
    trace: 'retain-on-failure',
    screenshot: 'only-on-failure',
    launchOptions: {
      executablePath: chromium,
      args: [
        '--no-sandbox',
        '--disable-gpu',
        '--disable-dev-shm-usage',
        '--disable-background-networking',
        '--disable-quic',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run'
      ]
    }
  },
  webServer: {
    command: 'jlpm start',
    url: `http://127.0.0.1:${port}/lab`,
    timeout: 120 * 1000,
    reuseExistingServer: true
  }
};
