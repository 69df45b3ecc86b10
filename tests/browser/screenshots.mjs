// Screenshots of the web page's views for the docs, from a server started as
// the README's web command starts it (docs/webui.md):
//
//   node tests/browser/screenshots.mjs http://127.0.0.1:8080 docs/img "Where does Hosshe live?" [FLEET_URL]
//
// Chromium: $CHROMIUM or /usr/bin/chromium; playwright-core from tests/node.
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const { chromium } = require("../node/node_modules/playwright-core");
const [url, out, question, fleetUrl] = process.argv.slice(2);
if (!url || !out || !question) {
  console.error("usage: node tests/browser/screenshots.mjs URL OUT_DIR QUESTION [FLEET_URL]");
  process.exit(2);
}
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"] });
const page = await browser.newPage({ viewport: { width: 1000, height: 640 } });
const done = (fn) => page.waitForFunction(fn, null, { timeout: 120000 });

await page.goto(url + "/#chat");
await done(() => document.querySelector("#model-list option"));
for (const q of [question, "And what else do you know about that person?"]) {
  await page.fill("#chat-input", q);
  await page.click("#chat-send");
  await done(() => { const m = [...document.querySelectorAll(".msg.assistant")].pop(); return m && !m.classList.contains("streaming"); });
}
await page.screenshot({ path: `${out}/webui-chat.png` });

await page.goto(url + "/#compare");
await done(() => /corpus in context|no corpus/.test(document.getElementById("compare-note").textContent));
await page.fill("#compare-input", question);
await page.click("#compare-send");
await done(() => document.querySelectorAll(".arm .stats").length === 3 && !document.getElementById("compare-send").disabled);
if (await page.locator("#qa-run").isVisible()) {
  await page.click("#qa-run");
  await done(() => /done|\d{3}:/.test(document.getElementById("qa-status").textContent));
}
await page.screenshot({ path: `${out}/webui-compare.png` });

await page.goto(url + "/#training");
await done(() => document.querySelector("#train-last-loss") || !document.getElementById("train-off").hidden);
await page.waitForTimeout(500);
await page.screenshot({ path: `${out}/webui-training.png` });

if (fleetUrl) {
  await page.goto(fleetUrl + "/#fleet");
  await done(() => document.querySelector("#fleet-table tr[data-doc]"));
  await page.fill("#fleet-input", question);
  await page.click("#fleet-send");
  await done(() => /composed|\d{3}:/.test(document.getElementById("fleet-answer").textContent));
  await page.screenshot({ path: `${out}/webui-fleet.png` });
}
await browser.close();
