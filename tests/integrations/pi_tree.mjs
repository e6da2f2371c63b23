#!/usr/bin/env node
// A branch summary through pi's SDK with our extension loaded: opens a session file pi_rpc.mjs
// left (PI_E2E_ROOT: its agent directory with models.json, its project folder), and calls
// `session.navigateTree(TARGET, {summarize: true})`, which emits `session_before_tree` to the
// extension. The fake provider is started again for pi's model, which the extension replaces.
//
// Usage: node pi_tree.mjs SESSION_FILE TARGET_ID   (prints navigateTree's result as JSON)

import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { startFakeOpenAI } from "../conformance/fake_openai.mjs";
import { piFolders, writeFakeModels } from "../conformance/pi_cli.mjs";
import { piModule } from "../conformance/pi_package.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const extension = resolve(here, "..", "..", "integrations", "pi");
const [file, target] = process.argv.slice(2);
const { agentDir, cwd } = piFolders(process.env.PI_E2E_ROOT);

const server = await startFakeOpenAI();
writeFakeModels(agentDir, server.port);
process.env.PI_CODING_AGENT_DIR = agentDir;
process.env.PI_OFFLINE = "1";

const pi = await piModule("index.js");
let result;
try {
	const resourceLoader = new pi.DefaultResourceLoader({ cwd, agentDir, additionalExtensionPaths: [extension] });
	await resourceLoader.reload();
	const sessionManager = pi.SessionManager.open(file, undefined, cwd);
	const { session } = await pi.createAgentSession({ cwd, agentDir, resourceLoader, sessionManager });
	try {
		result = await session.navigateTree(target, { summarize: true, customInstructions: "Say what was tried" });
	} finally {
		session.dispose();
	}
} finally {
	await server.close();
}
process.stdout.write(`${JSON.stringify({ ...result, modelRequests: server.requests.length })}\n`);
