/**
 * The web console's cluster views in a real browser (Debian's chromium driven by playwright-core)
 * against a gateway over a fake etcd and fake nodes (test/helpers/fake-cluster.ts) and against
 * one daemon's API with no VM (test/helpers/services.ts): on a gateway an admin gets Nodes in
 * the navigation, each node's state, address, machine, capacity, sandboxes and held snapshots,
 * refreshed as its record changes; the sandbox list and a sandbox's page name its node. A tenant
 * gets no Nodes; one daemon neither (the console asks no route it lacks: no 404 while it loads),
 * its list has no Node column, and #/nodes says why, with no error thrown in the page.
 */
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { join } from "node:path";
import { chromium } from "playwright-core";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { ConsoleSessions } from "../../src/access/console-sessions.js";
import { REPO_DIR } from "../../src/host/paths.js";
import { fakeCluster, until } from "../helpers/fake-cluster.js";
import type { FakeCluster } from "../helpers/fake-cluster.js";
import { call } from "../helpers/gateway.js";
import { testServices } from "../helpers/services.js";
import type { TestServices } from "../helpers/services.js";

const DIST = join(REPO_DIR, "console", "dist");
const WAIT = 15_000;

let browser: Browser;
/** The browser contexts a test opened: closed before its servers stop (their streams end first). */
const contexts: BrowserContext[] = [];

async function closePages(): Promise<void> {
  for (const ctx of contexts.splice(0)) await ctx.close().catch(() => undefined);
}

before(async () => {
  // --no-sandbox only because the tests run as root, where chromium's own sandbox cannot start.
  browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox"],
  });
});

after(async () => {
  await browser?.close().catch(() => undefined);
});

interface LoggedIn {
  page: Page;
  /** Errors thrown in the page. */
  errors: string[];
  /** Every 404 the page was answered, and every call it made to /v1/nodes. */
  missing: string[];
  nodesCalls: string[];
  /** The page's GET /v1/health after the login answered (its body). */
  health: Promise<Record<string, unknown>>;
}

/** A fresh page logged in at `origin` with `token` (the login page's form), watched. */
async function loggedIn(origin: string, token: string): Promise<LoggedIn> {
  const ctx = await browser.newContext({ viewport: { width: 1400, height: 900 } });
  contexts.push(ctx);
  const page = await ctx.newPage();
  const w = { errors: [] as string[], missing: [] as string[], nodesCalls: [] as string[] };
  page.on("pageerror", (e) => w.errors.push(e.message));
  page.on("response", (r) => {
    if (r.status() === 404) w.missing.push(r.url());
  });
  page.on("request", (r) => {
    if (new URL(r.url()).pathname === "/v1/nodes") w.nodesCalls.push(r.url());
  });
  await page.goto(`${origin}/console/#/sandboxes`);
  await page.getByRole("heading", { level: 1, name: "Log in" }).waitFor({ timeout: WAIT });
  const health = page
    .waitForResponse((r) => new URL(r.url()).pathname === "/v1/health", { timeout: WAIT })
    .then(async (r) => (await r.json()) as Record<string, unknown>);
  // A tenant's console asks no health: nothing waits for it then.
  health.catch(() => undefined);
  await page.getByLabel("API token").fill(token);
  await page.getByRole("button", { name: "Log in" }).click();
  await page.getByRole("heading", { level: 1, name: "Sandboxes" }).waitFor({ timeout: WAIT });
  return { page, health, ...w };
}

const nav = (page: Page) => page.getByRole("navigation", { name: "Main" });
const cell = (page: Page, row: string, column: string) =>
  page.getByRole("row", { name: row, exact: true }).locator(`[data-label="${column}"]`);

test("a gateway: Nodes lists each node as its record says; the sandbox list and page name the node", async () => {
  const c: FakeCluster = await fakeCluster({ nodes: 2, consoleDist: DIST });
  try {
    const fork = await call<{ sandboxes: { id: string; node: string }[] }>(
      c.gw.url,
      "POST",
      "/v1/sandboxes",
      {
        token: "admin-token",
        body: { snapshot_tag: "app", n: 3 },
      },
    );
    assert.equal(fork.status, 201, JSON.stringify(fork.body));
    const made = fork.body.sandboxes;
    assert.equal(made.length, 3);
    const { page, errors, health } = await loggedIn(c.gw.url, "admin-token");
    assert.deepEqual((await health).cluster, { nodes: 2, etcd: true }, "a gateway says it is one");

    // The list: a Node column, each row its sandbox's node.
    await page.getByRole("columnheader", { name: "Node" }).waitFor({ timeout: WAIT });
    for (const s of made) assert.equal(await cell(page, `Sandbox ${s.id}`, "Node").textContent(), s.node);
    // Filtered by a node: only its sandboxes.
    const first = made[0]!;
    await page.getByRole("combobox", { name: /^Node\b/ }).selectOption(first.node);
    await page
      .getByText(`${made.filter((s) => s.node === first.node).length} of 3 sandboxes`)
      .waitFor({ timeout: WAIT });
    // A sandbox's page names its node.
    await page.goto(`${c.gw.url}/console/#/sandboxes/${first.id}`);
    await page.getByRole("heading", { level: 1, name: `Sandbox ${first.id}` }).waitFor({ timeout: WAIT });
    const node = page.locator("dl.summary dt", { hasText: /^Node$/ });
    assert.equal(await node.locator("xpath=following-sibling::dd[1]").textContent(), first.node);

    // Nodes: one row per node, as their records say.
    await nav(page).getByRole("link", { name: "Nodes" }).click();
    await page.getByRole("heading", { level: 1, name: "Nodes" }).waitFor({ timeout: WAIT });
    await page.getByRole("row", { name: "Node n2" }).waitFor({ timeout: WAIT });
    const onN1 = made.filter((s) => s.node === "n1").length;
    const row = (id: string, column: string) => cell(page, `Node ${id}`, column).textContent();
    assert.equal(await row("n1", "State"), "serving");
    assert.equal(await row("n1", "Address"), `${c.nodes[0]!.api}E2B ${c.nodes[0]!.e2b ?? ""}`);
    assert.equal(await row("n1", "Machine"), "tcg, QEMU 8.2.2, CPU max");
    assert.equal(await row("n1", "Cores"), "2");
    assert.equal(await row("n1", "Memory"), "2.0 GiB free of 4.0 GiB");
    assert.equal(await row("n1", "Sandboxes"), `${onN1} running, 0 paused`);
    assert.equal(await row("n1", "Free slots"), `${20 - onN1} of 20`);
    assert.equal(await row("n2", "Sandboxes"), `${3 - onN1} running, 0 paused`);
    // n1 holds `app` (1 warm) and alice's `own`; n2 nothing.
    await page.getByRole("row", { name: "Node n1" }).getByText("2 snapshots").click();
    assert.deepEqual(
      await page.getByRole("row", { name: "Node n1" }).locator("ul.held li").allTextContents(),
      ["alice/own", "app (1 warm)"],
    );
    assert.equal(await row("n2", "Snapshots held"), "none");
    await page.getByText("2 nodes: 3 running, 0 paused, 37 free slots, 4 cores").waitFor({ timeout: WAIT });

    // The page follows the records (polled): n2 drains; then n2 is gone (its lease expired).
    c.nodes[1]!.draining = true;
    await c.nodes[1]!.publish();
    await page.getByText("2 nodes (1 draining)").waitFor({ timeout: WAIT });
    assert.equal(await row("n2", "State"), "draining");
    c.nodes[1]!.kill();
    await until(() => c.gw.running.gateway.view.node("n2") === undefined);
    await page.reload();
    await page.getByRole("row", { name: "Node n1" }).waitFor({ timeout: WAIT });
    await page.getByRole("row", { name: "Node n2" }).waitFor({ state: "detached", timeout: WAIT });
    await page.getByText(/^1 node: /).waitFor({ timeout: WAIT });
    assert.deepEqual(errors, []);

    // A tenant: no Nodes, and the page says why.
    const bob = await loggedIn(c.gw.url, "bob-token");
    await bob.page.getByText("0 of 0 sandboxes").waitFor({ timeout: WAIT });
    assert.equal(await nav(bob.page).getByRole("link", { name: "Nodes" }).count(), 0);
    assert.deepEqual(bob.nodesCalls, [], "a tenant's console does not ask for the nodes");
    await bob.page.goto(`${c.gw.url}/console/#/nodes`);
    await bob.page.getByText("Only admin callers see the cluster's nodes.").waitFor({ timeout: WAIT });
    assert.deepEqual(bob.errors, []);
  } finally {
    await closePages();
    await c.close();
  }
});

test("one daemon: no Nodes, no Node column, and #/nodes says it has none", async () => {
  const t: TestServices = await testServices();
  try {
    t.services.console = { dist: DIST, sessions: new ConsoleSessions() };
    const origin = await t.serveTcp("a".repeat(40));
    const { page, errors, health, missing, nodesCalls } = await loggedIn(origin, "a".repeat(40));
    await page.getByText("0 of 0 sandboxes").waitFor({ timeout: WAIT });
    // The admin's console asked whether this is a gateway (health has no `cluster`): it is not.
    assert.equal((await health).cluster, undefined);
    await page.waitForTimeout(300);
    assert.deepEqual([missing, nodesCalls], [[], []], "nothing the page loads is a 404; no nodes asked");
    assert.equal(await nav(page).getByRole("link", { name: "Nodes" }).count(), 0);
    assert.equal(await page.getByRole("columnheader", { name: "Node" }).count(), 0);
    assert.equal(await page.getByRole("combobox", { name: /^Node\b/ }).count(), 0);
    await page.goto(`${origin}/console/#/nodes`);
    await page
      .getByText(/^No nodes to list here: .*this is one daemon, not a cluster\.$/)
      .waitFor({ timeout: WAIT });
    assert.deepEqual(errors, []);
  } finally {
    await closePages();
    await t.cleanup();
  }
});
