// A run whose answer is stored as chunks (tests/server/chunked.rs wrote its ledger), on its
// console page in a real browser (Debian's Chromium, headless): the answer is shown once and
// whole. The server sends it rebuilt; the page decodes no chunk.
import { check, env, runChecks } from "./kit.mjs";

const URL = env("CONSOLE_URL");
const NS = env("NS");
const RUN = env("RUN");
const LENGTH = Number(env("LENGTH"));
const T = 60_000;

await runChecks("chunked", "the answer stored as chunks is shown once, whole", async (_, page) => {
  await page.goto(`${URL}/console`);
  await page.fill("textarea[name=token]", env("TOKEN"));
  await page.click("button[type=submit]");
  await page.goto(`${URL}/console/ns/${NS}/runs/${RUN}`);
  const answers = page.locator("#transcript li.role-assistant .text");
  await answers.first().waitFor({ timeout: T });
  const texts = await answers.allTextContents();
  check(texts.length === 1, `the answer is shown ${texts.length} times`);
  check(texts[0].length === LENGTH, `the answer shown has ${texts[0].length} characters, not ${LENGTH}`);
  check(/^y+$/.test(texts[0]), `the answer shown is not the one stored: ${texts[0].slice(0, 80)}`);
});
