// Deterministic message content for the session generators (make_fixtures_pi16.mjs,
// random_sessions.mjs, make_cli_fixture.mjs): text, message shapes as pi stores them, and one
// session written by pi's own SessionManager. make_fixtures.mjs (the pi 0.73.1 files) takes
// only the pure text and usage helpers, keeping its own clock so that its output never changes.

import { copyFileSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"];

/** `n` characters of text, different for each seed. */
export function filler(seed, n) {
	let out = "";
	for (let i = 0; out.length < n; i++) out += `${WORDS[(seed * 7 + i) % WORDS.length]}${(seed + i) % 97} `;
	return out.slice(0, n);
}

/** A 1x1 PNG's worth of base64: pi estimates every image at 4800 characters whatever its size. */
export const IMAGE = { type: "image", data: "iVBORw0KGgo=", mimeType: "image/png" };

export function usage(total, input = total) {
	return {
		input,
		output: total - input,
		cacheRead: 0,
		cacheWrite: 0,
		totalTokens: total,
		cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
	};
}

/** Message builders sharing one clock (epoch ms, one second apart) and one tool-call counter. */
export function content(start = 1_780_000_000_000) {
	let clock = start;
	let calls = 0;
	const tick = () => (clock += 1000);
	const api = {
		tick,
		user: (text) => ({ role: "user", content: text, timestamp: tick() }),
		/** A system message: `content`, `sections` patch by name (null removes), tool changes. */
		system: ({ text = "", sections, toolsAdded, toolsRemoved } = {}) => ({
			role: "system",
			content: text,
			...(sections ? { sections } : {}),
			...(toolsAdded ? { toolsAdded } : {}),
			...(toolsRemoved ? { toolsRemoved: toolsRemoved.map((name) => ({ name })) } : {}),
			timestamp: tick(),
		}),
		tool: (name, description = `The ${name} tool.`) => ({
			name,
			description,
			parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] },
		}),
		/** An assistant message; `calls` are [name, arguments] pairs; returns {message, callIds}. */
		assistant(text, { calls: list = [], total = 0, stopReason, errorMessage, provider = "anthropic", model = "claude-sonnet-4-5", thinking } = {}) {
			const blocks = [];
			if (thinking) blocks.push({ type: "thinking", thinking });
			if (text) blocks.push({ type: "text", text });
			const callIds = [];
			for (const [name, args] of list) {
				const id = `toolu_${String(++calls).padStart(4, "0")}`;
				callIds.push(id);
				blocks.push({ type: "toolCall", id, name, arguments: args });
			}
			const message = {
				role: "assistant",
				content: blocks,
				api: "anthropic-messages",
				provider,
				model,
				usage: usage(total),
				stopReason: stopReason ?? (list.length ? "toolUse" : "stop"),
				...(errorMessage ? { errorMessage } : {}),
				timestamp: tick(),
			};
			return { message, callIds };
		},
		toolResult(callId, toolName, text, { isError = false, image = false } = {}) {
			const blocks = [{ type: "text", text }];
			if (image) blocks.push(IMAGE);
			return { role: "toolResult", toolCallId: callId, toolName, content: blocks, isError, timestamp: tick() };
		},
		/** Append user -> assistant; returns [userId, assistantId]. */
		turn(sm, seed, { userChars = 200, answerChars = 400, total = 0 } = {}) {
			const u = sm.appendMessage(api.user(filler(seed, userChars)));
			const a = sm.appendMessage(api.assistant(filler(seed + 1, answerChars), { total }).message);
			return [u, a];
		},
		/** Append an assistant making tool calls and their results; returns [assistantId, ...resultIds]. */
		tools(sm, seed, list, { resultChars = 300, total = 0, image = false } = {}) {
			const { message, callIds } = api.assistant(filler(seed, 60), { calls: list, total });
			const a = sm.appendMessage(message);
			const results = callIds.map((id, i) => sm.appendMessage(api.toolResult(id, list[i][0], filler(seed + i + 3, resultChars), { image })));
			return [a, ...results];
		},
	};
	return api;
}

/**
 * Build one session with pi's SessionManager (lazy persistence, random 8-hex ids, wall-clock
 * entry timestamps: exactly what pi writes) and move its file to `target`.
 * `build(sm)` returns whatever the caller needs (ids); returns {result, sm}.
 */
export function writeSession(SessionManager, target, build, cwd = "/work/project") {
	const dir = mkdtempSync(join(tmpdir(), "pi-fixture-"));
	try {
		const sm = SessionManager.create(cwd, dir);
		const result = build(sm);
		const [file] = readdirSync(dir).filter((f) => f.endsWith(".jsonl"));
		if (!file) throw new Error(`pi wrote no file for ${target} (no user or assistant message?)`);
		copyFileSync(join(dir, file), target);
		return { result, sm };
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
}
