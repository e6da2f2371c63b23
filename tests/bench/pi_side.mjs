#!/usr/bin/env node
// pi's side of bench_vs_pi.py: load a session, build the context of its leaf, plan a compaction,
// with pi's own exported functions (the ones tests/conformance/pi_reference.mjs compares with).
//
//   node pi_side.mjs SESSION.jsonl                  one run: {"load":s,"context":s,"plan":s,"total":s}
//   node pi_side.mjs SESSION.jsonl --runs N         N runs in this process (the JIT warms up): a list
//   node pi_side.mjs SESSION.jsonl --context-only   load and context, no plan (`context --json`'s peer)
//
// pi 1.x: SessionManager.open, buildSessionProjection and estimateProjectedContextTokens (the
// context and its estimate), prepareCompaction on the branch. pi 0.73.1 (PI_PACKAGE_DIR):
// buildSessionContext and estimateContextTokens instead. pi comes from tests/conformance (npm ci
// there; pi_package.mjs finds it) or PI_PACKAGE_DIR.

import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { piModule } from "../conformance/pi_package.mjs";

const sessionManager = await piModule("core/session-manager.js");
const { SessionManager } = sessionManager;
const compaction = await piModule("core/compaction/compaction.js");
const projected = typeof sessionManager.buildSessionProjection === "function";

const args = process.argv.slice(2);
const file = args[0];
const runsAt = args.indexOf("--runs");
const runs = runsAt >= 0 ? Number.parseInt(args[runsAt + 1], 10) : 1;
const contextOnly = args.includes("--context-only");
const settings = { enabled: true, reserveTokens: 16384, keepRecentTokens: 20000 };

// pi may rewrite the file it opens (migration); it works on a copy, made before timing.
const dir = mkdtempSync(join(tmpdir(), "pi-bench-"));
const copy = join(dir, "session.jsonl");
copyFileSync(file, copy);

function context(sm, leaf) {
	const branch = leaf ? sm.getBranch(leaf) : [];
	if (projected) {
		const projection = sessionManager.buildSessionProjection(sm.getEntries(), leaf, undefined);
		return { branch, messages: projection.messages, tokens: compaction.estimateProjectedContextTokens(projection, branch) };
	}
	const built = sessionManager.buildSessionContext(sm.getEntries(), leaf, undefined);
	return { branch, messages: built.messages, tokens: compaction.estimateContextTokens(built.messages) };
}

function once() {
	const t0 = performance.now();
	const sm = SessionManager.open(copy, dir);
	const t1 = performance.now();
	const ctx = context(sm, sm.getLeafId());
	const t2 = performance.now();
	const prep = contextOnly ? null : compaction.prepareCompaction(ctx.branch, settings);
	const t3 = performance.now();
	if (!ctx.messages.length) throw new Error("no context");
	globalThis.lastResult = [ctx, prep]; // keep the results alive, as ours are
	return { load: (t1 - t0) / 1e3, context: (t2 - t1) / 1e3, plan: (t3 - t2) / 1e3, total: (t3 - t0) / 1e3 };
}

try {
	const results = [];
	for (let i = 0; i < runs; i++) results.push(once());
	process.stdout.write(`${JSON.stringify(runs === 1 ? results[0] : results)}\n`);
} finally {
	rmSync(dir, { recursive: true, force: true });
}
