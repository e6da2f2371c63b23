#!/usr/bin/env node
// Runs pi's CLI (the pinned pi 1.6.0 of tests/conformance, node 22) in RPC mode with our extension
// (integrations/pi) loaded, against tests/conformance/fake_openai.mjs, offline in a temporary
// agent directory (pi_cli.mjs, as for make_cli_fixture.mjs). The steps come as JSON in argv[2]; the extension
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

import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { startFakeOpenAI } from "../conformance/fake_openai.mjs";
import { makePiFolders, offlineEnv, rpcArgs, startRpc, writeFakeModels } from "../conformance/pi_cli.mjs";

const here = dirname(fileURLToPath(import.meta.url));
// The package folder: pi reads its manifest ("pi": {"extensions": ["./index.ts"]}).
const extension = resolve(here, "..", "..", "integrations", "pi");
const steps = JSON.parse(process.argv[2] ?? "[]");
const settings = JSON.parse(process.argv[3] ?? '{"compaction": {"enabled": true, "keepRecentTokens": 150}}');

const root = process.env.PI_E2E_ROOT || mkdtempSync(join(tmpdir(), "pi-extension-e2e-"));
const { agentDir, sessionDir, home, cwd } = makePiFolders(root);

const server = await startFakeOpenAI();
writeFakeModels(agentDir, server.port, { contextWindow: Number(process.env.PI_E2E_CONTEXT_WINDOW || 200_000) });
writeFileSync(join(agentDir, "settings.json"), JSON.stringify(settings));

const env = offlineEnv({ home, agentDir });
for (const name of ["ORCHESTRATOR_SOCKET", "ORCHESTRATOR_ON_FAILURE"]) {
	if (process.env[name] !== undefined) env[name] = process.env[name];
}
const rpc = startRpc(rpcArgs(sessionDir, { extensions: [extension] }), { cwd, env });
const { events, send, waitFor } = rpc;

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
	await rpc.stop();
	await server.close();
}
const notifications = events.filter((e) => e.type === "extension_ui_request" && e.method === "notify");
const kept = events.filter((e) => /compaction|session_compact|extension_error/.test(e.type));
process.stdout.write(
	`${JSON.stringify({ sessionFile, root, responses, notifications, events: kept, modelRequests: server.requests.length, stderr: rpc.stderr })}\n`,
);
