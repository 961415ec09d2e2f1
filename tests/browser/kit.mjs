// What the browser tests share: their settings from the environment, a check that fails
// saying why, Debian's Chromium launched headless, and a run of checks that exits non-zero
// on the first failure or on any script error of the page.
import { chromium } from "playwright-core";

export function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

export function check(cond, what) {
  if (!cond) throw new Error(what);
}

// Runs `checks(browser, page)` in a fresh headless Chromium; prints `passed` or exits 1.
export async function runChecks(name, passed, checks) {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox"],
  });
  let failed = null;
  try {
    const page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
    page.on("pageerror", (e) => { failed = failed || new Error(`script error on the page: ${e.message}`); });
    await checks(browser, page);
    if (failed) throw failed;
    console.log(`${name}: ${passed}`);
  } catch (e) {
    failed = e;
  } finally {
    await browser.close();
  }
  if (failed) {
    console.error(`${name} test failed: ${failed.stack || failed}`);
    process.exit(1);
  }
}
