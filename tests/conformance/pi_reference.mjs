#!/usr/bin/env node
// What pi itself says about a session file, printed in the shape of our inspection JSON
// (docs/sessions.md, "Inspection JSON"), so that tests can compare the two on the same files.
//
// Usage (the same arguments as `orchestrator ... --json`, after the command):
//   node pi_reference.mjs context SESSION.jsonl [--leaf ID]
//   node pi_reference.mjs plan SESSION.jsonl [--leaf ID] [--keep-recent-tokens N]
//        [--reserve-tokens N] [--context-window N] [--no-adaptive-keep]
//   node pi_reference.mjs plan SESSION.jsonl --from OLD_LEAF --to TARGET [--budget N]
//   node pi_reference.mjs serialize SESSION.jsonl [--leaf ID]   (the context as the summarizer
//        reads it, {leafId, text}, without the summaries: their wrappers are our own words)
//   node pi_reference.mjs record [--suffix S] [--only a,b]   (re-record tests/data/pi/*.expected.json)
//   node pi_reference.mjs dump [--only a,b]   (the same answers as one JSON object on stdout)
//   node pi_reference.mjs sweep [--random DIR]   (thousands of runs over every leaf, for the
//        opt-in test; DIR: random sessions written by random_sessions.mjs)
//   node pi_reference.mjs version          (the pi version in use)
// `--json` is accepted and ignored (the output is always JSON). `--index-ids` replaces every
// entry id in the output by "#<file index>" (0 = first entry after the header): a v1 file gets
// random ids on migration, in pi and in our code, so only positions can be compared.
//
// Only pi's exported functions decide anything here: SessionManager (loading, v1..v3 migration,
// getBranch), buildSessionProjection (pi 1.x) / buildSessionContext, estimateTokens,
// estimateProjectedContextTokens (pi 1.x) / estimateContextTokens, prepareCompaction,
// computeFileLists, shouldCompact, collectEntriesForBranchSummary, prepareBranchEntries,
// convertToLlm and serializeConversation. pi returns messages, not entry ids; the script maps
// them back to the (projected) entries that produced them and checks the mapping against pi's own
// result (it throws rather than guess), so the ids printed are pi's answer, not a
// re-implementation.
//
// The pi package is the one pinned in package.json (npm ci in this folder), or the one named by
// PI_PACKAGE_DIR (for example pi 0.73.1 installed elsewhere; see pi_package.mjs). pi 1.x is
// recognised by its buildSessionProjection export; older pi takes the older path below
// (findCutPoint on the raw path, buildSessionContext, estimateContextTokens).

import { copyFileSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { isDeepStrictEqual } from "node:util";
import { dataDir, piModule, piVersion } from "./pi_package.mjs";

// prepareCompaction and estimateContextTokens are not re-exported from the package index.
const sessionManager = await piModule("core/session-manager.js");
const { SessionManager, buildSessionContext } = sessionManager;
const compaction = await piModule("core/compaction/compaction.js");
const branch = await piModule("core/compaction/branch-summarization.js");
const utils = await piModule("core/compaction/utils.js");
const { convertToLlm } = await piModule("core/messages.js");
// pi 1.x projects the context (context edits, system messages) and compacts on the projection;
// pi 0.73.1 (PI_PACKAGE_DIR) has neither, and takes the older path through this script.
const projected = typeof sessionManager.buildSessionProjection === "function";

const DEFAULTS = { keepRecentTokens: 20000, reserveTokens: 16384, budget: 0 };

function parseArgs(argv) {
	const [command, session, ...rest] = argv;
	const options = { command, session, adaptive: true, indexIds: false, ...DEFAULTS };
	const numeric = {
		"--keep-recent-tokens": "keepRecentTokens",
		"--reserve-tokens": "reserveTokens",
		"--context-window": "contextWindow",
		"--budget": "budget",
	};
	const text = { "--leaf": "leaf", "--from": "from", "--to": "to" };
	for (let i = 0; i < rest.length; i++) {
		const arg = rest[i];
		if (arg in numeric) options[numeric[arg]] = Number.parseInt(rest[++i], 10);
		else if (arg in text) options[text[arg]] = rest[++i];
		else if (arg === "--no-adaptive-keep") options.adaptive = false;
		else if (arg === "--index-ids") options.indexIds = true;
		else if (arg !== "--json") throw new Error(`unknown argument ${arg}`);
	}
	return options;
}

// Open a copy: pi rewrites a file it migrates (v1, v2) or cannot read.
function openSession(file) {
	const dir = mkdtempSync(join(tmpdir(), "pi-ref-"));
	const copy = join(dir, "session.jsonl");
	copyFileSync(file, copy);
	try {
		return SessionManager.open(copy, dir);
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
}

function leafOf(sm, leaf) {
	if (leaf === undefined) return sm.getLeafId();
	if (!sm.getEntry(leaf)) throw new Error(`Entry ${leaf} not found`);
	return leaf;
}

// The context at a leaf: pi 1.x's projection (edits applied, the compaction's system checkpoint
// first) and its projected estimate, which distrusts usage recorded before a later context edit
// or compaction (the estimate pi's compaction threshold, tokensBefore and footer use). Our JSON
// has one `tokens` object; it holds the projected estimate. pi 0.73.1: buildSessionContext and
// estimateContextTokens.
function contextReport(sm, options) {
	const leafId = leafOf(sm, options.leaf);
	let messages;
	let context;
	let tokens;
	if (projected) {
		context = sessionManager.buildSessionProjection(sm.getEntries(), leafId, undefined);
		messages = context.messages;
		tokens = compaction.estimateProjectedContextTokens(context, leafId ? sm.getBranch(leafId) : []);
	} else {
		context = buildSessionContext(sm.getEntries(), leafId, undefined);
		messages = context.messages;
		tokens = compaction.estimateContextTokens(messages);
	}
	return {
		leafId,
		messages,
		thinkingLevel: context.thinkingLevel,
		model: context.model,
		tokens,
		messageTokens: messages.map((m) => compaction.estimateTokens(m)),
	};
}

function producing(entries, toMessages) {
	const ids = [];
	const messages = [];
	for (const entry of entries) {
		const produced = toMessages(entry);
		if (produced.length > 0) {
			ids.push(entry.id ?? entry.sourceEntry.id);
			messages.push(...produced);
		}
	}
	return { ids, messages };
}

const same = (a, b) => isDeepStrictEqual(JSON.parse(JSON.stringify(a)), JSON.parse(JSON.stringify(b)));

// pi 1.x: prepareCompaction cuts the projection of the path (buildSessionProjection), whose
// entries carry their sourceEntry, so its firstKeptEntryId is a projected entry. What is
// summarized is the projected entries' messages (system messages and compaction entries left
// out) from after the previous compaction to the cut, or to the split turn's start; the turn
// start is the entry producing the first turn-prefix message. Every candidate is checked against
// prepareCompaction's own messagesToSummarize / turnPrefixMessages: exactly one must match.
function explainProjectedPreparation(path, prep) {
	const entries = sessionManager.buildSessionProjection(path).entries;
	const forSummary = (e) => (e.sourceEntry.type === "compaction" ? [] : e.messages.filter((m) => m.role !== "system"));
	const previous = entries.findIndex((e) => e.sourceEntry.type === "compaction" && e.messages.length > 0);
	if ((previous >= 0 ? entries[previous].sourceEntry.summary : undefined) !== prep.previousSummary) {
		throw new Error("previous compaction is not the projection's first entry");
	}
	const start = previous + 1;
	const cut = entries.findIndex((e) => e.sourceEntry.id === prep.firstKeptEntryId);
	if (cut < start) throw new Error("firstKeptEntryId is not in the projected window");
	const starts = prep.isSplitTurn ? [] : [cut];
	if (prep.isSplitTurn) {
		for (let t = start; t < cut; t++) if (forSummary(entries[t]).length > 0) starts.push(t);
	}
	const found = [];
	for (const turnStart of starts) {
		const history = producing(entries.slice(start, turnStart), forSummary);
		const prefix = producing(entries.slice(turnStart, cut), forSummary);
		if (!same(history.messages, prep.messagesToSummarize)) continue;
		if (!same(prefix.messages, prep.turnPrefixMessages)) continue;
		found.push({
			turnStartEntryId: prep.isSplitTurn ? entries[turnStart].sourceEntry.id : null,
			summarizeEntryIds: history.ids,
			turnPrefixEntryIds: prefix.ids,
		});
	}
	if (found.length !== 1) throw new Error(`cannot map prepareCompaction's messages back to entries (${found.length} matches)`);
	return found[0];
}

// pi 0.73.1: the message an entry gives the compaction summarizer (its
// getMessageFromEntryForCompaction is private; this mirrors it and is checked against
// prepareCompaction's result below).
function legacyCompactionMessages(entry) {
	if (entry.type === "compaction") return [];
	switch (entry.type) {
		case "message":
			return [entry.message];
		case "custom_message":
			return [{ role: "custom", customType: entry.customType, content: entry.content, display: entry.display, details: entry.details, timestamp: new Date(entry.timestamp).getTime() }];
		case "branch_summary":
			return [{ role: "branchSummary", summary: entry.summary, fromId: entry.fromId, timestamp: new Date(entry.timestamp).getTime() }];
		default:
			return [];
	}
}

// pi 0.73.1's window start is private too and changed between versions (0.58: after the previous
// compaction; later: at its first kept entry, the pi#2608 fix). Try each candidate and keep the
// one that reproduces prepareCompaction's own answer exactly.
function explainLegacyPreparation(path, prep, keep) {
	let prev = -1;
	for (let i = path.length - 1; i >= 0; i--) {
		if (path[i].type === "compaction") {
			prev = i;
			break;
		}
	}
	const candidates = [0];
	if (prev >= 0) {
		const kept = path.findIndex((e) => e.id === path[prev].firstKeptEntryId);
		candidates.splice(0, 1, ...(kept >= 0 ? [kept] : []), prev + 1);
	}
	for (const start of candidates) {
		const cut = compaction.findCutPoint(path, start, path.length, keep);
		if (path[cut.firstKeptEntryIndex]?.id !== prep.firstKeptEntryId) continue;
		if (cut.isSplitTurn !== prep.isSplitTurn) continue;
		const historyEnd = cut.isSplitTurn ? cut.turnStartIndex : cut.firstKeptEntryIndex;
		const history = producing(path.slice(start, historyEnd), legacyCompactionMessages);
		const prefix = cut.isSplitTurn
			? producing(path.slice(cut.turnStartIndex, cut.firstKeptEntryIndex), legacyCompactionMessages)
			: { ids: [], messages: [] };
		if (!same(history.messages, prep.messagesToSummarize)) continue;
		if (!same(prefix.messages, prep.turnPrefixMessages)) continue;
		return {
			turnStartEntryId: cut.isSplitTurn ? path[cut.turnStartIndex].id : null,
			summarizeEntryIds: history.ids,
			turnPrefixEntryIds: prefix.ids,
		};
	}
	throw new Error("cannot map prepareCompaction's messages back to entries");
}

function planReport(sm, options) {
	const leafId = leafOf(sm, options.leaf);
	const path = leafId ? sm.getBranch(leafId) : [];
	const settings = { enabled: true, reserveTokens: options.reserveTokens, keepRecentTokens: options.keepRecentTokens };
	// The estimate pi 1.x compares with the threshold (AgentSession._exceedsCompactionThreshold).
	const contextTokens = projected
		? compaction.estimateProjectedContextTokens(sessionManager.buildSessionProjection(path), path).tokens
		: compaction.estimateContextTokens(buildSessionContext(path).messages).tokens;
	const window = options.contextWindow;
	const prep = compaction.prepareCompaction(path, settings);
	let plan = null;
	let reason = null;
	if (prep === undefined) {
		// AgentSession.compact's two messages for prepareCompaction returning nothing.
		const last = path[path.length - 1];
		reason = last?.type === "compaction" ? "Already compacted" : "Nothing to compact (session too small)";
	} else {
		const lists = utils.computeFileLists(prep.fileOps);
		const mapped = projected
			? explainProjectedPreparation(path, prep)
			: explainLegacyPreparation(path, prep, settings.keepRecentTokens);
		// Same key order as ours.
		plan = {
			firstKeptEntryId: prep.firstKeptEntryId,
			isSplitTurn: prep.isSplitTurn,
			turnStartEntryId: mapped.turnStartEntryId,
			summarizeEntryIds: mapped.summarizeEntryIds,
			turnPrefixEntryIds: mapped.turnPrefixEntryIds,
			tokensBefore: prep.tokensBefore,
			previousSummary: prep.previousSummary ?? null,
			readFiles: lists.readFiles,
			modifiedFiles: lists.modifiedFiles,
		};
	}
	return {
		leafId,
		keepRecentTokens: options.keepRecentTokens,
		effectiveKeepRecentTokens: options.keepRecentTokens, // pi has no adaptation (D7 is ours)
		contextTokens,
		threshold: window === undefined ? null : window - options.reserveTokens,
		shouldCompact: window === undefined ? null : compaction.shouldCompact(contextTokens, window, settings),
		compaction: plan,
		reason,
	};
}

function serializeReport(sm, options) {
	const leafId = leafOf(sm, options.leaf);
	const context = buildSessionContext(sm.getEntries(), leafId, undefined);
	const messages = context.messages.filter((m) => m.role !== "compactionSummary" && m.role !== "branchSummary");
	return { leafId, text: utils.serializeConversation(convertToLlm(messages)) };
}

function branchReport(sm, options) {
	for (const id of [options.from, options.to]) leafOf(sm, id);
	const { entries, commonAncestorId } = branch.collectEntriesForBranchSummary(sm, options.from, options.to);
	const prepared = branch.prepareBranchEntries(entries, options.budget);
	// pi keeps a suffix of the message-producing entries (it walks newest first and stops). Which
	// message each entry produces is asked of prepareBranchEntries itself, one entry at a time
	// (with the context edits that target it, pi 1.x), so no rule of pi's is copied here.
	const edits = entries.filter((e) => e.type === "context_edit");
	const alone = (entry) => {
		const own = edits.filter((e) => e.targetId === entry.id);
		return branch.prepareBranchEntries([entry, ...own], 0).messages;
	};
	const all = producing(entries, alone);
	if (all.ids.length !== all.messages.length) throw new Error("an entry produced several branch messages");
	const kept = all.ids.slice(all.ids.length - prepared.messages.length);
	if (!same(all.messages.slice(all.messages.length - prepared.messages.length), prepared.messages)) {
		throw new Error("cannot map prepareBranchEntries' messages back to entries");
	}
	const lists = utils.computeFileLists(prepared.fileOps);
	return {
		oldLeafId: options.from,
		targetId: options.to,
		commonAncestorId,
		entryIds: entries.map((e) => e.id),
		summarizedEntryIds: kept,
		totalTokens: prepared.totalTokens,
		readFiles: lists.readFiles,
		modifiedFiles: lists.modifiedFiles,
	};
}

const ID_KEYS = new Set(["leafId", "oldLeafId", "targetId", "commonAncestorId", "firstKeptEntryId", "turnStartEntryId"]);
const ID_LIST_KEYS = new Set(["summarizeEntryIds", "turnPrefixEntryIds", "entryIds", "summarizedEntryIds"]);

// Replace entry ids by their position in the file (see the usage note on --index-ids).
function indexIds(report, sm) {
	const index = new Map(sm.getEntries().map((e, i) => [e.id, `#${i}`]));
	const walk = (value, key) => {
		if (ID_KEYS.has(key) && typeof value === "string") return index.get(value) ?? value;
		if (ID_LIST_KEYS.has(key) && Array.isArray(value)) return value.map((v) => index.get(v) ?? v);
		if (Array.isArray(value)) return value.map((v) => walk(v, undefined));
		if (value && typeof value === "object") {
			return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, walk(v, k)]));
		}
		return value;
	};
	return walk(report, undefined);
}

// Translate a leaf or from/to given as "#<index>" into the migrated file's real id.
function resolveIndexedArgs(sm, options) {
	const entries = sm.getEntries();
	for (const key of ["leaf", "from", "to"]) {
		const value = options[key];
		if (typeof value === "string" && value.startsWith("#")) options[key] = entries[Number(value.slice(1))].id;
	}
}

export function report(file, argv) {
	const options = parseArgs([argv[0], file, ...argv.slice(1)]);
	const sm = openSession(file);
	if (options.indexIds) resolveIndexedArgs(sm, options);
	let result;
	if (options.command === "context") result = contextReport(sm, options);
	else if (options.command === "plan" && options.from !== undefined) result = branchReport(sm, options);
	else if (options.command === "plan") result = planReport(sm, options);
	else if (options.command === "serialize") result = serializeReport(sm, options);
	else throw new Error(`unknown command ${options.command}`);
	// JSON round trip: pi's objects carry `undefined` fields, which JSON (and so our CLI) omits.
	result = JSON.parse(JSON.stringify(result));
	return options.indexIds ? indexIds(result, sm) : result;
}

// Re-record the expected files listed in tests/data/pi/cases.json: NAME.expected.json, or with
// `--suffix S` NAME.S.expected.json (answers of another pi version, see PI_PACKAGE_DIR);
// `--only a,b` limits the fixtures.
function record(args, write = true) {
	const suffix = args.includes("--suffix") ? `.${args[args.indexOf("--suffix") + 1]}` : "";
	const only = args.includes("--only") ? args[args.indexOf("--only") + 1].split(",") : undefined;
	const cases = JSON.parse(readFileSync(join(dataDir, "cases.json"), "utf8"));
	const all = {};
	for (const [name, fixture] of Object.entries(cases.fixtures)) {
		if (only && !only.includes(name)) continue;
		const runs = {};
		for (const [run, argv] of Object.entries(fixture.runs)) {
			const args = fixture.indexIds ? [...argv, "--index-ids"] : argv;
			runs[run] = report(join(dataDir, fixture.file), args);
		}
		const out = { piVersion, file: fixture.file, runs };
		if (!write) {
			all[name] = out;
			continue;
		}
		writeFileSync(join(dataDir, `${name}${suffix}.expected.json`), `${JSON.stringify(out, null, 2)}\n`);
		process.stderr.write(`recorded ${name}${suffix} (${Object.keys(runs).length} runs, pi ${piVersion})\n`);
	}
	return all;
}

const KEEPS = ["1", "60", "150", "300", "800", "20000"];
const BUDGETS = ["0", "60", "200"];

/** Every run of the sweep on one session file; `pairs` limits the branch plans (all when absent). */
function sweepFile(out, name, file, pairs) {
	const ids = readFileSync(file, "utf8").trim().split("\n").slice(1).map((l) => JSON.parse(l).id);
	const add = (argv) => out.push({ fixture: name, file, argv, pi: report(file, argv) });
	for (const id of ids) {
		add(["context", "--leaf", id]);
		add(["serialize", "--leaf", id]);
		for (const keep of KEEPS) add(["plan", "--leaf", id, "--keep-recent-tokens", keep, "--no-adaptive-keep"]);
	}
	const all = ids.flatMap((from) => ids.map((to) => [from, to]));
	const chosen = pairs === undefined ? all : all.filter((_, i) => i % Math.max(1, Math.floor(all.length / pairs)) === 0);
	for (const [from, to] of chosen) for (const budget of BUDGETS) add(["plan", "--from", from, "--to", to, "--budget", budget]);
}

// Every leaf of every v3 fixture: context, the serialized context, and plans at a few budgets;
// branch plans between every pair of entries at a few budgets. With `--random DIR`, also the
// random sessions random_sessions.mjs wrote into DIR (branch plans on a sample of the pairs).
// Thousands of runs, compared live by test_pi_conformance.py; each item names its file.
export function sweep(args = []) {
	const cases = JSON.parse(readFileSync(join(dataDir, "cases.json"), "utf8"));
	const out = [];
	for (const [name, fixture] of Object.entries(cases.fixtures)) {
		if (fixture.indexIds) continue;
		sweepFile(out, name, join(dataDir, fixture.file));
	}
	const at = args.indexOf("--random");
	if (at >= 0) {
		const dir = resolve(args[at + 1]);
		for (const f of readdirSync(dir).filter((n) => n.endsWith(".jsonl")).sort()) {
			sweepFile(out, `random/${f.replace(/\.jsonl$/, "")}`, join(dir, f), 400);
		}
	}
	return out;
}

const [command, file, ...rest] = process.argv.slice(2);
const isMain = process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href;
if (!isMain) {
	// imported (for example by a sweep script): export only
} else if (command === "record") record(process.argv.slice(3));
else if (command === "dump") process.stdout.write(`${JSON.stringify(record(process.argv.slice(3), false))}\n`);
else if (command === "sweep") process.stdout.write(`${JSON.stringify(sweep(process.argv.slice(3)))}\n`);
else if (command === "version") process.stdout.write(`${piVersion}\n`);
else process.stdout.write(`${JSON.stringify(report(file, [command, ...rest]), null, 2)}\n`);
