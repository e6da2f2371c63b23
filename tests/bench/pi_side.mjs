#!/usr/bin/env node
// pi's side of bench_vs_pi.py: load a session, build the context of its leaf, plan a compaction,
// with pi's own exported functions (the ones tests/conformance/pi_reference.mjs compares with).
//
//   node pi_side.mjs SESSION.jsonl            one run: {"load":s,"context":s,"plan":s,"total":s}
//   node pi_side.mjs SESSION.jsonl --runs N   N runs in this process (the JIT warms up): a list
//
// pi comes from tests/conformance/node_modules (npm ci there) or PI_PACKAGE_DIR.

import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const piDir = process.env.PI_PACKAGE_DIR
	? resolve(process.env.PI_PACKAGE_DIR)
	: join(here, "..", "conformance", "node_modules", "@mariozechner", "pi-coding-agent");
const piModule = (rel) => import(pathToFileURL(join(piDir, "dist", rel)).href);
const { SessionManager, buildSessionContext } = await piModule("core/session-manager.js");
const compaction = await piModule("core/compaction/compaction.js");

const [file, flag, count] = process.argv.slice(2);
const runs = flag === "--runs" ? Number.parseInt(count, 10) : 1;
const settings = { enabled: true, reserveTokens: 16384, keepRecentTokens: 20000 };

// pi may rewrite the file it opens (migration); it works on a copy, made before timing.
const dir = mkdtempSync(join(tmpdir(), "pi-bench-"));
const copy = join(dir, "session.jsonl");
copyFileSync(file, copy);

function once() {
	const t0 = performance.now();
	const sm = SessionManager.open(copy, dir);
	const t1 = performance.now();
	const leaf = sm.getLeafId();
	const context = buildSessionContext(sm.getEntries(), leaf, undefined);
	const t2 = performance.now();
	const prep = compaction.prepareCompaction(sm.getBranch(leaf), settings);
	const t3 = performance.now();
	if (!context.messages.length) throw new Error("no context");
	globalThis.lastPlan = prep; // keep the result alive, as ours is
	return { load: (t1 - t0) / 1e3, context: (t2 - t1) / 1e3, plan: (t3 - t2) / 1e3, total: (t3 - t0) / 1e3 };
}

try {
	const results = [];
	for (let i = 0; i < runs; i++) results.push(once());
	process.stdout.write(`${JSON.stringify(runs === 1 ? results[0] : results)}\n`);
} finally {
	rmSync(dir, { recursive: true, force: true });
}
