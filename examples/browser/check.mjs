// Open the page in headless Chromium (Debian's /usr/bin/chromium, or CHROMIUM), wait until it has translated the
// sentences it was pointed at, print its results as one line of JSON and save a screenshot of the page.
//
//   node check.mjs "http://127.0.0.1:8000/index.html?model=en-de&sentences=sentences.json" screenshot.png
//
// The browser starts with a profile of its own and no background networking (this machine reaches no other host),
// and is closed at the end, whatever happened.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [url, screenshot, timeoutSeconds = "600"] = process.argv.slice(2);
if (!url || !screenshot) {
  console.error("usage: node check.mjs URL SCREENSHOT.png [TIMEOUT_SECONDS]");
  process.exit(2);
}
const profile = mkdtempSync(join(tmpdir(), "vanilla-transformer-chromium-"));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
  ],
  viewport: { width: 1000, height: 760 },
});
const messages = [];
try {
  const page = context.pages()[0] ?? (await context.newPage());
  page.on("console", (message) => messages.push(`${message.type()}: ${message.text()}`));
  page.on("pageerror", (error) => messages.push(`pageerror: ${error.message}`));
  await page.goto(url);
  await page.waitForFunction(() => document.title === "done", null, { timeout: Number(timeoutSeconds) * 1000 });
  const results = JSON.parse(await page.textContent("#results"));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ ...results, browser: context.browser()?.version() ?? null }));
} catch (error) {
  console.error(`the page did not translate: ${error.message}\n${messages.slice(-20).join("\n")}`);
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
