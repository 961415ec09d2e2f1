// A run that brings its own agent (tests/server/own_agent.rs wrote its ledger), on its console
// page in a real browser (Debian's Chromium, headless): each of the agent's model calls is an
// assistant entry naming the call and its API, with the answer's text whatever the API and
// whether it streamed; the step between them and the divergence are shown too.
import { check, env, runChecks } from "./kit.mjs";

const URL = env("CONSOLE_URL");
const NS = env("NS");
const RUN = env("RUN");
const T = 60_000;

await runChecks("own agent", "the agent's model calls, its step and its divergence are shown", async (_, page) => {
  await page.goto(`${URL}/console`);
  await page.fill("textarea[name=token]", env("TOKEN"));
  await page.click("button[type=submit]");
  await page.goto(`${URL}/console/ns/${NS}/runs/${RUN}`);
  const calls = page.locator("#transcript li.gateway");
  await calls.nth(2).waitFor({ timeout: T });
  const labels = await calls.locator(".label").allTextContents();
  const want = ["model call 1 (chat.completions)", "model call 2 (messages)", "model call 3 (responses)"];
  check(JSON.stringify(labels) === JSON.stringify(want), `the calls are labelled ${JSON.stringify(labels)}`);
  const texts = await calls.locator(".text").allTextContents();
  const answers = ["Let me count the files.", "There are 3 files.", "Done: 3 files. rm \\u{202e}fdp.exe"];
  check(JSON.stringify(texts) === JSON.stringify(answers), `the calls say ${JSON.stringify(texts)}`);
  const steps = await page.locator("#transcript li.step .label").allTextContents();
  check(steps.length === 1 && steps[0] === "step 1: sh", `the steps shown: ${steps}`);
  const notes = await page.locator("#transcript li.note").allTextContents();
  check(notes.some((n) => n.includes("model call 3") && n.includes("/messages/0/content")), `the divergence is not shown: ${notes}`);
  const finals = await page.locator("#transcript li.final").count();
  check(finals === 0, "the final answer is shown again after the call that gave it");
  const shown = await page.locator("#transcript").textContent();
  check(!shown.includes("\u202e"), "a right-to-left override is on the page as it came");
});
