#!/usr/bin/env node
// Write the session files of tests/data/pi with pi's own SessionManager, so that they are
// exactly what pi writes (header, entry shapes, 8-hex ids, lazy persistence), plus the two v1
// files pi can only read (written by hand in pi's v1 shape), and tests/data/pi/cases.json: which
// commands to run on each file. Then `node pi_reference.mjs record` records pi's answers.
//
// Ids and entry timestamps come from pi (random ids, wall clock), so re-running this script
// rewrites every fixture and the expected files must be recorded again. Message timestamps and
// all text are fixed here. `--only a,b` rewrites only the named fixtures and their entries in
// cases.json; the others keep their files, ids and recorded answers.
//
// Text and usage come from fixture_lib.mjs (pure functions, so the output is unchanged); the
// message builders stay here, on this script's own clock and call counter.
//
// These are the files pi 0.73.1 wrote: the script runs only with pi 0.73.1 (PI_PACKAGE_DIR, see
// pi_package.mjs), so that re-running it keeps them pi 0.73.1's. The pi 1.x fixtures are
// make_fixtures_pi16.mjs's; their cases in cases.json are kept.
//
// Usage: PI_PACKAGE_DIR=/path/to/pi-0.73.1/node_modules node make_fixtures.mjs [--only a,b]

import { mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { WORDS, filler, usage } from "./fixture_lib.mjs";
import { dataDir, piModule, piVersion } from "./pi_package.mjs";

if (piVersion !== "0.73.1") throw new Error(`these fixtures are pi 0.73.1's; PI_PACKAGE_DIR names pi ${piVersion}`);
const { SessionManager } = await piModule("core/session-manager.js");
mkdirSync(dataDir, { recursive: true });
const onlyAt = process.argv.indexOf("--only");
const only = onlyAt > 0 ? process.argv[onlyAt + 1].split(",") : undefined;
const selected = (name) => !only || only.includes(name);

// -- deterministic content ---------------------------------------------------------------------

// Characters outside the Basic Multilingual Plane: two UTF-16 units each (D26). The last one is
// two of them (a thumb and a skin tone), so four units.
const ASTRAL = ["😀", "🚀", "🐛", "𠀋", "𪚥", "🎉", "𝔘", "👍🏽"];

/** `n` UTF-16 units of text (JavaScript length) full of astral characters, never half a pair. */
function astral(seed, n) {
	let out = "";
	for (let i = 0; out.length < n; i++) {
		out += `${WORDS[(seed * 3 + i) % WORDS.length]}${ASTRAL[(seed + i) % ASTRAL.length]}${i % 3 ? "" : "漢字"} `;
	}
	out = out.slice(0, n);
	return /[\uD800-\uDBFF]$/.test(out) ? `${out.slice(0, -1)}x` : out;
}

let clock = 1_767_225_600_000; // message timestamps (epoch ms), one second apart
const tick = () => (clock += 1000);
let callCounter = 0;

const user = (text) => ({ role: "user", content: text, timestamp: tick() });
const userBlocks = (blocks) => ({ role: "user", content: blocks, timestamp: tick() });

/** An assistant message; `calls` are [name, arguments] pairs; returns {message, callIds}. */
function assistant(text, { calls = [], total = 0, stopReason, provider = "anthropic", model = "claude-sonnet-4-5", thinking } = {}) {
	const content = [];
	if (thinking) content.push({ type: "thinking", thinking });
	if (text) content.push({ type: "text", text });
	const callIds = [];
	for (const [name, args] of calls) {
		const id = `toolu_${String(++callCounter).padStart(4, "0")}`;
		callIds.push(id);
		content.push({ type: "toolCall", id, name, arguments: args });
	}
	return {
		message: {
			role: "assistant",
			content,
			api: "anthropic-messages",
			provider,
			model,
			usage: usage(total),
			stopReason: stopReason ?? (calls.length ? "toolUse" : "stop"),
			timestamp: tick(),
		},
		callIds,
	};
}

function toolResult(callId, toolName, text, { isError = false, image = false } = {}) {
	const content = [{ type: "text", text }];
	if (image) content.push({ type: "image", data: "iVBORw0KGgo=", mimeType: "image/png" });
	return { role: "toolResult", toolCallId: callId, toolName, content, isError, timestamp: tick() };
}

// -- writing -----------------------------------------------------------------------------------

/** Build one session with pi's SessionManager and move its file to tests/data/pi/<name>.jsonl. */
function session(name, build) {
	const dir = mkdtempSync(join(tmpdir(), "pi-fixture-"));
	try {
		const sm = SessionManager.create("/work/project", dir);
		const api = helpers(sm);
		const ids = build(sm, api) ?? {};
		const [file] = readdirSync(dir).filter((f) => f.endsWith(".jsonl"));
		// Unselected fixtures are still built, so that timestamps and call ids stay the same.
		if (selected(name)) renameSync(join(dir, file), join(dataDir, `${name}.jsonl`));
		return { ids, sm };
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
}

function helpers(sm) {
	return {
		/** A plain user → assistant turn; returns [userId, assistantId]. */
		turn(seed, { userChars = 200, answerChars = 400, total = 0, model, provider } = {}) {
			const u = sm.appendMessage(user(filler(seed, userChars)));
			const a = sm.appendMessage(assistant(filler(seed + 1, answerChars), { total, model, provider }).message);
			return [u, a];
		},
		/** An assistant making tool calls, answered by results of `resultChars` each. */
		tools(seed, calls, { resultChars = 300, total = 0, text = "" } = {}) {
			const { message, callIds } = assistant(text || filler(seed, 60), { calls, total });
			const a = sm.appendMessage(message);
			const results = callIds.map((id, i) => sm.appendMessage(toolResult(id, calls[i][0], filler(seed + i + 3, resultChars))));
			return [a, ...results];
		},
	};
}

// -- the fixtures --------------------------------------------------------------------------------

const cases = {};
const noAdapt = "--no-adaptive-keep";

function fixture(name, runs, extra = {}) {
	cases[name] = { file: `${name}.jsonl`, runs, ...extra };
}

// 1. plain conversation
{
	const { ids } = session("plain", (sm, h) => {
		const turns = [];
		for (let i = 0; i < 5; i++) turns.push(h.turn(i * 10, { total: 150 * (i + 1) }));
		return { turns };
	});
	fixture("plain", {
		context: ["context"],
		contextMiddle: ["context", "--leaf", ids.turns[2][0]],
		planDefault: ["plan", noAdapt],
		planAdaptive: ["plan"],
		planKeep150: ["plan", "--keep-recent-tokens", "150", noAdapt, "--context-window", "2000", "--reserve-tokens", "1500"],
		planKeep150Adaptive: ["plan", "--keep-recent-tokens", "150"],
		planKeep1: ["plan", "--keep-recent-tokens", "1", noAdapt],
	});
}

// 2. tool calls: read / write / edit / bash, an error result, an image result
{
	session("tools", (sm, h) => {
		sm.appendMessage(user("Fix the parser and add a test."));
		h.tools(1, [["read", { path: "src/parser.py" }], ["read", { path: "src/lexer.py" }]], { total: 900 });
		h.tools(2, [["edit", { path: "src/parser.py", oldText: "a", newText: "b" }]], { total: 1300 });
		h.tools(3, [["bash", { command: "pytest -q" }]], { total: 1500 });
		sm.appendMessage(user("Also write a changelog entry."));
		h.tools(4, [["write", { path: "CHANGELOG.md", content: filler(4, 120) }], ["read", { path: "README.md" }]], { total: 1900 });
		const { message, callIds } = assistant("Checking the screenshot.", { calls: [["read", { path: "shot.png" }]], total: 2100 });
		sm.appendMessage(message);
		sm.appendMessage(toolResult(callIds[0], "read", "image attached", { image: true }));
		const bad = assistant("", { calls: [["read", { path: "missing.txt" }]], total: 2300 });
		sm.appendMessage(bad.message);
		sm.appendMessage(toolResult(bad.callIds[0], "read", "ENOENT: missing.txt", { isError: true }));
		sm.appendMessage(assistant(filler(5, 300), { total: 2500 }).message);
		sm.appendMessage({ role: "bashExecution", command: "git status", output: filler(6, 200), exitCode: 0, cancelled: false, truncated: false, timestamp: tick() });
		sm.appendMessage(user("Thanks, summarize what changed."));
		sm.appendMessage(assistant(filler(7, 250), { total: 2800 }).message);
	});
	fixture("tools", {
		context: ["context"],
		planDefault: ["plan", noAdapt],
		planKeep100: ["plan", "--keep-recent-tokens", "100", noAdapt],
		planKeep400: ["plan", "--keep-recent-tokens", "400", noAdapt],
		planKeep700: ["plan", "--keep-recent-tokens", "700", noAdapt],
	});
}

// 3. one compaction (pi-generated details), then more turns
{
	const { ids } = session("compaction", (sm, h) => {
		sm.appendMessage(user("Start the refactor."));
		h.tools(11, [["read", { path: "src/a.py" }]], { total: 800 });
		sm.appendMessage(assistant(filler(12, 300), { total: 900 }).message);
		const kept = sm.appendMessage(user(filler(13, 200)));
		h.tools(14, [["edit", { path: "src/b.py", oldText: "x", newText: "y" }]], { total: 1100 });
		sm.appendMessage(assistant(filler(15, 300), { total: 1200 }).message);
		const c = sm.appendCompaction("## Goal\nRefactor a.py and b.py", kept, 1200, { readFiles: ["src/a.py", "src/old.py"], modifiedFiles: ["src/z.py"] });
		h.turn(16, { total: 700 });
		h.tools(18, [["read", { path: "src/old.py" }], ["write", { path: "src/new.py", content: "n" }]], { total: 900 });
		sm.appendMessage(assistant(filler(19, 280), { total: 1000 }).message);
		const u = sm.appendMessage(user(filler(20, 160)));
		sm.appendMessage(assistant(filler(21, 300), { total: 1150 }).message);
		return { kept, c, u };
	});
	fixture("compaction", {
		context: ["context"],
		contextAtCompaction: ["context", "--leaf", ids.c],
		planAtCompaction: ["plan", "--leaf", ids.c, noAdapt],
		planDefault: ["plan", noAdapt],
		planKeep100: ["plan", "--keep-recent-tokens", "100", noAdapt],
		planKeep250: ["plan", "--keep-recent-tokens", "250", noAdapt],
	});
}

// 4. two compactions; the second keeps entries the first had kept
{
	const { ids } = session("two-compactions", (sm, h) => {
		h.turn(30, { total: 300 });
		const k1 = sm.appendMessage(user(filler(32, 200)));
		sm.appendMessage(assistant(filler(33, 400), { total: 500 }).message);
		sm.appendCompaction("first summary", k1, 500, { readFiles: ["one.txt"], modifiedFiles: [] });
		h.tools(34, [["read", { path: "two.txt" }]], { total: 600 });
		const k2 = sm.appendMessage(user(filler(35, 200)));
		sm.appendMessage(assistant(filler(36, 400), { total: 800 }).message);
		const c2 = sm.appendCompaction("second summary", k2, 800, { readFiles: ["one.txt", "two.txt"], modifiedFiles: [] });
		h.tools(37, [["edit", { path: "one.txt", oldText: "1", newText: "2" }]], { total: 700 });
		sm.appendMessage(assistant(filler(38, 300), { total: 800 }).message);
		h.turn(39, { total: 950 });
		return { c2, k2 };
	});
	fixture("two-compactions", {
		context: ["context"],
		contextAtSecond: ["context", "--leaf", ids.c2],
		planDefault: ["plan", noAdapt],
		planKeep50: ["plan", "--keep-recent-tokens", "50", noAdapt],
		planKeep200: ["plan", "--keep-recent-tokens", "200", noAdapt],
		planKeep400: ["plan", "--keep-recent-tokens", "400", noAdapt],
	});
}

// 5. a branch with a branch_summary (pi's fromId quirk: fromId = the target)
{
	const { ids } = session("branch", (sm, h) => {
		const [u1, a1] = h.turn(40, { total: 300 });
		h.tools(42, [["read", { path: "lib/x.ts" }], ["edit", { path: "lib/y.ts", oldText: "p", newText: "q" }]], { total: 600 });
		sm.appendMessage(assistant(filler(43, 200), { total: 700 }).message);
		const [, old] = h.turn(44, { total: 900 });
		sm.branchWithSummary(a1, "The user explored a different conversation branch before returning here.\nSummary of that exploration:\n\nTried lib/y.ts", { readFiles: ["lib/x.ts"], modifiedFiles: ["lib/y.ts"] });
		h.turn(46, { total: 600 });
		const [u3] = h.turn(48, { total: 800 });
		const leaf = sm.getLeafId();
		sm.branchWithSummary(u3, "second exploration", { readFiles: ["ext.md"], modifiedFiles: [] }, true);
		sm.appendMessage(assistant(filler(49, 100), { total: 850 }).message);
		return { u1, a1, old, leaf, u3, leaf2: sm.getLeafId() };
	});
	fixture("branch", {
		context: ["context"],
		contextOldBranch: ["context", "--leaf", ids.old],
		contextFirstBranch: ["context", "--leaf", ids.leaf],
		planDefault: ["plan", noAdapt],
		planKeep100: ["plan", "--keep-recent-tokens", "100", noAdapt],
		planKeep300: ["plan", "--keep-recent-tokens", "300", noAdapt],
		branchBack: ["plan", "--from", ids.old, "--to", ids.a1],
		branchBackBudget: ["plan", "--from", ids.old, "--to", ids.a1, "--budget", "150"],
		branchAcross: ["plan", "--from", ids.leaf2, "--to", ids.old],
		branchAcrossBudget: ["plan", "--from", ids.leaf2, "--to", ids.old, "--budget", "200"],
		branchToRootUser: ["plan", "--from", ids.old, "--to", ids.u1],
		branchDescendant: ["plan", "--from", ids.a1, "--to", ids.old],
	});
}

// 6. labels (label entries are children of the leaf, so they sit on the path)
{
	const { ids } = session("labels", (sm, h) => {
		const [u1, a1] = h.turn(50, { total: 300 });
		sm.appendLabelChange(u1, "start");
		h.turn(52, { total: 600 });
		sm.appendLabelChange(a1, "first answer");
		sm.appendLabelChange(u1, "renamed");
		const [u3] = h.turn(54, { total: 900 });
		sm.appendLabelChange(a1, undefined);
		sm.appendLabelChange(u3, "third");
		sm.appendSessionInfo("  label fixture  ");
		h.turn(56, { total: 1200 });
		return { u3 };
	});
	fixture("labels", {
		context: ["context"],
		planDefault: ["plan", noAdapt],
		planKeep150: ["plan", "--keep-recent-tokens", "150", noAdapt],
		planKeep250: ["plan", "--keep-recent-tokens", "250", noAdapt],
	});
}

// 7. model and thinking changes; a model_change right before a user message (D10)
{
	session("model-thinking", (sm, h) => {
		sm.appendThinkingLevelChange("high");
		h.turn(60, { total: 300 });
		sm.appendModelChange("openai", "gpt-5.1-codex");
		h.turn(62, { total: 600, provider: "openai", model: "gpt-5.1-codex" });
		sm.appendModelChange("google", "gemini-2.5-pro");
		sm.appendThinkingLevelChange("low");
		h.turn(64, { total: 900, userChars: 120, answerChars: 200 });
		sm.appendModelChange("anthropic", "claude-opus-4");
		sm.appendMessage(user(filler(66, 100)));
		sm.appendMessage(assistant(filler(67, 160), { total: 1000, thinking: filler(68, 80), provider: "anthropic", model: "claude-opus-4" }).message);
		sm.appendModelChange("openai", "gpt-4.1");
	});
	fixture("model-thinking", {
		context: ["context"],
		planDefault: ["plan", noAdapt],
		planKeep80: ["plan", "--keep-recent-tokens", "80", noAdapt],
		planKeep110: ["plan", "--keep-recent-tokens", "110", noAdapt],
		planKeep200: ["plan", "--keep-recent-tokens", "200", noAdapt],
	});
}

// 8. custom (extension state) and custom_message entries, a legacy-shaped custom message
{
	session("custom", (sm, h) => {
		sm.appendCustomEntry("todo-state", { items: ["a", "b"] });
		h.turn(70, { total: 300 });
		sm.appendCustomMessageEntry("reminder", "Remember to run the tests.", true, { source: "hook" });
		sm.appendCustomMessageEntry("hidden-note", [{ type: "text", text: filler(71, 200) }, { type: "image", data: "iVBORw0KGgo=", mimeType: "image/png" }], false);
		h.turn(72, { total: 2000 });
		sm.appendCustomEntry("todo-state", { items: ["b"] });
		sm.appendMessage({ role: "custom", customType: "injected", content: filler(73, 240), display: true, timestamp: tick() });
		h.turn(74, { total: 2300 });
		sm.appendCustomMessageEntry("reminder", filler(75, 120), true);
		sm.appendMessage(assistant(filler(76, 200), { total: 2500 }).message);
	});
	fixture("custom", {
		context: ["context"],
		planDefault: ["plan", noAdapt],
		planKeep60: ["plan", "--keep-recent-tokens", "60", noAdapt],
		planKeep100: ["plan", "--keep-recent-tokens", "100", noAdapt],
		planKeep200: ["plan", "--keep-recent-tokens", "200", noAdapt],
		planKeep1500: ["plan", "--keep-recent-tokens", "1500", noAdapt],
	});
}

// 9. a split turn: one long turn of tool calls; and a split turn right after a compaction (D11)
{
	const { ids } = session("split-turn", (sm, h) => {
		h.turn(80, { total: 400 });
		sm.appendMessage(user("Run the migration across all modules."));
		for (let i = 0; i < 6; i++) {
			h.tools(81 + i, [["edit", { path: `mod${i}.py`, oldText: "o", newText: "n" }]], { resultChars: 400, total: 800 + 200 * i });
		}
		sm.appendMessage(assistant(filler(90, 200), { total: 2200 }).message);
		return { leaf: sm.getLeafId() };
	});
	fixture("split-turn", {
		context: ["context"],
		planDefault: ["plan", noAdapt],
		planKeep300: ["plan", "--keep-recent-tokens", "300", noAdapt],
		planKeep450: ["plan", "--keep-recent-tokens", "450", noAdapt],
		planKeep800: ["plan", "--keep-recent-tokens", "800", noAdapt],
	});
	session("split-after-compaction", (sm, h) => {
		h.turn(91, { total: 400 });
		const u = sm.appendMessage(user("Now port every module."));
		h.tools(92, [["read", { path: "m1.py" }]], { resultChars: 400, total: 600 });
		sm.appendCompaction("summary before the long turn", u, 600, { readFiles: ["m1.py"], modifiedFiles: [] });
		for (let i = 0; i < 4; i++) h.tools(93 + i, [["write", { path: `p${i}.py`, content: "x" }]], { resultChars: 400, total: 900 + 200 * i });
		sm.appendMessage(assistant(filler(99, 120), { total: 1800 }).message);
	});
	fixture("split-after-compaction", {
		context: ["context"],
		planKeep200: ["plan", "--keep-recent-tokens", "200", noAdapt],
		planKeep500: ["plan", "--keep-recent-tokens", "500", noAdapt],
	});
	void ids;
}

// 10. huge trailing tool results (D9, pi#7201)
{
	session("huge-trailing", (sm, h) => {
		h.turn(100, { total: 500 });
		h.turn(102, { total: 900 });
		sm.appendMessage(user("Dump both logs."));
		h.tools(104, [["bash", { command: "cat a.log" }], ["read", { path: "b.log" }]], { resultChars: 45_000, total: 1200 });
	});
	fixture("huge-trailing", {
		context: ["context"],
		planDefault: ["plan", noAdapt, "--context-window", "32000"],
		planKeep5000: ["plan", "--keep-recent-tokens", "5000", noAdapt],
		planKeep20000Adaptive: ["plan"],
	});
}

// 11/12. v1 files (no ids, no version): written by hand in pi's v1 shape, migrated on load
function writeV1(name, lines) {
	if (!selected(name)) return;
	writeFileSync(join(dataDir, `${name}.jsonl`), `${lines.map((l) => JSON.stringify(l)).join("\n")}\n`);
}
const iso = (ms) => new Date(ms).toISOString();
{
	const lines = [{ type: "session", id: "7c1a2b3d-0000-4000-8000-000000000001", timestamp: iso(clock), cwd: "/work/old", provider: "anthropic", modelId: "claude-sonnet-4-5", thinkingLevel: "off" }];
	const add = (message) => lines.push({ type: "message", timestamp: iso(message.timestamp), message });
	add(user("/mode"));
	add({ ...assistant("", { total: 0, stopReason: "aborted", provider: "openai", model: "gpt-5.1-codex" }).message, errorMessage: "Request was aborted" });
	lines.push({ type: "model_change", timestamp: iso(tick()), provider: "anthropic", modelId: "claude-sonnet-4-5" });
	add(user(filler(110, 200)));
	add(assistant(filler(111, 300), { total: 400 }).message);
	add({ role: "hookMessage", customType: "legacy-hook", content: "from an old hook", display: true, timestamp: tick() });
	lines.push({ type: "thinking_level_change", timestamp: iso(tick()), thinkingLevel: "medium" });
	add(user(filler(112, 200)));
	add(assistant(filler(113, 300), { total: 700 }).message);
	lines.push({ type: "compaction", timestamp: iso(tick()), summary: "v1 summary", firstKeptEntryIndex: 8, tokensBefore: 700 });
	add(user(filler(114, 150)));
	add(assistant(filler(115, 250), { total: 500 }).message);
	writeV1("v1", lines);
	fixture("v1", {
		context: ["context"],
		contextBeforeCompaction: ["context", "--leaf", "#8"],
		planDefault: ["plan", noAdapt],
		planKeep100: ["plan", "--keep-recent-tokens", "100", noAdapt],
	}, { indexIds: true });
}
{
	// Like pi's test/fixtures/large-session.jsonl (a real v1 session: >100 entries, an aborted
	// first reply, a model change, long tool results), generated rather than copied.
	const lines = [{ type: "session", id: "d703a1a9-0000-4000-8000-000000000002", timestamp: iso(clock), cwd: "/work/large", provider: "anthropic", modelId: "claude-sonnet-4-5", thinkingLevel: "off" }];
	const add = (message) => lines.push({ type: "message", timestamp: iso(message.timestamp), message });
	add(userBlocks([{ type: "text", text: "/mode" }]));
	add({ ...assistant("", { total: 0, stopReason: "aborted", provider: "openai", model: "gpt-5.1-codex" }).message, errorMessage: "Request was aborted" });
	lines.push({ type: "model_change", timestamp: iso(tick()), provider: "anthropic", modelId: "claude-sonnet-4-5" });
	let total = 2000;
	for (let t = 0; t < 12; t++) {
		add(userBlocks([{ type: "text", text: filler(200 + t, 150 + (t % 4) * 80) }]));
		for (let k = 0; k < 4; k++) {
			const tool = ["read", "bash", "edit", "write"][(t + k) % 4];
			const args = tool === "bash" ? { command: `ls dir${t}` } : { path: `packages/p${t % 5}/f${k}.ts` };
			const { message, callIds } = assistant(filler(300 + t * 4 + k, 80), { calls: [[tool, args]], total: (total += 900) });
			add(message);
			add(toolResult(callIds[0], tool, filler(400 + t * 4 + k, 600 + ((t * 4 + k) % 7) * 300)));
		}
		add(assistant(filler(500 + t, 400), { total: (total += 600) }).message);
	}
	writeV1("large-v1", lines);
	fixture("large-v1", {
		context: ["context"],
		planDefault: ["plan", noAdapt],
		planKeep5000: ["plan", "--keep-recent-tokens", "5000", noAdapt],
	}, { indexIds: true });
}


// 13. characters outside the BMP (D26): emoji, rare CJK ideographs, lone surrogates. pi counts
// UTF-16 units, so every estimate, cut point, tokensBefore and branch total here depends on
// counting an astral character as two. One tool result puts a surrogate pair across the
// 2000-unit cut of the serialized conversation; another is astral to well past it.
{
	const { ids } = session("non-bmp", (sm) => {
		const say = (seed, units, total) => sm.appendMessage(assistant(astral(seed, units), { total }).message);
		const u1 = sm.appendMessage(user(`Fix the 🐛 in the parser 😀 (see 𠀋 and 漢字). ${astral(120, 180)}`));
		const a1 = sm.appendMessage(assistant(astral(121, 300), { total: 400, thinking: astral(122, 90) }).message);
		const calls = [
			["read", { path: "docs/🚀launch.md" }],
			["write", { path: "src/𠀋.py", content: `x = "\uD83D"  # a lone high surrogate, ${astral(123, 40)}` }],
		];
		const { message, callIds } = assistant("Reading 📄 files.", { calls, total: 700 });
		sm.appendMessage(message);
		sm.appendMessage(toolResult(callIds[0], "read", `${"a".repeat(1999)}😀${astral(124, 600)}`));
		sm.appendMessage(toolResult(callIds[1], "write", `${"🚀".repeat(1000)}${astral(125, 900)}`));
		say(126, 260, 2100);
		const k = sm.appendMessage(user(`Now the lone low half \uDE00 and ${astral(127, 150)}`));
		say(128, 300, 2300);
		const c = sm.appendCompaction(`## Goal\nFix the 🐛 ${astral(129, 100)}`, k, 2300, { readFiles: ["docs/🚀launch.md"], modifiedFiles: ["src/𠀋.py"] });
		sm.appendMessage({ role: "bashExecution", command: "echo 🎉", output: astral(130, 220), exitCode: 0, cancelled: false, truncated: false, timestamp: tick() });
		sm.appendCustomMessageEntry("note", astral(131, 140), true);
		const u3 = sm.appendMessage(user(astral(132, 210)));
		const a3 = say(133, 330, 1200);
		const edit = assistant(astral(134, 50), { calls: [["edit", { path: "src/🐛.ts", oldText: "🐛", newText: "🦋" }]], total: 1400 });
		sm.appendMessage(edit.message);
		sm.appendMessage(toolResult(edit.callIds[0], "edit", astral(135, 120)));
		say(136, 240, 1600);
		const old = sm.getLeafId();
		sm.branchWithSummary(a3, `Tried 🧪 first: ${astral(137, 160)}`, { readFiles: ["🧪.md"], modifiedFiles: ["src/🐛.ts"] });
		sm.appendMessage(user(astral(138, 190)));
		say(139, 280, 1500);
		sm.appendMessage(user(`𪚥 ${astral(140, 120)}`));
		say(141, 200, 1700);
		return { u1, a1, k, c, u3, a3, old, leaf: sm.getLeafId() };
	});
	fixture("non-bmp", {
		context: ["context"],
		contextBeforeCompaction: ["context", "--leaf", ids.k],
		contextOldBranch: ["context", "--leaf", ids.old],
		planDefault: ["plan", noAdapt],
		planKeep60: ["plan", "--keep-recent-tokens", "60", noAdapt],
		planKeep150: ["plan", "--keep-recent-tokens", "150", noAdapt],
		planKeep250: ["plan", "--keep-recent-tokens", "250", noAdapt],
		planOldKeep100: ["plan", "--leaf", ids.old, "--keep-recent-tokens", "100", noAdapt],
		planBeforeCompactionKeep200: ["plan", "--leaf", ids.k, "--keep-recent-tokens", "200", noAdapt],
		branchBack: ["plan", "--from", ids.old, "--to", ids.a3],
		branchBackBudget: ["plan", "--from", ids.old, "--to", ids.a3, "--budget", "150"],
		branchAcross: ["plan", "--from", ids.leaf, "--to", ids.old],
		branchAcrossBudget: ["plan", "--from", ids.leaf, "--to", ids.old, "--budget", "120"],
		branchToRoot: ["plan", "--from", ids.old, "--to", ids.u1],
		serialize: ["serialize"],
		serializeBeforeCompaction: ["serialize", "--leaf", ids.k],
	});
}

// With --only, the other fixtures keep their cases (and so their ids) from the existing file;
// fixtures of the other generators (make_fixtures_pi16.mjs, make_cli_fixture.mjs) are kept too.
const existing = JSON.parse(readFileSync(join(dataDir, "cases.json"), "utf8")).fixtures;
for (const name of Object.keys(cases)) if (!selected(name) && existing[name]) cases[name] = existing[name];
for (const [name, spec] of Object.entries(existing)) if (!(name in cases)) cases[name] = spec;
writeFileSync(join(dataDir, "cases.json"), `${JSON.stringify({ fixtures: cases }, null, 2)}\n`);
process.stderr.write(`wrote ${only ? only.join(", ") : `${Object.keys(cases).length} fixtures`} to ${dataDir}\n`);
