// The console in a real browser (Debian's Chromium, headless, driven by playwright-core), as
// tests/node_console.rs sets it up on the node: sign in with a token; chat on a thread and see
// the answer stream in; reload a run's page mid-run and see it continue without a repeat;
// approve a gated call from the inbox and see the run go on; be refused another namespace;
// and, as a victim who has not signed in, visit an attacker's page (another origin) that
// posts the attacker's token to the sign-in form (login CSRF): the victim stays signed out.
// A screenshot of each page goes to $SHOTS. Exits non-zero, saying why, on any failure.
import { mkdirSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { check, env, runChecks } from "./kit.mjs";

const URL = env("CONSOLE_URL");
const NS = env("NS");
const SHOTS = env("SHOTS");
mkdirSync(SHOTS, { recursive: true });
const T = 120_000;

async function shot(page, name) {
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
  console.log(`screenshot ${name}.png`);
}

async function signIn(page) {
  await page.goto(`${URL}/console`);
  check(page.url().endsWith("/console/login"), `not sent to sign in: ${page.url()}`);
  await shot(page, "01-sign-in");
  await page.fill("textarea[name=token]", env("TOKEN"));
  await page.click("button[type=submit]");
  await page.goto(`${URL}/console?ns=${NS}`);
  await page.waitForSelector("table#runs");
  await shot(page, "02-runs");
}

async function chat(page) {
  const thread = env("THREAD");
  await page.goto(`${URL}/console/ns/${NS}/threads/${thread}`);
  await page.fill("#message", "What is the capital of France?");
  await page.click("#send");
  // The turn appears, its answer streams in, and it ends Succeeded.
  const turn = page.locator("li.turn").first();
  await turn.locator(".role-assistant", { hasText: "Paris" }).first().waitFor({ timeout: T });
  await shot(page, "03-thread-answer-shown");
  await page.waitForSelector('li.turn[data-ended="Succeeded"]', { timeout: T });
  const user = await turn.locator(".role-user").allTextContents();
  check(user.some((t) => t.includes("What is the capital of France?")), `the question is not shown: ${user}`);
  await shot(page, "04-thread-answered");
}

async function reloadMidRun(page) {
  const run = env("SLOW_RUN");
  const steps = Number(env("SLOW_STEPS"));
  await page.goto(`${URL}/console/ns/${NS}/runs/${run}`);
  await page.locator("#transcript li.step").nth(1).waitFor({ timeout: T });
  await shot(page, "05-run-mid-stream");
  await page.reload();
  await page.waitForSelector('#phase[data-ended="true"]', { timeout: T });
  const labels = await page.locator("#transcript li.step .label").allTextContents();
  check(new Set(labels).size === labels.length, `a step is shown twice: ${labels}`);
  check(labels.length === steps, `expected ${steps} steps, saw ${labels.length}: ${labels}`);
  const phase = await page.textContent("#phase");
  check(phase === "Succeeded", `the run ended ${phase}`);
  const timeline = await page.locator("#timeline li").count();
  check(timeline >= 1, "no attempt on the timeline");
  await shot(page, "06-run-ended");
}

async function approveFromInbox(page) {
  const run = env("GATED_RUN");
  await page.goto(`${URL}/console/approvals?ns=${NS}`);
  const call = page.locator(`article.call[data-run="${run}"]`);
  await call.waitFor({ timeout: T });
  const args = await call.locator("pre.arguments").textContent();
  check(args.includes(env("GATED_MARK")), `the whole call is not shown: ${args}`);
  // U+202E (right-to-left override) is shown as its escape, never obeyed.
  check(args.includes("\\u{202e}txt.exe") && !args.includes("\u202e"), `U+202E is not shown escaped: ${args}`);
  const badge = await page.textContent("#approval-count");
  check(Number(badge) >= 1, `the badge shows ${badge}`);
  await shot(page, "07-inbox");
  await call.locator("input[name=reason]").fill("looks right");
  await Promise.all([page.waitForNavigation(), call.locator("button[value=Approve]").click()]);
  await page.goto(`${URL}/console/ns/${NS}/runs/${run}`);
  await page.waitForSelector('#phase[data-ended="true"]', { timeout: T });
  const phase = await page.textContent("#phase");
  check(phase === "Succeeded", `the approved run ended ${phase}`);
  await shot(page, "08-approved-run");
}

async function forbidden(page) {
  const other = env("FORBIDDEN_NS");
  const response = await page.goto(`${URL}/console?ns=${other}`);
  check(response.status() === 403, `another namespace answered ${response.status()}`);
  const refusal = await page.textContent("#refusal");
  check(/forbidden/i.test(refusal), `the refusal says: ${refusal}`);
  await shot(page, "09-forbidden-namespace");
}

// The attacker's site: a page on another loopback port (another origin) whose form posts the
// attacker's own token to the console's sign-in as soon as it loads.
function attackerSite() {
  const page = `<!doctype html><form id="f" method="post" action="${URL}/console/login">
<input name="token" value="${env("ATTACKER_TOKEN")}"><input name="nonce" value="guessed">
</form><script>document.getElementById("f").submit()</script>`;
  const server = createServer((_, res) => res.writeHead(200, { "content-type": "text/html" }).end(page));
  return new Promise((ready) => server.listen(0, "127.0.0.1", () => ready(server)));
}

async function loginCsrf(browser) {
  const site = await attackerSite();
  const victim = await (await browser.newContext({ viewport: { width: 1280, height: 900 } })).newPage();
  try {
    // The victim first sees the sign-in page, so her browser holds a sign-in nonce cookie.
    await victim.goto(`${URL}/console`);
    check(victim.url().endsWith("/console/login"), `the victim is not signed out: ${victim.url()}`);
    const posted = victim.waitForResponse((r) => r.url().endsWith("/console/login") && r.request().method() === "POST");
    await victim.goto(`http://127.0.0.1:${site.address().port}/`);
    const answer = await posted;
    check(answer.status() === 403, `the forged sign-in was answered ${answer.status()}`);
    await victim.waitForLoadState();
    const said = await victim.textContent("body");
    check(/another site/.test(said), `the refusal says: ${said}`);
    await shot(victim, "10-login-csrf-refused");
    await victim.goto(`${URL}/console?ns=${NS}`);
    const where = new globalThis.URL(victim.url()).pathname;
    check(where === "/console/login", `the victim was signed in by the attacker: ${victim.url()}`);
  } finally {
    await victim.context().close();
    site.close();
  }
}

await runChecks("console", "every check passed", async (browser, page) => {
  await signIn(page);
  await chat(page);
  await reloadMidRun(page);
  await approveFromInbox(page);
  await forbidden(page);
  await loginCsrf(browser);
});
