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

// Runs `checks(browser, page)` in a fresh headless Chromium; prints `passed` or exits 1. A
// script error of the page fails the run, unless the page is another project's (`theirs`):
// then it is printed, since it says nothing of baton.
export async function runChecks(name, passed, checks, { theirs = false } = {}) {
  const browser = await launch();
  let failed = null;
  try {
    const page = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
    page.on("pageerror", (e) => {
      if (theirs) console.error(`script error on the page (not baton's): ${e.message}`);
      else failed = failed || new Error(`script error on the page: ${e.message}`);
    });
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

// Debian's Chromium, headless. A launch is tried up to three times: on a loaded 2-core machine
// with several browser tests starting at once, Chromium has been seen to die before its first
// page ("Target page, context or browser has been closed" from `launch`), which says nothing
// about the page under test. Each failed launch is printed, so a browser that never starts
// still fails the test with all three reasons.
async function launch() {
  const failures = [];
  for (let attempt = 1; attempt <= 3; attempt++) {
    try {
      return await chromium.launch({
        executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
        headless: true,
        args: ["--no-sandbox"],
      });
    } catch (e) {
      failures.push(e);
      console.error(`Chromium launch ${attempt} of 3 failed: ${String(e.message || e).split("\n")[0]}`);
      await new Promise((r) => setTimeout(r, 500 * attempt));
    }
  }
  throw new Error(`Chromium did not start in 3 launches:\n${failures.map((e) => e.stack || e).join("\n")}`);
}
