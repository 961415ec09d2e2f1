// A run's trace in Arize Phoenix's own web UI (tests/node_traces.rs), in a real browser
// (Debian's Chromium, headless): the trace's page, reached by its OpenTelemetry id, shows the
// run's root, both attempts and the tool call the first died in; a screenshot of it is kept.
import { check, env, runChecks } from "./kit.mjs";

const URL = env("PHOENIX_URL");
const TRACE = env("TRACE_ID");
const SHOTS = env("SHOTS");
const T = 60_000;

await runChecks("phoenix", "the run's trace is shown with both attempts", async (_, page) => {
  await page.goto(`${URL}/redirects/traces/${TRACE}`);
  for (const span of [env("ROOT_SPAN"), "attempt 1", "attempt 2", env("TOOL_SPAN")]) {
    const shown = page.getByText(span, { exact: true }).first();
    await shown.waitFor({ timeout: T }).catch(() => {});
    check(await shown.isVisible(), `the trace's page shows no span "${span}" (${page.url()})`);
  }
  await page.screenshot({ path: `${SHOTS}/trace.png`, fullPage: true });
}, { theirs: true });
