#!/usr/bin/env node
// tests/data/pi/cli-rpc.jsonl: a session written by pi's CLI itself (the pinned pi, run with the
// node 22 that npm ci installs here), not by a SessionManager we drive. pi runs in RPC mode
// (`--mode rpc`) against fake_openai.mjs on 127.0.0.1, configured through models.json and
// settings.json in a temporary agent directory (PI_CODING_AGENT_DIR) with a temporary HOME,
// offline (--offline, PI_OFFLINE, no version check, no telemetry, no MCP, no extensions) and
// with every proxy variable pointing at a closed loopback port, so nothing leaves the machine.
// The script sends prompts (one makes the fake model call pi's read tool), a bash command, a
// thinking-level change, a session name and a `compact` command, and one more prompt after it;
// then copies the session file, adds its cases to cases.json and records pi's answers.
//
// Usage: node make_cli_fixture.mjs   (from tests/conformance, after npm ci; PI_NODE overrides node)

import { spawn, spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startFakeOpenAI } from "./fake_openai.mjs";
import { dataDir, here, node22, piDir, piVersion } from "./pi_package.mjs";

const NAME = "cli-rpc";
const root = mkdtempSync(join(tmpdir(), "pi-cli-fixture-"));
const agentDir = join(root, "agent");
const sessionDir = join(root, "sessions");
const home = join(root, "home");
const cwd = join(root, "project");
for (const dir of [agentDir, sessionDir, home, cwd]) mkdirSync(dir, { recursive: true });
writeFileSync(join(cwd, "notes.md"), "# Plan\n\n1. Parse the session file.\n2. Compact it.\n3. Check against pi.\n");

const server = await startFakeOpenAI();
const zeroCost = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 };
writeFileSync(
	join(agentDir, "models.json"),
	JSON.stringify({
		providers: {
			fake: {
				name: "Fake (loopback)",
				baseUrl: `http://127.0.0.1:${server.port}/v1`,
				api: "openai-completions",
				apiKey: "fake-key",
				models: [{ id: "fake-model", name: "Fake model", contextWindow: 200_000, maxTokens: 4000, cost: zeroCost, input: ["text"] }],
			},
		},
	}),
);
// keepRecentTokens small enough that the manual compaction has something to summarize.
writeFileSync(join(agentDir, "settings.json"), JSON.stringify({ compaction: { enabled: true, keepRecentTokens: 150 } }));

const closedPort = "http://127.0.0.1:9";
const env = {
	PATH: process.env.PATH,
	HOME: home,
	PI_CODING_AGENT_DIR: agentDir,
	PI_OFFLINE: "1",
	PI_SKIP_VERSION_CHECK: "1",
	PI_TELEMETRY: "0",
	HTTP_PROXY: closedPort,
	HTTPS_PROXY: closedPort,
	ALL_PROXY: closedPort,
	http_proxy: closedPort,
	https_proxy: closedPort,
	all_proxy: closedPort,
	NO_PROXY: "127.0.0.1,localhost",
	no_proxy: "127.0.0.1,localhost",
	TZ: "UTC",
};
const args = [
	join(piDir, "dist", "cli.js"),
	"--mode", "rpc",
	"--offline",
	"--no-mcp",
	"--no-extensions",
	"--no-skills",
	"--no-prompt-templates",
	"--no-themes",
	"--no-context-files",
	"--no-approve",
	"--session-dir", sessionDir,
	"--provider", "fake",
	"--model", "fake-model",
];
const pi = spawn(node22(), args, { cwd, env, stdio: ["pipe", "pipe", "pipe"] });
let stderr = "";
pi.stderr.on("data", (d) => (stderr += d));

// Strict JSONL framing: split on LF only (docs/rpc.md).
const waiters = [];
const events = [];
let pending = "";
pi.stdout.on("data", (d) => {
	pending += d;
	let at = pending.indexOf("\n");
	while (at >= 0) {
		const line = pending.slice(0, at).replace(/\r$/, "");
		pending = pending.slice(at + 1);
		at = pending.indexOf("\n");
		if (!line.trim()) continue;
		const record = JSON.parse(line);
		events.push(record);
		for (const w of [...waiters]) {
			if (w.match(record)) {
				waiters.splice(waiters.indexOf(w), 1);
				w.resolve(record);
			}
		}
	}
});

function waitFor(match, what, ms = 60_000) {
	return new Promise((resolveWait, rejectWait) => {
		const timer = setTimeout(() => rejectWait(new Error(`timed out waiting for ${what}\n${stderr}`)), ms);
		waiters.push({ match, resolve: (r) => (clearTimeout(timer), resolveWait(r)) });
	});
}

let counter = 0;
async function command(body, { settle = false } = {}) {
	const id = `req-${++counter}`;
	const settled = settle ? waitFor((r) => r.type === "agent_settled", `${body.type} to settle`) : undefined;
	const response = waitFor((r) => r.type === "response" && r.id === id, `${body.type} response`);
	pi.stdin.write(`${JSON.stringify({ id, ...body })}\n`);
	const result = await response;
	if (!result.success) throw new Error(`${body.type} failed: ${JSON.stringify(result)}\n${stderr}`);
	if (settled) await settled;
	return result;
}

let sessionFile;
try {
	await command({ type: "set_session_name", name: "cli fixture" });
	await command({ type: "prompt", message: "Please read notes.md and tell me what the plan is." }, { settle: true });
	await command({ type: "prompt", message: "Summarize the plan in two sentences." }, { settle: true });
	await command({ type: "bash", command: "echo checked" });
	await command({ type: "set_thinking_level", level: "off" });
	await command({ type: "prompt", message: "What should we check first, and why? Answer at length." }, { settle: true });
	await command({ type: "compact" });
	await command({ type: "prompt", message: "Continue after the compaction: what is left?" }, { settle: true });
	sessionFile = (await command({ type: "get_state" })).data.sessionFile;
} finally {
	pi.stdin.end();
	const exited = new Promise((r) => pi.once("exit", r));
	const timer = setTimeout(() => pi.kill("SIGTERM"), 5000);
	await exited;
	clearTimeout(timer);
	await server.close();
}
if (!sessionFile) throw new Error(`pi reported no session file\n${stderr}`);

const target = join(dataDir, `${NAME}.jsonl`);
copyFileSync(sessionFile, target);
rmSync(root, { recursive: true, force: true });

const entries = readFileSync(target, "utf8").trim().split("\n").slice(1).map((l) => JSON.parse(l));
const compactionEntry = entries.find((e) => e.type === "compaction");
if (!compactionEntry) throw new Error("pi wrote no compaction entry");
const beforeCompaction = compactionEntry.parentId;
const firstUser = entries.find((e) => e.type === "message" && e.message.role === "user").id;
const keep = (n) => ["--keep-recent-tokens", String(n), "--no-adaptive-keep"];
const runs = {
	context: ["context"],
	contextBeforeCompaction: ["context", "--leaf", beforeCompaction],
	contextAtCompaction: ["context", "--leaf", compactionEntry.id],
	planDefault: ["plan", "--no-adaptive-keep"],
	planKeep60: ["plan", ...keep(60)],
	planKeep150: ["plan", ...keep(150)],
	planBeforeCompactionKeep150: ["plan", "--leaf", beforeCompaction, ...keep(150)],
	planBeforeCompactionKeep400: ["plan", "--leaf", beforeCompaction, ...keep(400)],
	branchToFirstUser: ["plan", "--from", entries[entries.length - 1].id, "--to", firstUser],
	serialize: ["serialize"],
	serializeBeforeCompaction: ["serialize", "--leaf", beforeCompaction],
};
const casesFile = join(dataDir, "cases.json");
const cases = JSON.parse(readFileSync(casesFile, "utf8"));
cases.fixtures[NAME] = { file: `${NAME}.jsonl`, runs };
writeFileSync(casesFile, `${JSON.stringify(cases, null, 2)}\n`);
process.stderr.write(`wrote ${target} (${entries.length} entries, pi ${piVersion} CLI, ${server.requests.length} model requests)\n`);

const recorded = spawnSync(process.execPath, [join(here, "pi_reference.mjs"), "record", "--only", NAME], { stdio: "inherit" });
process.exitCode = recorded.status ?? 1;
