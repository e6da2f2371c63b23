#!/usr/bin/env node
// Random sessions for the sweep, written by pi's own SessionManager: seeded (the same seed gives
// the same sequence of operations and texts; ids and entry timestamps are pi's, so random), and
// made of everything a pi 1.x session holds: turns, tool calls with results (some with images),
// custom messages, bash executions, system messages patching sections and tools, context edits
// (null, text, blocks with an image; several on one target), compactions as pi prepares them and
// retain-none ones, usage entries, model / thinking changes, labels, branches, branch summaries,
// resetLeaf roots, and failed attempts omitted as overflow recovery leaves them.
//
// Usage: node random_sessions.mjs DIR [--count N] [--seed S] [--steps N]
// Then:  node pi_reference.mjs sweep --random DIR

import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { IMAGE, content, filler, usage, writeSession } from "./fixture_lib.mjs";
import { piMajor, piModule, piVersion } from "./pi_package.mjs";

if (piMajor < 1) throw new Error(`pi ${piVersion}: random sessions need pi >= 1.6`);
const { SessionManager } = await piModule("core/session-manager.js");
const compaction = await piModule("core/compaction/compaction.js");
const utils = await piModule("core/compaction/utils.js");

function option(name, fallback) {
	const at = process.argv.indexOf(name);
	return at > 0 ? Number.parseInt(process.argv[at + 1], 10) : fallback;
}

/** mulberry32: a small seeded PRNG. */
function prng(seed) {
	let a = seed >>> 0;
	return () => {
		a = (a + 0x6d2b79f5) >>> 0;
		let t = a;
		t = Math.imul(t ^ (t >>> 15), t | 1);
		t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
		return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
	};
}

function randomSession(sm, seed, steps) {
	const rand = prng(seed);
	const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
	const pick = (list) => list[Math.floor(rand() * list.length)];
	const c = content(1_790_000_000_000 + seed * 10_000_000);
	let total = 0;
	const grow = () => (total += int(50, 600));
	let s = seed * 1000;
	const text = (lo, hi) => filler(++s, int(lo, hi));
	const path = () => sm.getBranch();
	const editable = () =>
		path().filter((e) => e.type === "custom_message" || (e.type === "message" && ["user", "assistant", "toolResult"].includes(e.message.role)));
	const replacement = () => {
		const r = rand();
		if (r < 0.4) return null;
		if (r < 0.75) return { content: text(5, 120) };
		return { content: [{ type: "text", text: text(5, 80) }, ...(rand() < 0.5 ? [IMAGE] : [])] };
	};
	const tools = ["read", "bash", "edit", "write", "grep"];
	const args = (tool) => (tool === "bash" ? { command: `ls ${text(3, 12)}` } : { path: `src/${pick(["a", "b", "c", "d"])}.py` });

	const ops = [
		[6, () => c.turn(sm, ++s, { userChars: int(20, 500), answerChars: int(20, 700), total: grow() })],
		[4, () => {
			const list = Array.from({ length: int(1, 2) }, () => {
				const tool = pick(tools);
				return [tool, args(tool)];
			});
			c.tools(sm, ++s, list, { resultChars: int(10, 900), total: grow(), image: rand() < 0.2 });
		}],
		[2, () => sm.appendMessage(c.user(text(10, 300)))],
		[1, () => sm.appendCustomMessageEntry(pick(["note", "hook"]), rand() < 0.3 ? [{ type: "text", text: text(5, 100) }, IMAGE] : text(5, 300), rand() < 0.5)],
		[1, () => sm.appendMessage({ role: "bashExecution", command: "make", output: text(5, 400), exitCode: 0, cancelled: false, truncated: false, timestamp: c.tick() })],
		[2, () => {
			const r = rand();
			const message = r < 0.4
				? c.system({ sections: { [pick(["skills", "cwd", "notes"])]: rand() < 0.3 ? null : text(10, 200) } })
				: r < 0.7
					? c.system({ toolsAdded: [c.tool(pick(tools), text(5, 60))] })
					: c.system({ text: text(5, 120), toolsRemoved: [pick(tools)] });
			sm.appendMessage(message);
		}],
		[4, () => {
			const targets = editable();
			if (targets.length === 0) return;
			const target = pick(targets);
			for (let n = rand() < 0.2 ? 2 : 1; n > 0; n--) sm.appendContextEdit(target.id, replacement());
		}],
		[2, () => {
			const branch = path();
			if (branch.length === 0 || branch[branch.length - 1].type === "compaction") return;
			if (rand() < 0.3) {
				sm.appendCompaction(text(10, 200), undefined, total, { readFiles: [], modifiedFiles: [] });
				return;
			}
			const prep = compaction.prepareCompaction(branch, { enabled: true, reserveTokens: 16384, keepRecentTokens: pick([1, 60, 200, 600]) });
			if (!prep) return;
			const lists = utils.computeFileLists(prep.fileOps);
			sm.appendCompaction(text(10, 300), prep.firstKeptEntryId, prep.tokensBefore, lists);
		}],
		[1, () => sm.appendUsage(pick(["cache_warm", "summary"]), "anthropic", "claude-sonnet-4-5", usage(int(100, 50_000)))],
		[1, () => (rand() < 0.5 ? sm.appendModelChange(pick(["openai", "google"]), pick(["gpt-5.1", "gemini-2.5-pro"])) : sm.appendThinkingLevelChange(pick(["low", "high", "off"])))],
		[1, () => {
			const branch = path();
			if (branch.length) sm.appendLabelChange(pick(branch).id, rand() < 0.8 ? text(3, 12) : undefined);
		}],
		[2, () => {
			const branch = path();
			if (branch.length) sm.branch(pick(branch).id);
		}],
		[1, () => {
			const branch = path();
			const from = branch.length && rand() < 0.8 ? pick(branch).id : null;
			sm.branchWithSummary(from, text(10, 200), { readFiles: [`src/${pick(["a", "e"])}.py`], modifiedFiles: [] });
		}],
		[0.5, () => sm.resetLeaf()],
		[1, () => {
			// A failed attempt after the last user message, omitted (with its tool results) as
			// pi's overflow recovery does before it compacts.
			sm.appendMessage(c.user(text(10, 200)));
			if (rand() < 0.5) {
				const failed = c.assistant("", { stopReason: "error", errorMessage: "prompt is too long" });
				sm.appendContextEdit(sm.appendMessage(failed.message), null);
				return;
			}
			const attempt = c.assistant(text(5, 60), { calls: [["read", { path: "huge.log" }]], total: 300_000 });
			const a = sm.appendMessage(attempt.message);
			const r = sm.appendMessage(c.toolResult(attempt.callIds[0], "read", text(100, 900)));
			sm.appendContextEdit(a, null);
			sm.appendContextEdit(r, null);
		}],
	];
	const weight = ops.reduce((sum, [w]) => sum + w, 0);
	if (rand() < 0.6) {
		sm.appendMessage(c.system({ text: text(10, 200), sections: { preamble: text(10, 200) }, toolsAdded: [c.tool("read"), c.tool("bash")] }));
	}
	c.turn(sm, ++s, { total: grow() }); // pi writes the file once there is a conversation
	for (let i = 0; i < steps; i++) {
		let r = rand() * weight;
		const [, op] = ops.find(([w]) => (r -= w) < 0) ?? ops[0];
		op();
	}
}

const [dirArg] = process.argv.slice(2);
if (!dirArg) throw new Error("usage: node random_sessions.mjs DIR [--count N] [--seed S] [--steps N]");
const dir = resolve(dirArg);
mkdirSync(dir, { recursive: true });
const count = option("--count", 6);
const seed = option("--seed", 16);
const steps = option("--steps", 22);
for (let i = 0; i < count; i++) {
	writeSession(SessionManager, join(dir, `random-${seed}-${i}.jsonl`), (sm) => randomSession(sm, seed * 100 + i, steps));
}
process.stderr.write(`wrote ${count} random sessions (seed ${seed}, pi ${piVersion}) to ${dir}\n`);
