/**
 * The web console end to end, in a real browser (Debian's chromium driven by playwright-core)
 * against a real daemon and `forkd console`: the one-time login refused without its secret and on
 * a second use; a sandbox forked through the API appears without a reload; its terminal runs a
 * command; a branch grows the tree and is forked from; a file goes up and comes back down byte
 * for byte; a killed sandbox leaves the list; a dropped event stream says so and recovers; a
 * branch of a branch draws its memory base; logging out ends the session on the server.
 * Selectors are by role and label, which also proves the labels exist. On failure, a screenshot
 * of each page is kept under test-results/console/ (the path is printed).
 */
import { after, before } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { chromium } from "playwright-core";
import type { Browser, BrowserContext, Page, Response } from "playwright-core";
import { REPO_DIR } from "../../src/host/paths.js";
import { checkedRequest } from "../helpers/contract.js";
import { ApiError } from "../helpers/http.js";
import { CLI, makeDaemon } from "../helpers/daemon.js";
import type { TestDaemon } from "../helpers/daemon.js";
import { steps } from "../helpers/steps.js";

const SHOTS = join(REPO_DIR, "test-results", "console");
const WAIT = 60_000;

let d: TestDaemon;
let consoleProc: ChildProcess | null = null;
let loginUrl = "";
let origin = "";
let browser: Browser;
let ctx: BrowserContext;
let page: Page;
let src = "";
let grandchild = "";
const { step: rawStep, failed } = steps();

const api = <T>(method: string, path: string, body?: unknown, timeoutMs?: number) =>
  checkedRequest<T>(d.ep, method, path, body, timeoutMs);

/** Each step keeps a screenshot of the page it failed on. */
const step = (name: string, fn: () => Promise<void>) =>
  rawStep(name, async () => {
    try {
      await fn();
    } catch (e) {
      await shoot(`failed-${name}`);
      throw e;
    }
  });

async function shoot(name: string): Promise<void> {
  if (!page) return;
  await mkdir(SHOTS, { recursive: true });
  const file = join(SHOTS, `${name.replace(/[^a-z0-9]+/gi, "-").slice(0, 80)}.png`);
  await page.screenshot({ path: file, fullPage: true }).catch(() => undefined);
}

/** Starts `forkd console` as docs/operations.md says and reads its first stdout line: the login URL. */
function startConsole(): Promise<string> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [CLI, "console"], { env: d.env, stdio: ["ignore", "pipe", "pipe"] });
    consoleProc = p;
    let out = "";
    let err = "";
    const timer = setTimeout(() => reject(new Error(`forkd console printed no URL: ${err}`)), WAIT);
    p.stderr.on("data", (b: Buffer) => (err = (err + b.toString()).slice(-4096)));
    p.stdout.on("data", (b: Buffer) => {
      out += b.toString();
      const nl = out.indexOf("\n");
      if (nl < 0) return;
      clearTimeout(timer);
      resolve(out.slice(0, nl));
    });
    p.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`forkd console exited (${code}): ${err}`));
    });
  });
}

const row = (id: string) => page.getByRole("row", { name: `Sandbox ${id}` });
const node = (tag: string) => page.getByRole("button", { name: new RegExp(`^Snapshot ${tag}, `) });

async function gotoPage(hash: string, heading: RegExp): Promise<void> {
  await page.goto(`${origin}/console/${hash}`);
  await page.getByRole("heading", { level: 1, name: heading }).waitFor({ timeout: WAIT });
}

before(async () => {
  d = await makeDaemon({ FORKD_POOL_MAX: "2" });
  await api("POST", "/v1/snapshots", { tag: "con", memory_mib: 256 }, 900_000);
  loginUrl = await startConsole();
  origin = new URL(loginUrl).origin;
  // --no-sandbox only because the tests run as root, where chromium's own sandbox cannot start.
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox"],
  });
  ctx = await browser.newContext({ viewport: { width: 1280, height: 800 }, acceptDownloads: true });
  page = await ctx.newPage();
});

after(async () => {
  if (failed() && page) {
    // A screenshot of each page as it was at the end.
    for (const [hash, name] of [
      ["#/sandboxes", "sandboxes"],
      ["#/snapshots", "snapshots"],
      [`#/sandboxes/${src}`, "sandbox"],
      ["#/host", "host"],
    ] as const) {
      await page.goto(`${origin}/console/${hash}`).catch(() => undefined);
      await page.waitForTimeout(1500);
      await shoot(`end-${name}`);
    }
    process.stderr.write(`console screenshots kept in ${SHOTS}\n`);
  }
  await browser?.close().catch(() => undefined);
  consoleProc?.kill("SIGTERM");
  await d?.destroy(failed());
});

step("a login without the one-time secret, or with a wrong one, is refused", async () => {
  for (const path of ["/console/login", "/console/login?secret=wrong"]) {
    const r = await page.goto(`${origin}${path}`);
    assert.equal(r?.status(), 401, path);
    await page.getByText("login refused").waitFor({ timeout: WAIT });
  }
  // The front end itself holds no data: it loads, and shows the login page.
  assert.equal((await page.goto(`${origin}/console/`))?.status(), 200);
  await page.getByRole("heading", { level: 1, name: "Log in" }).waitFor({ timeout: WAIT });
  const v1 = await fetch(`${origin}/v1/sandboxes`);
  assert.equal(v1.status, 401);
  assert.equal(((await v1.json()) as { error: { code: string } }).error.code, "unauthenticated");
  assert.equal((await ctx.cookies()).length, 0, "a refused login sets no cookie");
});

step("the printed URL logs in once, and a second use of it is refused", async () => {
  // Nothing the page loads (its bundle, its icon, its first API calls) is a 404.
  const missing: string[] = [];
  const on404 = (r: Response) => {
    if (r.status() === 404) missing.push(r.url());
  };
  page.on("response", on404);
  await page.goto(loginUrl);
  assert.equal(new URL(page.url()).pathname, "/console/");
  await page.getByRole("heading", { level: 1, name: "Sandboxes" }).waitFor({ timeout: WAIT });
  // The page holds an event stream open (never "network idle"): its first calls are done by now.
  await page.waitForTimeout(1000);
  page.off("response", on404);
  assert.deepEqual(missing, [], "404s during the console's load");
  // The icon the page links, and where a browser asks for one unprompted.
  for (const path of ["/console/favicon.svg", "/favicon.ico"]) {
    const r = await fetch(`${origin}${path}`);
    assert.equal(r.status, 200, path);
    assert.equal(r.headers.get("content-type"), "image/svg+xml", path);
  }
  const other = await browser.newContext();
  try {
    const p2 = await other.newPage();
    const r = await p2.goto(loginUrl);
    assert.equal(r?.status(), 401);
    await p2.getByText("login refused").waitFor({ timeout: WAIT });
    assert.equal((await other.cookies()).length, 0);
  } finally {
    await other.close();
  }
});

step(
  "a stolen session cookie (replayed with X-Forkd-Console: 1, without the page's key) mints no token",
  async () => {
    // What a tenant's server on another port of this host gets from the browser: the cookie.
    const [cookie] = await ctx.cookies();
    assert.ok(cookie, "the session cookie");
    const stolen = `${cookie.name}=${cookie.value}`;
    const key = await page.evaluate<string | null>("sessionStorage.getItem('forkd_console_key')");
    assert.ok(key);
    const tokens = async () => (await api<{ tokens: unknown[] }>("GET", "/v1/tokens")).tokens.length;
    const before = await tokens();
    const mint = (headers: Record<string, string>) =>
      fetch(`${origin}/v1/tokens`, {
        method: "POST",
        headers: { ...headers, "x-forkd-console": "1", "content-type": "application/json" },
        body: JSON.stringify({ tenant: "mallory", scope: "admin" }),
      });
    const replayed = await mint({ cookie: stolen });
    assert.equal(replayed.status, 401);
    assert.equal((await fetch(`${origin}/v1/sandboxes`, { headers: { cookie: stolen } })).status, 401);
    assert.equal(await tokens(), before, "no token was minted");
    // The cookie with the page's key is the session (the page itself goes on working below).
    const minted = await mint({ cookie: stolen, "x-forkd-console-key": key });
    assert.equal(minted.status, 201);
    assert.equal(await tokens(), before + 1);
  },
);

step("a sandbox forked through the API appears in the list without a reload", async () => {
  const r = await api<{ sandboxes: { id: string }[] }>("POST", "/v1/sandboxes", {
    snapshot_tag: "con",
    n: 1,
  });
  src = r.sandboxes[0]?.id ?? "";
  assert.ok(src);
  await row(src).waitFor({ timeout: WAIT });
  assert.match((await row(src).textContent()) ?? "", /running/);
  assert.match((await row(src).textContent()) ?? "", /con/);
});

step("its page's terminal runs a command and shows the output", async () => {
  await row(src).getByRole("link", { name: src }).click();
  await page.getByRole("heading", { level: 1, name: `Sandbox ${src}` }).waitFor({ timeout: WAIT });
  const terminal = page.getByRole("region", { name: "Terminal" });
  await terminal
    .getByRole("status", { name: "Terminal status" })
    .getByText("connected")
    .waitFor({ timeout: WAIT });
  await page.getByRole("textbox", { name: "Terminal input" }).focus();
  // The output (con-42) is not in what was typed: only the shell can have written it.
  await page.keyboard.type("echo con-$((6*7))\r");
  await terminal.getByText("con-42").waitFor({ timeout: WAIT });
});

step("its commands: the terminal's shell runs, and a command that ended shows how", async () => {
  await api("POST", `/v1/sandboxes/${src}/exec`, { cmd: ["sh", "-c", "echo history-check; exit 3"] });
  const commands = page.getByRole("region", { name: "Commands" });
  const ended = commands.getByRole("table", { name: "Ended commands" });
  const line = ended.getByRole("row").filter({ hasText: "echo history-check" });
  await line.waitFor({ timeout: WAIT });
  assert.match((await line.textContent()) ?? "", /exit 3/);
  // the terminal's own command is still running
  const running = commands.getByRole("table", { name: "Running commands" });
  await running.getByRole("row").nth(1).waitFor({ timeout: WAIT });
});

step("branching it grows the tree by a child of its snapshot", async () => {
  await page.getByRole("button", { name: "Branch", exact: true }).click();
  await page.getByLabel(`New snapshot tag for ${src} (empty: generated)`).fill("con-br");
  await page.getByRole("button", { name: "Create branch" }).click();
  await page
    .getByRole("status")
    .getByText(new RegExp(`branched ${src} into con-br`))
    .waitFor({ timeout: 5 * WAIT });
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Snapshots" }).click();
  await node("con-br").waitFor({ timeout: WAIT });
  assert.equal(await page.getByRole("button", { name: /^Snapshot / }).count(), 2);
  // One edge, from the base to the branch (drawn from the snapshots' parent fields).
  assert.equal(await page.locator("svg.tree path.edge").count(), 1);
  const info = await api<{ ancestors: string[] }>("GET", "/v1/snapshots/con-br/info");
  assert.deepEqual(info.ancestors, ["con"]);
});

step("a sandbox forked from the branch in its node shows up under it", async () => {
  await node("con-br").click();
  const panel = page.getByRole("region", { name: "Snapshot con-br" });
  await panel.getByRole("button", { name: "Fork from con-br" }).click();
  await panel.getByLabel("Number of sandboxes").fill("1");
  await panel.getByRole("button", { name: "Fork", exact: true }).click();
  const done = panel.getByRole("status").getByText(/^forked sb-/);
  await done.waitFor({ timeout: 5 * WAIT });
  grandchild = /sb-[a-z2-7]{16}/.exec((await done.textContent()) ?? "")?.[0] ?? "";
  assert.ok(grandchild);
  const mine = await api<{ tag: string }>("GET", `/v1/sandboxes/${grandchild}`);
  assert.equal(mine.tag, "con-br");
  await page.getByRole("button", { name: "Snapshot con-br, ready, 1 sandboxes" }).waitFor({ timeout: WAIT });
  // A branch of it stacks its disk on con-br but maps con's memory: a dashed edge from con.
  await api("POST", `/v1/sandboxes/${grandchild}/branch`, { tag: "con-br2" }, 5 * WAIT);
  await node("con-br2").waitFor({ timeout: WAIT });
  assert.equal(await page.locator("svg.tree path.edge:not(.memory)").count(), 2);
  const memory = page.locator("svg.tree path.edge.memory");
  assert.equal(await memory.count(), 1);
  assert.equal(await memory.locator("title").textContent(), "con-br2 maps the memory of con");
  await api("DELETE", "/v1/snapshots/con-br2");
  await node("con-br2").waitFor({ state: "detached", timeout: WAIT });
});

step("a file uploaded in the file browser downloads byte for byte", async () => {
  await gotoPage(`#/sandboxes/${src}`, new RegExp(`^Sandbox ${src}$`));
  const files = page.getByRole("region", { name: "Files" });
  const bytes = randomBytes(200_000);
  await files.getByLabel("Upload a file").setInputFiles({
    name: "up.bin",
    mimeType: "application/octet-stream",
    buffer: bytes,
  });
  await files.getByRole("status").getByText("uploaded /root/up.bin").waitFor({ timeout: WAIT });
  const [download] = await Promise.all([
    page.waitForEvent("download", { timeout: WAIT }),
    files.getByRole("link", { name: "Download up.bin" }).click(),
  ]);
  const path = await download.path();
  assert.ok(path);
  assert.ok((await readFile(path)).equals(bytes), "the download is the uploaded bytes");
  assert.equal(download.suggestedFilename(), "up.bin");
});

step("a sandbox killed from the list leaves it", async () => {
  await gotoPage("#/sandboxes", /^Sandboxes$/);
  await row(grandchild).waitFor({ timeout: WAIT });
  await page.getByRole("button", { name: `Kill ${grandchild}` }).click();
  await row(grandchild).waitFor({ state: "detached", timeout: WAIT });
  await assert.rejects(
    api("GET", `/v1/sandboxes/${grandchild}`),
    (e) => e instanceof ApiError && e.status === 404,
  );
  assert.equal(await row(src).count(), 1, "the other sandbox is still listed");
});

step("deleting the branch shows the dry run first, then removes its node", async () => {
  await gotoPage("#/snapshots/con-br", /^Snapshots$/);
  const panel = page.getByRole("region", { name: "Snapshot con-br" });
  await panel.getByRole("button", { name: "Delete con-br…" }).click();
  const plan = panel.getByRole("region", { name: "What the delete would remove" });
  await plan.waitFor({ timeout: WAIT });
  assert.match((await plan.textContent()) ?? "", /Snapshots removed\s*con-br/);
  // Only a dry run so far: the branch is still there.
  await api("GET", "/v1/snapshots/con-br");
  await plan.getByRole("button", { name: "Confirm delete" }).click();
  await node("con-br").waitFor({ state: "detached", timeout: WAIT });
  await assert.rejects(api("GET", "/v1/snapshots/con-br"), (e) => e instanceof ApiError && e.status === 404);
  await node("con").waitFor({ timeout: WAIT });
});

step("a dropped event stream says so, reconnects, and the list comes back", async () => {
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Sandboxes" }).click();
  await row(src).waitFor({ timeout: WAIT });
  // The page's next try (a new EventSource, with a new ticket) gets an error reply from the
  // proxy (the daemon is down); it must go on opening new ones itself.
  const refused = page.waitForResponse(
    (r) => new URL(r.url()).pathname === "/v1/events" && r.status() >= 500,
    {
      timeout: WAIT,
    },
  );
  await d.kill9();
  await page.getByRole("alert").getByText("connection lost — reconnecting").waitFor({ timeout: WAIT });
  await refused;
  await d.start();
  await page.getByRole("alert").waitFor({ state: "detached", timeout: WAIT });
  await row(src).waitFor({ timeout: WAIT });
});

step("the host page shows health and samples the metrics", async () => {
  await page.getByRole("navigation", { name: "Main" }).getByRole("link", { name: "Host" }).click();
  const health = page.getByRole("region", { name: "Health" });
  await health.getByText(/^(kvm|tcg)/).waitFor({ timeout: WAIT });
  await page
    .getByRole("img", { name: /^forkd_/ })
    .first()
    .waitFor({ timeout: WAIT });
});

step("on a phone-sized screen the list fits its width", async () => {
  await page.setViewportSize({ width: 390, height: 844 });
  await gotoPage("#/sandboxes", /^Sandboxes$/);
  await row(src).waitFor({ timeout: WAIT });
  const overflow = await page.evaluate<number>("document.documentElement.scrollWidth - window.innerWidth");
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than the screen`);
});

step("the header says who is logged in; logging out ends the session", async () => {
  await page.setViewportSize({ width: 1280, height: 800 });
  await gotoPage("#/sandboxes", /^Sandboxes$/);
  await page.getByLabel("Logged in as").getByText("local admin").waitFor({ timeout: WAIT });
  const [cookie] = await ctx.cookies();
  assert.ok(cookie, "the session cookie");
  const key = await page.evaluate<string | null>("sessionStorage.getItem('forkd_console_key')");
  assert.ok(key, "the session's key, kept by the page");
  const creds = { cookie: `${cookie.name}=${cookie.value}`, "x-forkd-console-key": key };
  assert.equal((await fetch(`${origin}/v1/sandboxes`, { headers: creds })).status, 200);
  await page.getByRole("button", { name: "Log out" }).click();
  await page.getByRole("heading", { level: 1, name: "Log in" }).waitFor({ timeout: WAIT });
  // The old session is dead on the server, not only cleared in this browser.
  const r = await fetch(`${origin}/v1/sandboxes`, { headers: creds });
  assert.equal(r.status, 401);
  assert.equal(await page.evaluate<string | null>("sessionStorage.getItem('forkd_console_key')"), null);
  assert.equal(await page.getByRole("button", { name: "Log out" }).count(), 0);
});
