// Running the pinned pi (CLI or SDK) offline against fake_openai.mjs, shared by
// make_cli_fixture.mjs and tests/integrations/pi_rpc.mjs, pi_tree.mjs.
//
// A root folder holds the agent directory (models.json naming the fake provider, settings.json),
// the session directory, a HOME and the project (cwd). pi runs offline (--offline, PI_OFFLINE,
// no version check, no telemetry, no MCP, no extensions but those named) with every proxy
// variable pointing at a closed loopback port, so nothing leaves the machine.

import { spawn } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { node22, piDir } from "./pi_package.mjs";

/** The folders below `root`: {agentDir, sessionDir, home, cwd}. */
export function piFolders(root) {
	return { agentDir: join(root, "agent"), sessionDir: join(root, "sessions"), home: join(root, "home"), cwd: join(root, "project") };
}

/** Create the folders below `root`, with a notes.md in the project; returns piFolders(root). */
export function makePiFolders(root) {
	const folders = piFolders(root);
	for (const dir of Object.values(folders)) mkdirSync(dir, { recursive: true });
	writeFileSync(join(folders.cwd, "notes.md"), "# Plan\n\n1. Parse the session file.\n2. Compact it.\n3. Check against pi.\n");
	return folders;
}

/** Write models.json in `agentDir`: provider "fake", model "fake-model", at the fake server's port. */
export function writeFakeModels(agentDir, port, { contextWindow = 200_000 } = {}) {
	const zeroCost = { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 };
	writeFileSync(
		join(agentDir, "models.json"),
		JSON.stringify({
			providers: {
				fake: {
					name: "Fake (loopback)",
					baseUrl: `http://127.0.0.1:${port}/v1`,
					api: "openai-completions",
					apiKey: "fake-key",
					models: [{ id: "fake-model", name: "Fake model", contextWindow, maxTokens: 4000, cost: zeroCost, input: ["text"] }],
				},
			},
		}),
	);
}

/** The environment of an offline pi: PATH, HOME, the agent directory, proxies at a closed port. */
export function offlineEnv({ home, agentDir }) {
	const closedPort = "http://127.0.0.1:9";
	return {
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
}

/** pi's CLI arguments for `--mode rpc` with the fake model, loading only `extensions`. */
export function rpcArgs(sessionDir, { extensions = [] } = {}) {
	return [
		join(piDir, "dist", "cli.js"),
		"--mode", "rpc",
		"--offline",
		"--no-mcp",
		"--no-extensions",
		...extensions.flatMap((e) => ["--extension", e]),
		"--no-skills",
		"--no-prompt-templates",
		"--no-themes",
		"--no-context-files",
		"--no-approve",
		"--session-dir", sessionDir,
		"--provider", "fake",
		"--model", "fake-model",
	];
}

/**
 * Start pi's CLI (node 22) with `args` in `cwd` with `env`. Returns {pi, events, stderr, waitFor,
 * send, command, stop}: `events` every record pi printed, `stderr` what it wrote there so far,
 * `waitFor(match, what)` the next record matching, `send(body)` a command's response,
 * `command(body, {settle})` the same, failing unless it succeeded ("settle": also waits for
 * agent_settled), `stop()` ends pi's input and waits for it to exit (SIGTERM after 5 s).
 */
export function startRpc(args, { cwd, env }) {
	const pi = spawn(node22(), args, { cwd, env, stdio: ["pipe", "pipe", "pipe"] });
	const rpc = { pi, events: [], stderr: "" };
	pi.stderr.on("data", (d) => (rpc.stderr += d));

	// Strict JSONL framing: split on LF only (docs/rpc.md).
	const waiters = [];
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
			rpc.events.push(record);
			for (const w of [...waiters]) {
				if (w.match(record)) {
					waiters.splice(waiters.indexOf(w), 1);
					w.resolve(record);
				}
			}
		}
	});

	rpc.waitFor = (match, what, ms = 60_000) =>
		new Promise((resolveWait, rejectWait) => {
			const timer = setTimeout(() => rejectWait(new Error(`timed out waiting for ${what}\n${rpc.stderr}`)), ms);
			waiters.push({ match, resolve: (r) => (clearTimeout(timer), resolveWait(r)) });
		});

	let counter = 0;
	rpc.send = (body) => {
		const id = `req-${++counter}`;
		const response = rpc.waitFor((r) => r.type === "response" && r.id === id, `${body.type} response`);
		pi.stdin.write(`${JSON.stringify({ id, ...body })}\n`);
		return response;
	};

	rpc.command = async (body, { settle = false } = {}) => {
		const settled = settle ? rpc.waitFor((r) => r.type === "agent_settled", `${body.type} to settle`) : undefined;
		const result = await rpc.send(body);
		if (!result.success) throw new Error(`${body.type} failed: ${JSON.stringify(result)}\n${rpc.stderr}`);
		if (settled) await settled;
		return result;
	};

	rpc.stop = async () => {
		pi.stdin.end();
		const exited = new Promise((r) => pi.once("exit", r));
		const timer = setTimeout(() => pi.kill("SIGTERM"), 5000);
		await exited;
		clearTimeout(timer);
	};
	return rpc;
}
