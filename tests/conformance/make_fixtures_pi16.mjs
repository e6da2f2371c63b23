#!/usr/bin/env node
// Write the pi 1.x fixtures of tests/data/pi with pi's own SessionManager (the pinned pi, 1.6.0):
// system messages (sections, toolsAdded/toolsRemoved), context edits (several on one target,
// before and after a compaction, on another branch), compactions carrying the system checkpoint,
// retain-none compactions, usage entries, several roots (resetLeaf, a root branch summary),
// images in user / tool-result / custom content, and a failed attempt omitted as overflow
// recovery leaves it. Their cases go into tests/data/pi/cases.json beside make_fixtures.mjs's
// (the pi 0.73.1 files, which this script never touches). Then `node pi_reference.mjs record`.
//
// Ids and entry timestamps come from pi (random ids, wall clock): re-running rewrites these
// fixtures and their cases. `--only a,b` rewrites only the named ones (the others keep their
// files and ids; every session is still built, so message timestamps stay the same).
//
// Usage: node make_fixtures_pi16.mjs [--only a,b]   (from tests/conformance, after npm ci)

import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { IMAGE, content, filler, usage, writeSession } from "./fixture_lib.mjs";
import { dataDir, piMajor, piModule, piVersion } from "./pi_package.mjs";

if (piMajor < 1) throw new Error(`pi ${piVersion} has no context edits or system messages: use pi >= 1.6`);
const { SessionManager } = await piModule("core/session-manager.js");
const compaction = await piModule("core/compaction/compaction.js");
const utils = await piModule("core/compaction/utils.js");

const onlyAt = process.argv.indexOf("--only");
const only = onlyAt > 0 ? process.argv[onlyAt + 1].split(",") : undefined;
const selected = (name) => !only || only.includes(name);
const scratch = mkdtempSync(join(tmpdir(), "pi16-unselected-"));

const c = content();
const cases = {};
const noAdapt = "--no-adaptive-keep";
const keep = (n) => ["--keep-recent-tokens", String(n), noAdapt];

/** Build a fixture (always, for stable timestamps), write it when selected, record its runs. */
function fixture(name, build, runs) {
	const target = selected(name) ? join(dataDir, `${name}.jsonl`) : join(scratch, `${name}.jsonl`);
	const { result } = writeSession(SessionManager, target, (sm) => build(sm) ?? {});
	cases[name] = { file: `${name}.jsonl`, runs: runs(result) };
}

/** What pi's own compaction would keep now (prepareCompaction on the active path). */
function compactLikePi(sm, summary, keepRecentTokens) {
	const prep = compaction.prepareCompaction(sm.getBranch(), { enabled: true, reserveTokens: 16384, keepRecentTokens });
	const lists = utils.computeFileLists(prep.fileOps);
	return sm.appendCompaction(summary, prep.firstKeptEntryId, prep.tokensBefore, lists);
}

// 1. system messages: the leading prompt with sections and tools, later patches (a section
// replaced, one removed with null, a tool removed, tools added, extra instructions), a compaction
// that stores the replayed system checkpoint, a system message in its kept range (dropped).
fixture(
	"system-messages",
	(sm) => {
		sm.appendMessage(
			c.system({
				text: "You are a coding assistant.",
				sections: { preamble: filler(500, 300), tools: "<tools>read, bash, write</tools>", cwd: "<cwd>/work/project</cwd>" },
				toolsAdded: [c.tool("read"), c.tool("bash"), c.tool("write")],
			}),
		);
		const [u1, a1] = c.turn(sm, 501, { total: 900 });
		c.tools(sm, 503, [["read", { path: "a.py" }]], { total: 1200 });
		const patch = sm.appendMessage(c.system({ sections: { skills: "<skills>lint</skills>", cwd: null }, toolsRemoved: ["write"] }));
		const k = sm.appendMessage(c.user(filler(505, 200)));
		sm.appendMessage(c.assistant(filler(506, 300), { total: 1500 }).message);
		sm.appendMessage(c.system({ text: "Also answer briefly.", toolsAdded: [c.tool("edit")] }));
		const [, a3] = c.turn(sm, 507, { total: 1900 });
		const comp = sm.appendCompaction("## Goal\nsystem messages", k, 1900, { readFiles: ["a.py"], modifiedFiles: [] });
		c.turn(sm, 509, { total: 800 });
		sm.appendMessage(c.system({ sections: { preamble: filler(511, 120) }, toolsAdded: [c.tool("write", "Write again.")] }));
		c.turn(sm, 512, { total: 1000 });
		return { u1, a1, patch, k, a3, comp, leaf: sm.getLeafId() };
	},
	(ids) => ({
		context: ["context"],
		contextBeforeCompaction: ["context", "--leaf", ids.a3],
		contextAtCompaction: ["context", "--leaf", ids.comp],
		contextAtPatch: ["context", "--leaf", ids.patch],
		planDefault: ["plan", noAdapt],
		planKeep100: ["plan", ...keep(100)],
		planKeep300: ["plan", ...keep(300)],
		planKeep800: ["plan", ...keep(800)],
		planBeforeCompactionKeep200: ["plan", "--leaf", ids.a3, ...keep(200)],
		planBeforeCompactionKeep500: ["plan", "--leaf", ids.a3, ...keep(500), "--context-window", "2000", "--reserve-tokens", "500"],
		branchBack: ["plan", "--from", ids.leaf, "--to", ids.a1],
		branchBackBudget: ["plan", "--from", ids.leaf, "--to", ids.a1, "--budget", "150"],
		serialize: ["serialize"],
		serializeBeforeCompaction: ["serialize", "--leaf", ids.a3],
	}),
);

// 2. context edits: user (a string stays a string), assistant (a string becomes a text block),
// tool result (blocks with an image), custom message, an omitted tool result, three edits on one
// target (the last wins), and a second branch where other edits apply (edits are branch-relative).
fixture(
	"context-edits",
	(sm) => {
		const u1 = sm.appendMessage(c.user(filler(520, 240)));
		const a1 = sm.appendMessage(c.assistant(filler(521, 300), { total: 500 }).message);
		const [, r1, r2] = c.tools(sm, 522, [["read", { path: "x.md" }], ["bash", { command: "ls" }]], { total: 900 });
		const note = sm.appendCustomMessageEntry("note", filler(526, 200), true);
		const [u2, a2] = c.turn(sm, 527, { total: 1300 });
		sm.appendContextEdit(u1, { content: "short user text" });
		sm.appendContextEdit(a1, { content: "short answer" });
		sm.appendContextEdit(r1, { content: [{ type: "text", text: "trimmed result" }, IMAGE] });
		sm.appendContextEdit(note, { content: [{ type: "text", text: "edited note" }, IMAGE] });
		const omit = sm.appendContextEdit(r2, null);
		c.turn(sm, 529, { total: 1500 });
		const first = sm.appendContextEdit(a2, { content: "first edit" });
		sm.appendContextEdit(a2, null);
		const third = sm.appendContextEdit(a2, { content: [{ type: "text", text: "third edit wins" }] });
		c.turn(sm, 531, { total: 1700 });
		const leaf = sm.getLeafId();
		sm.branch(a2);
		c.turn(sm, 533, { total: 1400 });
		sm.appendContextEdit(u2, null);
		sm.appendContextEdit(a1, { content: [{ type: "text", text: "the other branch's answer" }] });
		c.turn(sm, 535, { total: 1600 });
		return { u1, a1, r1, u2, a2, omit, first, third, leaf, other: sm.getLeafId() };
	},
	(ids) => ({
		context: ["context"],
		contextBeforeEdits: ["context", "--leaf", ids.a2],
		contextAfterOmission: ["context", "--leaf", ids.omit],
		contextFirstEdit: ["context", "--leaf", ids.first],
		contextThirdEdit: ["context", "--leaf", ids.third],
		contextMainBranch: ["context", "--leaf", ids.leaf],
		planDefault: ["plan", noAdapt],
		planKeep60: ["plan", ...keep(60)],
		planKeep150: ["plan", ...keep(150)],
		planKeep300: ["plan", ...keep(300)],
		planMainKeep100: ["plan", "--leaf", ids.leaf, ...keep(100)],
		planMainKeep400: ["plan", "--leaf", ids.leaf, ...keep(400), "--context-window", "1800", "--reserve-tokens", "300"],
		branchAcross: ["plan", "--from", ids.leaf, "--to", ids.other],
		branchEditedAncestor: ["plan", "--from", ids.leaf, "--to", ids.u2],
		branchEditedAncestorBudget: ["plan", "--from", ids.leaf, "--to", ids.u2, "--budget", "60"],
		branchToFirst: ["plan", "--from", ids.leaf, "--to", ids.u1],
		serialize: ["serialize"],
		serializeMainBranch: ["serialize", "--leaf", ids.leaf],
	}),
);

// 3. edits before and after a compaction: before it, one on a summarized entry (from the kept
// range) and one on a kept entry; after it, one omitting a kept tool result and one on an entry
// the compaction summarized (allowed: it is on the raw branch; it changes nothing visible). The
// usage recorded between compaction and edits is then stale for pi's projected estimate.
fixture(
	"edits-around-compaction",
	(sm) => {
		const [u1] = c.turn(sm, 540, { total: 600 });
		const [, r1] = c.tools(sm, 542, [["read", { path: "early.md" }]], { total: 900 });
		const k = sm.appendMessage(c.user(filler(545, 200)));
		const a2 = sm.appendMessage(c.assistant(filler(546, 300), { total: 1200 }).message);
		const [, r2] = c.tools(sm, 547, [["edit", { path: "k.py", oldText: "a", newText: "b" }]], { total: 1500 });
		sm.appendContextEdit(r1, { content: "early result, trimmed" });
		const before = sm.appendContextEdit(a2, { content: "kept answer, edited before the compaction" });
		const comp = sm.appendCompaction("## Goal\nedits around a compaction", k, 1500, { readFiles: ["early.md"], modifiedFiles: ["k.py"] });
		const [, a3] = c.turn(sm, 550, { total: 700 });
		sm.appendContextEdit(r2, null);
		const late = sm.appendContextEdit(u1, { content: "an edit of an entry the compaction summarized" });
		c.turn(sm, 552, { total: 900 });
		return { before, comp, a3, late };
	},
	(ids) => ({
		context: ["context"],
		contextBeforeCompaction: ["context", "--leaf", ids.before],
		contextAtCompaction: ["context", "--leaf", ids.comp],
		contextUsageAfterCompaction: ["context", "--leaf", ids.a3],
		contextAfterLateEdits: ["context", "--leaf", ids.late],
		planBeforeCompactionKeep150: ["plan", "--leaf", ids.before, ...keep(150)],
		planBeforeCompactionKeep400: ["plan", "--leaf", ids.before, ...keep(400)],
		planAfterLateEditsKeep100: ["plan", "--leaf", ids.late, ...keep(100), "--context-window", "1000", "--reserve-tokens", "200"],
		planKeep60: ["plan", ...keep(60)],
		planKeep200: ["plan", ...keep(200)],
		planDefault: ["plan", noAdapt],
		serialize: ["serialize"],
		serializeBeforeCompaction: ["serialize", "--leaf", ids.before],
	}),
);

// 4. retain-none compactions (firstKeptEntryId = the compaction's own id), one followed by a
// normal compaction, and one as the leaf ("Already compacted").
fixture(
	"retain-none",
	(sm) => {
		c.turn(sm, 560, { total: 500 });
		c.tools(sm, 562, [["write", { path: "r.txt", content: "r" }]], { total: 800 });
		c.turn(sm, 565, { total: 1100 });
		const none1 = sm.appendCompaction("retained nothing", undefined, 1100, { readFiles: [], modifiedFiles: ["r.txt"] });
		const [u4] = c.turn(sm, 567, { total: 400 });
		const k = sm.appendMessage(c.user(filler(569, 200)));
		sm.appendMessage(c.assistant(filler(570, 300), { total: 700 }).message);
		const normal = sm.appendCompaction("kept the last turn", k, 700, { readFiles: ["q.md"], modifiedFiles: [] });
		c.turn(sm, 571, { total: 500 });
		c.tools(sm, 573, [["read", { path: "q.md" }]], { total: 800 });
		const beforeLast = sm.getLeafId();
		const none2 = sm.appendCompaction("retained nothing again", undefined, 800, { readFiles: ["q.md"], modifiedFiles: ["r.txt"] });
		return { none1, u4, normal, beforeLast, none2 };
	},
	(ids) => ({
		context: ["context"],
		contextAfterFirst: ["context", "--leaf", ids.u4],
		contextAtNormal: ["context", "--leaf", ids.normal],
		contextBeforeLast: ["context", "--leaf", ids.beforeLast],
		planAtCompaction: ["plan", noAdapt],
		planAfterFirstKeep1: ["plan", "--leaf", ids.u4, ...keep(1)],
		planAfterFirstDefault: ["plan", "--leaf", ids.u4, noAdapt],
		planBeforeLastKeep100: ["plan", "--leaf", ids.beforeLast, ...keep(100)],
		planBeforeLastKeep300: ["plan", "--leaf", ids.beforeLast, ...keep(300)],
		branchBack: ["plan", "--from", ids.none2, "--to", ids.u4],
	}),
);

// 5. usage entries (no context, no estimate) and several roots: resetLeaf twice, and a branch
// summary made a root (branchWithSummary(null, ...)).
fixture(
	"usage-and-roots",
	(sm) => {
		const [u1] = c.turn(sm, 580, { total: 600 });
		sm.appendUsage("cache_warm", "anthropic", "claude-sonnet-4-5", usage(50_000, 50_000));
		c.turn(sm, 582, { total: 900 });
		const leaf1 = sm.getLeafId();
		sm.resetLeaf();
		const [u2] = c.turn(sm, 584, { total: 300 });
		sm.appendUsage("summary", "openai", "gpt-5.1-codex", usage(2000, 1500), "a note");
		const leaf2 = sm.getLeafId();
		sm.resetLeaf();
		sm.appendModelChange("openai", "gpt-5.1-codex");
		c.turn(sm, 586, { total: 400 });
		const leaf3 = sm.getLeafId();
		sm.branchWithSummary(null, "summary of the third root", { readFiles: ["root3.md"], modifiedFiles: [] });
		c.turn(sm, 588, { total: 450 });
		sm.appendUsage("cache_warm", "anthropic", "claude-sonnet-4-5", usage(9000, 9000));
		return { u1, leaf1, u2, leaf2, leaf3, leaf4: sm.getLeafId() };
	},
	(ids) => ({
		context: ["context"],
		contextFirstRoot: ["context", "--leaf", ids.leaf1],
		contextSecondRoot: ["context", "--leaf", ids.leaf2],
		contextThirdRoot: ["context", "--leaf", ids.leaf3],
		planDefault: ["plan", noAdapt],
		planKeep50: ["plan", ...keep(50)],
		planFirstRootKeep100: ["plan", "--leaf", ids.leaf1, ...keep(100)],
		branchAcrossRoots: ["plan", "--from", ids.leaf1, "--to", ids.leaf2],
		branchAcrossRootsBudget: ["plan", "--from", ids.leaf4, "--to", ids.leaf1, "--budget", "100"],
		branchWithinRoot: ["plan", "--from", ids.leaf1, "--to", ids.u1],
	}),
);

// 6. images in user content (with and without text), tool results, custom messages (entries and
// a custom-role message): pi counts each image as 4800 characters.
fixture(
	"images",
	(sm) => {
		const u1 = sm.appendMessage({ role: "user", content: [{ type: "text", text: "What is in this screenshot?" }, IMAGE], timestamp: c.tick() });
		sm.appendMessage(c.assistant(filler(590, 200), { total: 2000 }).message);
		c.tools(sm, 591, [["read", { path: "shot.png" }]], { total: 3500, image: true, resultChars: 40 });
		sm.appendCustomMessageEntry("screenshot", [{ type: "text", text: "attached" }, IMAGE], true);
		const u2 = sm.appendMessage({ role: "user", content: [IMAGE, IMAGE], timestamp: c.tick() });
		sm.appendMessage(c.assistant(filler(595, 200), { total: 6000 }).message);
		sm.appendMessage({ role: "custom", customType: "injected-image", content: [IMAGE], display: false, timestamp: c.tick() });
		c.turn(sm, 597, { total: 7500 });
		return { u1, u2 };
	},
	(ids) => ({
		context: ["context"],
		contextAtImagesOnly: ["context", "--leaf", ids.u2],
		planDefault: ["plan", noAdapt],
		planKeep100: ["plan", ...keep(100)],
		planKeep1300: ["plan", ...keep(1300)],
		planKeep2500: ["plan", ...keep(2500)],
		planKeep5000: ["plan", ...keep(5000)],
		branchBack: ["plan", "--from", ids.u2, "--to", ids.u1, "--budget", "1300"],
		serialize: ["serialize"],
	}),
);

// 7. overflow recovery: the last user message's failed attempt (an overflow error; on a second
// branch, a tool-using attempt and its result) omitted by context edits, as pi's
// _omitRecoveryAttempt leaves it; then the recovery compaction pi itself prepares, and the retry.
fixture(
	"overflow-recovery",
	(sm) => {
		c.turn(sm, 600, { total: 3000 });
		c.tools(sm, 602, [["read", { path: "big.log" }]], { total: 5000, resultChars: 900 });
		c.turn(sm, 605, { total: 9000 });
		const u = sm.appendMessage(c.user(filler(610, 300)));
		const failed = c.assistant("", { stopReason: "error", errorMessage: "prompt is too long: 210000 tokens > 200000 maximum" });
		const f = sm.appendMessage(failed.message);
		const omitted = sm.appendContextEdit(f, null);
		const comp = compactLikePi(sm, "## Goal\nrecovered from an overflow", 300);
		const retry = sm.appendMessage(c.assistant(filler(612, 250), { total: 1200 }).message);
		sm.branch(u);
		const attempt = c.assistant(filler(614, 40), { calls: [["read", { path: "huge.log" }]], total: 260_000 });
		const a = sm.appendMessage(attempt.message);
		const r = sm.appendMessage(c.toolResult(attempt.callIds[0], "read", filler(615, 1200)));
		sm.appendContextEdit(a, null);
		const omittedBoth = sm.appendContextEdit(r, null);
		return { u, f, omitted, comp, retry, omittedBoth };
	},
	(ids) => ({
		context: ["context"],
		contextOmitted: ["context", "--leaf", ids.omitted],
		contextBeforeOmission: ["context", "--leaf", ids.f],
		contextAfterRecovery: ["context", "--leaf", ids.retry],
		planOmittedKeep1: ["plan", "--leaf", ids.omitted, ...keep(1)],
		planOmittedKeep300: ["plan", "--leaf", ids.omitted, ...keep(300)],
		planOmittedKeep1000: ["plan", "--leaf", ids.omitted, ...keep(1000)],
		planBeforeOmissionKeep300: ["plan", "--leaf", ids.f, ...keep(300)],
		planKeep300: ["plan", ...keep(300)],
		planKeep600: ["plan", ...keep(600)],
		planAfterRecoveryKeep100: ["plan", "--leaf", ids.retry, ...keep(100)],
		branchAcross: ["plan", "--from", ids.retry, "--to", ids.omittedBoth],
		serializeOmitted: ["serialize", "--leaf", ids.omitted],
	}),
);

rmSync(scratch, { recursive: true, force: true });
// Merge into cases.json: this script's fixtures replace their own entries (unselected ones keep
// theirs, ids and all); every other fixture (make_fixtures.mjs, make_cli_fixture.mjs) is kept.
const file = join(dataDir, "cases.json");
const existing = JSON.parse(readFileSync(file, "utf8")).fixtures;
const merged = { ...existing };
for (const [name, spec] of Object.entries(cases)) if (selected(name)) merged[name] = spec;
writeFileSync(file, `${JSON.stringify({ fixtures: merged }, null, 2)}\n`);
process.stderr.write(`wrote ${Object.keys(cases).filter(selected).join(", ")} (pi ${piVersion}) to ${dataDir}\n`);
