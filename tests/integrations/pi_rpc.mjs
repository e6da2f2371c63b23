#!/usr/bin/env node
// Runs pi's CLI (the pinned pi 1.6.0 of tests/conformance, node 22) in RPC mode with our extension
// (integrations/pi) loaded, against tests/conformance/fake_openai.mjs, offline in a temporary
// agent directory, as make_cli_fixture.mjs does. The steps come as JSON in argv[2]; the extension
// reaches `orchestrator serve` through ORCHESTRATOR_SOCKET (and ORCHESTRATOR_ON_FAILURE), passed
// through from this process's environment.
//
// Steps: {"type": <an RPC command>, ...} is sent and its response awaited ("settle": true also
// waits for agent_settled; "async": true sends it and goes on); {"step": "waitCalls", "url",
// "count"} polls a fake summary server's GET /calls until it has answered `count` requests;
// {"step": "awaitAsync"} waits for the responses of the commands sent with "async".
//
// PI_E2E_ROOT: the folder for the agent directory, sessions, home and project (else a new
// temporary one, left behind for the caller to read the session and remove).
// Prints one JSON object: {sessionFile, responses, notifications, events, modelRequests}.
// Usage: node pi_rpc.mjs STEPS_JSON [SETTINGS_JSON]

import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { startFakeOpenAI } from "../conformance/fake_openai.mjs";
import { node22, piDir } from "../conformance/pi_package.mjs";

const here = dirname(fileURLToPath(import.meta.url));
// The package folder: pi reads its manifest ("pi": {"extensions": ["./index.ts"]}).
const extension = resolve(here, "..", "..", "integrations", "pi");
const steps = JSON.parse(process.argv[2] ?? "[]");
const settings = JSON.parse(process.argv[3] ?? '{"compaction": {"enabled": true, "keepRecentTokens": 150}}');

const root = process.env.PI_E2E_ROOT || mkdtempSync(join(tmpdir(), "pi-extension-e2e-"));
const agentDir = join(root, "agent");
const sessionDir = join(root, "sessions");
const home = join(root, "home");
const cwd = join(root, "project");
for (const dir of [agentDir, sessionDir, home, cwd]) mkdirSync(dir, { recursive: true });
writeFileSync(join(cwd, "notes.md"), "# Plan\n\n1. Parse the session file.\n2. Compact it.\n3. Check against pi.\n");

const server = await startFakeOpenAI();
const zeroCost = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 };
const contextWindow = Number(process.env.PI_E2E_CONTEXT_WINDOW || 200_000);
writeFileSync(
	join(agentDir, "models.json"),
	JSON.stringify({
		providers: {
			fake: {
				name: "Fake (loopback)",
				baseUrl: `http://127.0.0.1:${server.port}/v1`,
				api: "openai-completions",
				apiKey: "fake-key",
				models: [{ id: "fake-model", name: "Fake model", contextWindow, maxTokens: 4000, cost: zeroCost, input: ["text"] }],
			},
		},
	}),
);
writeFileSync(join(agentDir, "settings.json"), JSON.stringify(settings));

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
for (const name of ["ORCHESTRATOR_SOCKET", "ORCHESTRATOR_ON_FAILURE"]) {
	if (process.env[name] !== undefined) env[name] = process.env[name];
}
const args = [
	join(piDir, "dist", "cli.js"),
	"--mode", "rpc",
	"--offline",
	"--no-mcp",
	"--no-extensions",
	"--extension", extension,
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
function send(body) {
	const id = `req-${++counter}`;
	const response = waitFor((r) => r.type === "response" && r.id === id, `${body.type} response`);
	pi.stdin.write(`${JSON.stringify({ id, ...body })}\n`);
	return response;
}

async function waitCalls(url, count) {
	const deadline = Date.now() + 30_000;
	for (;;) {
		const calls = await fetch(url).then((r) => r.json());
		if (calls >= count) return;
		if (Date.now() > deadline) throw new Error(`the summary server had ${calls} calls, not ${count}`);
		await new Promise((r) => setTimeout(r, 50));
	}
}

const responses = [];
const asynchronous = [];
let sessionFile;
try {
	for (const step of steps) {
		if (step.step === "waitCalls") {
			await waitCalls(step.url, step.count);
			continue;
		}
		if (step.step === "awaitAsync") {
			responses.push(...(await Promise.all(asynchronous.splice(0))));
			continue;
		}
		const { settle = false, async: later = false, ...body } = step;
		const settled = settle ? waitFor((r) => r.type === "agent_settled", `${body.type} to settle`) : undefined;
		const response = send(body);
		if (later) {
			asynchronous.push(response);
			continue;
		}
		responses.push(await response);
		if (settled) await settled;
	}
	responses.push(...(await Promise.all(asynchronous.splice(0))));
	sessionFile = (await send({ type: "get_state" })).data.sessionFile;
} finally {
	pi.stdin.end();
	const exited = new Promise((r) => pi.once("exit", r));
	const timer = setTimeout(() => pi.kill("SIGTERM"), 5000);
	await exited;
	clearTimeout(timer);
	await server.close();
}
const notifications = events.filter((e) => e.type === "extension_ui_request" && e.method === "notify");
const kept = events.filter((e) => /compaction|session_compact|extension_error/.test(e.type));
process.stdout.write(
	`${JSON.stringify({ sessionFile, root, responses, notifications, events: kept, modelRequests: server.requests.length, stderr })}\n`,
);
