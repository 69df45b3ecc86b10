// Drives the web page (web/, served by recipes/serve.lua) in headless
// Chromium through playwright-core, and prints what it saw as one JSON
// object for tests/lua/browser_spec.lua to check. It asserts nothing itself
// beyond what it must wait for; a wait that runs out is an error (exit 1).
//
// Environment:
//   CARTRIDGE_URL        the server with a cartridge "facts", --corpus, --qa, --training live=...
//   CARTRIDGE_FLEET_URL  a server with --fleet (optional: the fleet part is left out without it)
//   CHROMIUM             the browser (Debian's /usr/bin/chromium)
//   OUT_DIR              where the screenshots go
//   QUESTION             what the chat and compare views ask (one the cartridge answers right)
//   TRAIN_CMD            a JSON array: the self-study run the training view follows (started here,
//                        once the view shows the run as waiting)
import { createRequire } from "node:module";
import { spawn } from "node:child_process";

const require = createRequire(import.meta.url);
const { chromium } = require("../node/node_modules/playwright-core");

const url = process.env.CARTRIDGE_URL, fleetUrl = process.env.CARTRIDGE_FLEET_URL, out = process.env.OUT_DIR;
const question = process.env.QUESTION || "Where does Hosshe live?";
const result = { errors: [] };
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"] });
const page = await browser.newPage({ viewport: { width: 1100, height: 760 } });
page.on("pageerror", (e) => result.errors.push(e.message));
const health = async () => (await fetch(url + "/health")).json();
const text = (sel) => page.textContent(sel);

async function send(question, { model, extra = "", maxTokens = "64" } = {}) {
  await page.fill("#chat-extra", extra);
  await page.fill("#chat-max-tokens", maxTokens);
  if (model !== undefined) { await page.fill("#chat-model", model); }
  await page.fill("#chat-input", question);
  await page.click("#chat-send");
}
const lastAssistant = ".msg.assistant:last-of-type";
const settled = () => page.waitForFunction(() => {
  const m = [...document.querySelectorAll(".msg.assistant")].pop();
  return m && !m.classList.contains("streaming");
}, null, { timeout: 30000 });

async function chat() {
  await page.goto(url + "/#chat");
  await page.waitForFunction(() => document.querySelector("#model-list option"), null, { timeout: 10000 });
  await page.click("details.settings summary");
  await send(question, { model: "facts" });
  await settled();
  result.chat = { reply: await text(`${lastAssistant} .body`), stats: await text(`${lastAssistant} .stats`),
    info: await text("#chat-model-info") };
  // a second turn of the same conversation reuses the first one's cached tokens
  await send(question, { model: "facts" });
  await settled();
  result.chat.second_stats = await text(`${lastAssistant} .stats`);
  await page.screenshot({ path: `${out}/chat.png` });

  // stop: a long greedy run of the bare model, stopped after its first piece
  await page.click("#chat-clear");
  const bare = await page.evaluate(() => UI.bare().id);
  await send("Tell me everything.", { model: bare, maxTokens: "900" });
  await page.waitForFunction(() => {
    const m = [...document.querySelectorAll(".msg.assistant")].pop();
    return m && m.querySelector(".body").textContent.length > 0;
  }, null, { timeout: 30000 });
  const busy = (await health()).slots_processing;
  await page.click("#chat-stop");
  await settled();
  const t0 = Date.now();
  let after = await health();
  while (after.slots_processing > 0 && Date.now() - t0 < 3000) { await new Promise((r) => setTimeout(r, 50)); after = await health(); }
  const slots = await (await fetch(url + "/slots")).json();
  result.stop = { busy_before: busy, stats: await text(`${lastAssistant} .stats`), after, freed_ms: Date.now() - t0,
    slots_processing: slots.filter((s) => s.is_processing).length, chars: (await text(`${lastAssistant} .body`)).length };

  // model output that holds markup renders as text
  await page.click("#chat-clear");
  const evil = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2"> **bold**';
  await send("Say it.", { model: "facts", maxTokens: "400", extra: JSON.stringify({ response_format: { type: "json_schema",
    json_schema: { name: "evil", schema: { enum: [evil] } } } }) });
  await settled();
  result.escape = { reply: await text(`${lastAssistant} .body`), pwned: await page.evaluate(() => window.__pwned ?? null),
    scripts: await page.locator("#chat-log script").count(), imgs: await page.locator("#chat-log img").count(),
    strong: await page.locator(`${lastAssistant} .body strong`).count(),
    expected: JSON.stringify(evil).replace("**bold**", "bold") };

  // the server's 4xx text, not a hang: an unknown model, then a prompt over --ctx
  await page.click("#chat-clear");
  await send("hello", { model: "no-such-cartridge", extra: "" });
  await page.waitForSelector(`${lastAssistant} .error`, { timeout: 10000 });
  result.unknown = await text(`${lastAssistant} .error`);
  await page.click("#chat-clear");
  await send("word ".repeat(3000), { model: "facts" });
  await page.waitForSelector(`${lastAssistant} .error`, { timeout: 10000 });
  result.oversized = await text(`${lastAssistant} .error`);
  await page.fill("#chat-input", "");
}

async function compare() {
  await page.goto(url + "/#compare");
  await page.waitForFunction(() => /corpus in context/.test(document.getElementById("compare-note").textContent), null, { timeout: 10000 });
  await page.fill("#compare-input", question);
  await page.click("#compare-send");
  await page.waitForFunction(() => {
    const s = [...document.querySelectorAll(".arm .stats")];
    return s.length === 3 && s.every((e) => /finish|error/.test(e.textContent)) && !document.getElementById("compare-send").disabled;
  }, null, { timeout: 30000 });
  result.compare = await page.$$eval(".arm", (arms) => arms.map((a) => ({ key: a.dataset.arm,
    title: a.querySelector("h3").textContent, reply: a.querySelector(".body").textContent, stats: a.querySelector(".stats").textContent })));
  await page.click("#qa-run");
  await page.waitForFunction(() => /done|HTTP|\d{3}:/.test(document.getElementById("qa-status").textContent), null, { timeout: 120000 });
  result.qa_status = await text("#qa-status");
  result.qa = await page.$$eval("#qa-table tr[data-arm]", (rows) => rows.map((r) => ({ arm: r.dataset.arm,
    rows: Number(r.children[1].textContent),
    sets: Object.fromEntries([...r.querySelectorAll("td[data-set]")].map((c) => [c.dataset.set, [Number(c.dataset.right), Number(c.dataset.total)]])) })));
  result.qa_details = await page.locator("#qa-details tr").count();
  await page.screenshot({ path: `${out}/compare.png` });
}

async function training() {
  await page.goto(url + "/#training");
  await page.waitForFunction(() => document.getElementById("train-state").textContent !== "", null, { timeout: 10000 });
  const states = [await text("#train-state")];
  const cmd = JSON.parse(process.env.TRAIN_CMD);
  const child = spawn(cmd[0], cmd.slice(1), { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => { stderr += d; });
  let exitedAt = null;
  const exited = new Promise((r) => child.on("exit", (code) => { exitedAt = Date.now(); r(code); }));
  const t0 = Date.now();
  let seenSteps = 0;
  for (;;) {
    const s = await text("#train-state");
    if (states[states.length - 1] !== s) states.push(s);
    if (s === "running" && await page.locator("#train-last-loss").count()) seenSteps += 1;
    if (s === "finished" && states.includes("running")) break;
    if (Date.now() - t0 > 900000 || (exitedAt && Date.now() - exitedAt > 5000)) throw new Error(`the training view never showed the run finished: ${states.join(" -> ")}; ${stderr}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  const code = await exited;
  await page.waitForTimeout(1500); // one more poll after the last line
  const loss = page.locator("#train-last-loss");
  result.training = { states, polls_with_steps: seenSteps, exit: code, stderr: stderr.slice(-500),
    loss: Number(await loss.getAttribute("data-loss")), step: Number(await loss.getAttribute("data-step")),
    summary: await text("#train-summary"), paths: await page.locator("#train-loss-plot svg path").count() };
  await page.screenshot({ path: `${out}/training.png` });
}

async function fleet() {
  await page.goto(fleetUrl + "/#fleet");
  await page.waitForSelector("#fleet-table tr[data-doc]", { timeout: 10000 });
  result.fleet = { docs: await page.$$eval("#fleet-table tr[data-doc]", (r) => r.map((x) => x.dataset.doc)) };
  await page.fill("#fleet-input", question);
  await page.click("#fleet-send");
  await page.waitForFunction(() => /composed/.test((document.querySelector("#fleet-answer .stats") || {}).textContent || "")
    || document.querySelector("#fleet-answer .error"), null, { timeout: 30000 });
  result.fleet.stats = await text("#fleet-answer");
  await page.waitForTimeout(300);
  result.fleet.mapped = await page.$$eval("#fleet-table tr[data-doc]", (r) => r.map((x) => x.lastChild.textContent));
  await page.screenshot({ path: `${out}/fleet.png` });
  // and the page without a fleet says so
  await page.goto(url + "/#fleet");
  await page.waitForFunction(() => !document.getElementById("fleet-off").hidden, null, { timeout: 10000 });
  result.fleet.off = await text("#fleet-off");
}

try {
  await chat();
  await compare();
  await training();
  if (fleetUrl) await fleet();
} catch (e) {
  result.failed = String(e && e.stack || e);
}
await browser.close();
console.log(JSON.stringify(result));
process.exit(result.failed ? 1 : 0);
